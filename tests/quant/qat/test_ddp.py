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


def _one_and_two(tmp_path, tmp_path_factory, *args: str) -> tuple[dict, dict]:
    """The worker's result trained by one process and by two under torchrun."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["TMPDIR"] = str(tmp_path_factory.mktemp("torchrun"))  # its torchelastic_* log folder, not left in /tmp
    subprocess.run([sys.executable, str(WORKER), str(tmp_path / "one.pt"), *args], check=True, env=env, timeout=300)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(_free_port()), str(WORKER), str(tmp_path / "two.pt"), *args], check=True, env=env,
                   timeout=300)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["world"] == 1 and two["world"] == 2
    return one, two


def test_two_processes_reach_the_one_process_result(tmp_path, tmp_path_factory):
    one, two = _one_and_two(tmp_path, tmp_path_factory)
    for name, a in one["state"].items():
        torch.testing.assert_close(two["state"][name], a, rtol=1e-4, atol=1e-5, msg=name)


def test_two_processes_train_on_the_augmented_samples_of_one(tmp_path, tmp_path_factory):
    """Shifts and blends are drawn for the whole batch on every process, each keeping its share: each process drawing
    for its own share alone from the same seeded generator trained on other samples than one process (RNet pruned
    by one process and by two: 20.6 dB apart, 133 dB without augmentation)."""
    one, two = _one_and_two(tmp_path, tmp_path_factory, "augment")
    for name, a in one["state"].items():
        torch.testing.assert_close(two["state"][name], a, rtol=1e-4, atol=1e-5, msg=name)
