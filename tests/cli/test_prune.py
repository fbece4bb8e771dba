"""npukit prune end to end on a small CNN: structured pruning writes a smaller float model with the float, pruned and
fine-tuned models side by side in the report; magnitude sparsity stays through fine-tuning and through qat to 4-bit
weights; a degraded result exits 1; bad input exits 2 and writes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from npukit.cli import main
from tests.pruning.test_channels import PruneNet


@pytest.fixture(scope="module")
def net(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("prune_cli")
    torch.manual_seed(0)
    path = folder / "net.onnx"
    torch.onnx.export(PruneNet().eval(), torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False,
                      opset_version=17)
    rng = np.random.default_rng(5)
    np.save(folder / "data.npy", rng.standard_normal((50, 3, 32, 32)).astype(np.float32))
    return path


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())



def test_channels_pruned_to_a_mac_target_and_fine_tuned(net, tmp_path) -> None:
    out = tmp_path / "small.onnx"
    args = ["prune", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--macs", "0.75",
            "--epochs", "2", "--runs", "3", "--min-sqnr", "0", "--min-task-metric", "0"]
    assert main(args) == 0
    assert _files(tmp_path) == ["small.onnx", "small.report.json"]  # no checkpoint left
    report = json.loads((tmp_path / "small.report.json").read_text())
    assert report["passed"] and report["verdict"].startswith("PASS prune")
    results = report["results"]
    figures = results["figures"]
    assert figures["fine-tuned"]["macs"] <= 0.75 * figures["float"]["macs"]
    assert figures["fine-tuned"]["params"] < figures["float"]["params"]
    assert figures["float"]["bytes"] == net.stat().st_size  # the user's file, not the model BatchNorm-folded
    assert results["channels"]["macs_after"] == figures["fine-tuned"]["macs"]
    assert len(results["channels"]["groups"]) == 3 and len(results["channels"]["left_whole"]) == 3  # + the classifier
    assert set(results["comparison"]) == {"pruned", "fine-tuned"}
    assert [e["epoch"] for e in results["training"]["history"]] == [1, 2]


def test_sparsity_survives_fine_tuning_and_qat_to_four_bits(net, tmp_path) -> None:
    sparse = tmp_path / "sparse.onnx"
    data = str(net.with_name("data.npy"))
    assert main(["prune", str(net), "-o", str(sparse), "--data", data, "--sparsity", "0.8", "--epochs", "1",
                 "--runs", "3", "--lr", "1e-3", "--accept-degraded"]) == 0
    report = json.loads((tmp_path / "sparse.report.json").read_text())
    rows = report["results"]["sparsity"]["tensors"]
    assert sum(r["zeros"] for r in rows) >= 0.8 * sum(r["weights"] for r in rows)
    assert len({r["zeros"] / r["weights"] for r in rows}) > 1  # large tensors lose more than small ones
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(sparse)).graph.initializer}
    for row in rows:  # trained, and zero where the last masks said
        assert np.sum(inits[row["weight"]] == 0) >= row["zeros"], row["weight"]
    w4 = tmp_path / "w4.onnx"
    assert main(["qat", str(sparse), "-o", str(w4), "--data", data, "--bits", "w4a8", "--epochs", "1", "--runs", "3",
                 "--method", "minmax", "--lr", "1e-3", "--accept-degraded"]) == 0
    qat = json.loads((tmp_path / "w4.report.json").read_text())["results"]
    assert qat["sparsity_kept"]["tensors"] >= 4
    model = onnx.load(str(w4))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    int4 = [v for i, v in ((i, inits[i.name]) for i in model.graph.initializer) if i.data_type == onnx.TensorProto.INT4]
    assert int4 and sum(int((v == 0).sum()) for v in int4) >= 0.75 * sum(v.size for v in int4)
    assert qat["deflated_size"]["QAT"] < qat["deflated_size"]["float"]  # (graph bytes weigh much in a model this small)
    assert qat["size"]["float"] == sparse.stat().st_size  # the float model given: its file


def test_a_result_below_the_floor_exits_1_with_its_report(net, tmp_path) -> None:
    out = tmp_path / "tiny.onnx"
    args = ["prune", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), "--macs", "0.5",
            "--epochs", "1", "--runs", "3", "--min-task-metric", "1"]
    assert main(args) == 1
    report = json.loads((tmp_path / "tiny.report.json").read_text())
    assert not report["passed"] and report["verdict"].startswith("FAIL prune")
    assert "--lr" not in report["verdict"]  # channels only: fine-tuning, not training again
    sparse = ["prune", str(net), "-o", str(tmp_path / "sparse.onnx"), "--data", str(net.with_name("data.npy")),
              "--sparsity", "0.9", "--epochs", "1", "--max-steps", "2", "--runs", "3", "--min-task-metric", "1"]
    assert main(sparse) == 1
    verdict = json.loads((tmp_path / "sparse.report.json").read_text())["verdict"]
    assert "a higher --lr for a high --sparsity" in verdict, verdict


@pytest.mark.parametrize("extra, message", [
    ([], "nothing to prune"),
    (["--macs", "1.5"], "MAC fraction 1.5"),
    (["--sparsity", "0"], "sparsity 0"),
    (["--macs", "0.05"], "can take the conv and Gemm MACs down to"),
])
def test_bad_input_exits_2_and_writes_nothing(net, tmp_path, capsys, extra, message) -> None:
    out = tmp_path / "out.onnx"
    assert main(["prune", str(net), "-o", str(out), "--data", str(net.with_name("data.npy")), *extra]) == 2
    assert message in capsys.readouterr().err
    assert _files(tmp_path) == []


def test_two_processes_under_torchrun_write_what_one_process_does(net, tmp_path, tmp_path_factory) -> None:
    """Pruning and fine-tuning under torchrun (DDP, gloo): rank 0 alone writes, the same weights and zeros as one
    process (no random shifts, so the batches are the same)."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["prune", str(net), "--data", str(net.with_name("data.npy")), "--macs", "0.75", "--sparsity", "0.5",
              "--epochs", "2", "--runs", "3", "--no-augment", "--accept-degraded"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env["TMPDIR"] = str(tmp_path_factory.mktemp("torchrun"))  # its torchelastic_* log folder, not left in /tmp
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                    str(port), "-m", "npukit.cli", *common, "-o", str(tmp_path / "two.onnx")], check=True, env=env,
                   timeout=300, capture_output=True)
    assert main([*common, "-o", str(tmp_path / "one.onnx")]) == 0
    assert _files(tmp_path) == ["one.onnx", "one.report.json", "two.onnx", "two.report.json"]
    one = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "one.onnx")).graph.initializer}
    two = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(tmp_path / "two.onnx")).graph.initializer}
    assert one.keys() == two.keys()
    for name, value in one.items():
        np.testing.assert_allclose(two[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
        assert np.array_equal(two[name] == 0, value == 0), name
