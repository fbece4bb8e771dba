"""export_model: each exporter, the TorchScript fallback, dynamic batch, verification, passthrough, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from npukit.config import ExportConfig
from npukit.errors import InputError, NpukitError, NumericCheckError
from npukit.frontend.export import ExportResult, export_model
from npukit.frontend.spec import resolve_model, source_of
from npukit.frontend.verify import torch_reference_outputs
from npukit.runtime.ort import make_session, run

from .conftest import make_matmul_model

TIGHT = 1e-5


def _assert_matches_torch(path: Path, module: torch.nn.Module, shape: tuple[int, ...], seed: int = 7) -> None:
    """An independent check: ORT on the written file against torch on a fresh input."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    session = make_session(path)
    got = run(session, {session.get_inputs()[0].name: x})
    want = torch_reference_outputs(module, [x])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript", "auto"])
def test_export_tiny_cnn(factories: str, tmp_path: Path, exporter: str) -> None:
    source = resolve_model(f"{factories}:tiny_cnn")
    out = tmp_path / "tiny.onnx"
    result = export_model(source, out, config=ExportConfig(exporter=exporter))
    assert isinstance(result, ExportResult)
    assert result.exporter == ("dynamo" if exporter == "auto" else exporter)
    assert result.fallback_reason is None and result.passed
    assert result.max_rel_error is not None and result.max_rel_error < TIGHT
    assert result.max_abs_error is not None and result.max_abs_error < TIGHT
    assert result.input_shape == (1, 3, 16, 16) and result.input_names == ("input",)
    assert result.output_names == ("output",) and result.opset == 18
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    assert {"Conv", "Relu"} <= {n.op_type for n in model.graph.node}
    assert result.node_count == len(model.graph.node)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.onnx"]  # no staging leftovers
    assert result.as_dict()["input_shape"] == [1, 3, 16, 16]
    assert source.module is not None
    _assert_matches_torch(out, source.module, (1, 3, 16, 16))


def test_fallback_to_torchscript(factories: str, tmp_path: Path) -> None:
    source = resolve_model(f"{factories}:scripted_sign_branch")
    out = tmp_path / "branch.onnx"
    result = export_model(source, out, config=ExportConfig(input_shape=(2, 4), verify_samples=4))
    assert result.exporter == "torchscript"
    assert result.fallback_reason is not None and "torch.export" in result.fallback_reason
    assert "\n" not in result.fallback_reason
    assert result.passed and result.max_rel_error is not None and result.max_rel_error < TIGHT
    assert "If" in {n.op_type for n in onnx.load(out).graph.node}  # both branches kept
    assert source.module is not None
    x = 100.0 * np.random.default_rng(3).standard_normal((2, 4)).astype(np.float32)
    with torch.no_grad():
        sums = [float(source.module.fc(torch.from_numpy(v)).sum()) for v in (x, -x)]
    assert sums[0] * sums[1] < 0  # x and -x take different branches
    session = make_session(out)
    for v in (x, -x):
        with torch.no_grad():
            want = source.module(torch.from_numpy(v)).numpy()
        np.testing.assert_allclose(run(session, {"input": v})[0], want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_dynamic_batch(factories: str, tmp_path: Path, exporter: str) -> None:
    source = resolve_model(f"{factories}:tiny_cnn")
    out = tmp_path / "dyn.onnx"
    result = export_model(source, out, config=ExportConfig(exporter=exporter, dynamic_batch=True))
    assert result.passed and result.input_shape == (1, 3, 16, 16)
    model = onnx.load(out)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert model.graph.output[0].type.tensor_type.shape.dim[0].dim_param
    assert source.module is not None
    _assert_matches_torch(out, source.module, (3, 3, 16, 16))


def test_nested_outputs_flattened(factories: str, tmp_path: Path) -> None:
    source = resolve_model(f"{factories}:TwoHeads")
    result = export_model(source, tmp_path / "heads.onnx", config=ExportConfig(input_shape=(2, 6)))
    assert result.output_names == ("output_0", "output_1", "output_2")
    assert result.passed and result.max_rel_error is not None and result.max_rel_error < TIGHT


def test_failed_verification_writes_then_raises(factories: str, tmp_path: Path) -> None:
    # Tracing keeps only the branch the example input took; seeded inputs that take the other branch disagree.
    source = resolve_model(f"{factories}:SignBranch")
    out = tmp_path / "traced.onnx"
    config = ExportConfig(exporter="torchscript", input_shape=(1, 4), verify_samples=8)
    with pytest.raises(NumericCheckError, match="does not match torch: max rel error") as info:
        export_model(source, out, config=config)
    result = info.value.result
    assert out.is_file() and result.path == out and not result.passed
    assert result.max_rel_error is not None and result.max_rel_error > config.rtol
    assert "--exporter dynamo" in info.value.hint


def test_pt2_export(factories: str, tmp_path: Path) -> None:
    from tiny_models import tiny_cnn

    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(tiny_cnn().eval(), (torch.randn(2, 3, 8, 8),)), path)
    result = export_model(resolve_model(str(path)), tmp_path / "pt2.onnx", config=ExportConfig())
    assert result.input_shape == (2, 3, 8, 8) and result.exporter == "dynamo"
    assert result.passed and result.max_rel_error is not None and result.max_rel_error < TIGHT
    # a fixed batch refuses --dynamic-batch up front (both exporters failed on its guard, and the hint said to
    # simplify the forward); a program exported with a dynamic batch takes it
    with pytest.raises(InputError, match="exported with a fixed batch of 2") as info:
        export_model(resolve_model(str(path)), tmp_path / "dyn.onnx", config=ExportConfig(dynamic_batch=True))
    assert "dynamic_shapes" in info.value.hint and not (tmp_path / "dyn.onnx").exists()
    batch = torch.export.Dim("batch", min=1, max=64)
    torch.export.save(torch.export.export(tiny_cnn().eval(), (torch.randn(2, 3, 8, 8),),
                                          dynamic_shapes=({0: batch},)), path)
    dynamic = export_model(resolve_model(str(path)), tmp_path / "dyn.onnx", config=ExportConfig(dynamic_batch=True))
    assert dynamic.passed


def test_onnx_passthrough(matmul_onnx: Path, tmp_path: Path) -> None:
    source = resolve_model(str(matmul_onnx))
    plain = export_model(source, tmp_path / "copy.onnx", config=ExportConfig())
    assert plain.exporter == "passthrough" and plain.passed and plain.max_rel_error is None
    assert plain.input_shape == (1, 4) and plain.node_count == 3 and plain.opset == 18

    fixed = export_model(source, tmp_path / "fixed.onnx", config=ExportConfig(input_shape=(6, 4)))
    assert fixed.max_rel_error == 0.0 and fixed.passed and fixed.input_shape == (6, 4)
    dims = onnx.load(tmp_path / "fixed.onnx").graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [6, 4]
    # --opset converts the file up (it was ignored: the file stayed at its own opset), never down
    later = export_model(source, tmp_path / "21.onnx", config=ExportConfig(input_shape=(6, 4), opset=21))
    assert later.opset == 21 and later.passed
    with pytest.raises(InputError, match="would convert it down"):
        export_model(source, tmp_path / "17.onnx", config=ExportConfig(opset=17))


def test_onnx_passthrough_with_a_dynamic_batch_runs_two_samples_at_once(tmp_path: Path) -> None:
    """A graph that keeps a batch of 1 inside (YOLOX's and PicoDet's exports: a Reshape to [1, -1, C]) ran at batch
    2 folding the second sample into another axis, and export said PASS; a size of -1 (Paddle's dynamic size) took
    no comparison at all."""
    from onnx import TensorProto, helper

    def model(first: int, shape: list[int]) -> Path:
        nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])]
        graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [first, 4, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c"])],
                                  [helper.make_tensor("s", TensorProto.INT64, [len(shape)], shape)])
        path = tmp_path / f"m{first}_{len(shape)}.onnx"
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
        return path

    baked = resolve_model(str(model(1, [1, -1, 3])))  # batch 1 baked in
    with pytest.raises(InputError, match="shape \\[1, 8, 3\\], not one row per sample \\(\\[2, 4, 3\\]\\)"):
        export_model(baked, tmp_path / "b.onnx", config=ExportConfig(input_shape=(1, 4, 3), dynamic_batch=True))
    assert not (tmp_path / "b.onnx").exists()
    symbolic = onnx.load(model(1, [1, -1, 3]))
    symbolic.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "h"  # a size besides the batch open
    onnx.save(symbolic, tmp_path / "open.onnx")
    with pytest.raises(InputError, match="symbolic sizes besides the batch needs --input-shape"):
        export_model(resolve_model(str(tmp_path / "open.onnx")), tmp_path / "o.onnx",
                     config=ExportConfig(dynamic_batch=True))  # was PASS, nothing compared
    follows = resolve_model(str(model(-1, [-1, 4, 3])))  # the batch follows the input; declared as Paddle does
    result = export_model(follows, tmp_path / "f.onnx", config=ExportConfig(input_shape=(1, 4, 3), dynamic_batch=True))
    assert result.passed and result.max_abs_error == 0.0
    two = onnx.load(model(-1, [-1, 4, 3]))  # a second input whose batch sits on axis 1 (Silero VAD's state)
    two.graph.input.append(helper.make_tensor_value_info("state", TensorProto.FLOAT, [2, "batch", 8]))
    onnx.save(two, tmp_path / "two.onnx")
    with pytest.raises(InputError, match=r"this model has 2 inputs \(x, state\)") as caught:  # was "input 'state'
        # has a symbolic dimension 'batch' at axis 1. pass the full shape", and export takes the first input's only
        export_model(resolve_model(str(tmp_path / "two.onnx")), tmp_path / "t.onnx",
                     config=ExportConfig(input_shape=(1, 4, 3), dynamic_batch=True))
    assert "without --dynamic-batch" in caught.value.one_line() and not (tmp_path / "t.onnx").exists()


def test_bad_inputs_leave_no_file(factories: str, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    source = resolve_model(f"{factories}:tiny_cnn")
    with pytest.raises(InputError, match=r"input shape \(1,3,7\) does not fit the model: ") as info:
        export_model(source, out, config=ExportConfig(input_shape=(1, 3, 7)))
    # three numbers for a conv model: torch's message is about 1 channel of input[1, 1, 3, 7]; the hint says the
    # shape its first convolution reads
    assert info.value.hint == ("pass --input-shape 1,3,H,W with its sizes: the model's first convolution (Conv2d "
                               "'conv') reads N,3,H,W")
    with pytest.raises(InputError, match="does not fit the model") as info:
        export_model(source, out, config=ExportConfig(input_shape=(1, 4, 16, 16)))  # 4 channels for 3
    assert "first convolution (Conv2d 'conv') reads N,3,H,W" in info.value.hint

    class Raises(torch.nn.Module):  # an error of the model's own, not of the shape: said as such
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("boom")

    with pytest.raises(InputError, match=r"the model's forward raised ValueError on an input of shape \(1,3,8,8\): "
                                         r"boom"):
        export_model(source_of(Raises()), out, config=ExportConfig(input_shape=(1, 3, 8, 8)))
    with pytest.raises(InputError, match="no input shape is known"):
        export_model(resolve_model(f"{factories}:SignBranch"), out, config=ExportConfig())

    onnx_path = tmp_path / "m.onnx"
    onnx.save(make_matmul_model(), onnx_path)
    onnx_source = resolve_model(str(onnx_path))
    with pytest.raises(InputError, match="has rank 3"):
        export_model(onnx_source, out, config=ExportConfig(input_shape=(1, 4, 4)))
    onnx_path.write_bytes(onnx_path.read_bytes()[:40])  # truncated after resolving
    with pytest.raises(InputError, match="truncated or corrupt"):
        export_model(onnx_source, out, config=ExportConfig())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_dynamo_only_failure_is_an_error(factories: str, tmp_path: Path) -> None:
    out = tmp_path / "out.onnx"
    source = resolve_model(f"{factories}:scripted_sign_branch")
    with pytest.raises(NpukitError, match="the dynamo exporter failed: Failed to export the model with torch.export"):
        export_model(source, out, config=ExportConfig(exporter="dynamo", input_shape=(2, 4)))
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_torchvision_mobilenet_v3_small(tmp_path: Path) -> None:
    source = resolve_model("torchvision:mobilenet_v3_small")
    result = export_model(source, tmp_path / "mnv3.onnx", config=ExportConfig())
    assert result.exporter == "dynamo" and result.passed
    assert result.max_rel_error is not None and result.max_rel_error <= 1e-4
    assert result.input_shape == (1, 3, 224, 224) and result.output_names == ("output",)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_torch_model_that_mixes_its_batch_fails_dynamic_batch(factories: str, tmp_path: Path, exporter: str) -> None:
    # the export was checked at batch 1 only: a model whose samples depend on each other passed --dynamic-batch
    out = tmp_path / "mix.onnx"
    with pytest.raises(InputError, match="--dynamic-batch: ") as caught:
        export_model(resolve_model(f"{factories}:BatchMixer"), out,
                     config=ExportConfig(exporter=exporter, dynamic_batch=True))
    assert "x.flatten(1)" in caught.value.hint and not out.exists() and list(tmp_path.iterdir()) == []
    assert export_model(resolve_model(f"{factories}:BatchMixer"), out, config=ExportConfig(exporter=exporter)).passed
