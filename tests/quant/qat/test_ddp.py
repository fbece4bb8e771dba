"""QAT under torchrun: two processes (DistributedDataParallel, gloo) reach the one-process result."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_reach_the_one_process_result(tmp_path, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["TMPDIR"] = str(tmp_path_factory.mktemp("torchrun"))  # its torchelastic_* log folder, not left in /tmp
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "one.pt")], check=True, env=env, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(_free_port()), str(WORKER), str(tmp_path / "two.pt")], check=True, env=env, timeout=300)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["world"] == 1 and two["world"] == 2
    for name, a in one["state"].items():
        torch.testing.assert_close(two["state"][name], a, rtol=1e-4, atol=1e-5, msg=name)
