"""resolve_model for every spec form, weights loading, and the errors for bad specs."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from npukit.errors import InputError
from npukit.frontend.spec import resolve_model


def test_factory_spec(factories: str) -> None:
    source = resolve_model(f"{factories}:tiny_cnn")
    assert source.kind == "torch" and source.onnx_path is None
    assert source.default_input_shape == (1, 3, 16, 16)
    assert source.module is not None and not source.module.training
    assert "TinyCNN" in source.description
    # the factory returned it in training mode (a BatchNorm in it): used in eval mode, and said so
    assert any("returned the model in training mode" in note for note in source.notes)


def test_factory_raising(factories: str) -> None:
    with pytest.raises(InputError, match="raised RuntimeError: checkpoint layout v3 is not supported") as info:
        resolve_model(f"{factories}:broken_factory")
    assert "second line" not in info.value.one_line()


def test_factory_not_a_module_and_missing(factories: str) -> None:
    with pytest.raises(InputError, match="returned dict, not a torch.nn.Module"):
        resolve_model(f"{factories}:not_a_module")
    with pytest.raises(InputError, match="has no callable 'tiny_cnm'") as info:
        resolve_model(f"{factories}:tiny_cnm")
    assert "tiny_cnn" in info.value.hint
    with pytest.raises(InputError, match="cannot import 'no_such_package_xyz.models': No module named"):
        resolve_model("no_such_package_xyz.models:build")


def _perturbed_state(factories_module: str) -> dict[str, torch.Tensor]:
    model = resolve_model(f"{factories_module}:tiny_cnn").module
    assert model is not None
    return {k: v + 0.5 if v.is_floating_point() else v for k, v in model.state_dict().items()}


@pytest.mark.parametrize("wrap", [None, "state_dict", "model"])
def test_weights_round_trip(factories: str, tmp_path: Path, wrap: str | None) -> None:
    state = _perturbed_state(factories)
    path = tmp_path / "w.pt"
    torch.save(state if wrap is None else {wrap: state, "epoch": 3}, path)
    module = resolve_model(f"{factories}:tiny_cnn", weights=str(path)).module
    assert module is not None
    for key, value in module.state_dict().items():
        torch.testing.assert_close(value, state[key], rtol=0, atol=0)


def test_weights_mismatch(factories: str, tmp_path: Path) -> None:
    state = _perturbed_state(factories)
    del state["conv.weight"], state["fc.bias"]
    state["head.weight"] = torch.zeros(2)
    path = tmp_path / "w.pt"
    torch.save(state, path)
    with pytest.raises(InputError, match=r"2 missing \(e.g. conv.weight, fc.bias\); 1 unexpected \(e.g. head.weight\)"):
        resolve_model(f"{factories}:tiny_cnn", weights=str(path))
    state = _perturbed_state(factories)
    state["fc.weight"] = torch.zeros(7, 8)
    torch.save(state, path)
    with pytest.raises(InputError, match="size mismatch for fc.weight") as info:
        resolve_model(f"{factories}:tiny_cnn", weights=str(path))
    assert "saved from this architecture" in info.value.hint  # its bias still says the model's class count
    state["fc.bias"] = torch.zeros(7)  # a head trained for 7 classes
    torch.save(state, path)
    with pytest.raises(InputError, match="size mismatch for fc.weight") as info:
        resolve_model(f"{factories}:tiny_cnn", weights=str(path))
    assert "fc has 7 outputs" in info.value.hint and "num_classes=7" in info.value.hint
    path.write_text("not a checkpoint")
    with pytest.raises(InputError, match="cannot read weights"):
        resolve_model(f"{factories}:tiny_cnn", weights=str(path))
    with pytest.raises(InputError, match="does not exist"):
        resolve_model(f"{factories}:tiny_cnn", weights=str(tmp_path / "missing.pt"))


def test_pt2_round_trip(factories: str, tmp_path: Path) -> None:
    from tiny_models import tiny_cnn

    module = tiny_cnn().eval()
    x = torch.randn(2, 3, 12, 12)
    path = tmp_path / "tiny.pt2"
    torch.export.save(torch.export.export(module, (x,)), path)
    source = resolve_model(str(path))
    assert source.kind == "torch" and source.default_input_shape == (2, 3, 12, 12)
    assert source.module is not None
    with torch.no_grad():
        torch.testing.assert_close(source.module(x), module(x), rtol=0, atol=0)


def test_onnx_spec(matmul_onnx: Path) -> None:
    source = resolve_model(str(matmul_onnx))
    assert source.kind == "onnx" and source.module is None and source.onnx_path == matmul_onnx
    assert source.default_input_shape == (1, 4)
    with pytest.raises(InputError, match="--weights does not apply"):
        resolve_model(str(matmul_onnx), weights="w.pt")


def test_torchvision_classification_and_shapes() -> None:
    source = resolve_model("torchvision:inception_v3")
    assert source.default_input_shape == (1, 3, 299, 299)  # from its weights' transforms
    assert "random weights" in source.description
    first, again = (resolve_model("torchvision:squeezenet1_1").module for _ in range(2))
    assert first is not None and again is not None
    torch.testing.assert_close(first.state_dict(), again.state_dict(), rtol=0, atol=0)  # seeded random weights


def test_torchvision_segmentation_and_video_shapes() -> None:
    assert resolve_model("torchvision:lraspp_mobilenet_v3_large").default_input_shape == (1, 3, 520, 520)
    assert resolve_model("torchvision:r3d_18").default_input_shape == (1, 3, 16, 112, 112)


def test_torchvision_unknown_and_unsupported() -> None:
    with pytest.raises(InputError, match="torchvision has no model named 'mobilenetv2'") as info:
        resolve_model("torchvision:mobilenetv2")
    assert "mobilenet_v2" in info.value.hint
    assert info.value.one_line().endswith("?")  # a question ends as one, not "?."
    with pytest.raises(InputError, match="detection model"):
        resolve_model("torchvision:fasterrcnn_mobilenet_v3_large_fpn")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("missing.onnx", "does not exist"), ("missing.pt2", "does not exist"),
     ("weights.pth", "does not exist"), ("what is this", "cannot tell what model")],
)
def test_bad_specs(tmp_path: Path, spec: str, expected: str) -> None:
    with pytest.raises(InputError, match=expected):
        resolve_model(str(tmp_path / spec) if "." in spec else spec)


def test_pt2_not_a_program(tmp_path: Path) -> None:
    path = tmp_path / "bad.pt2"
    path.write_bytes(b"garbage")
    with pytest.raises(InputError, match="bad.pt2 is a text file, not a model"):
        resolve_model(str(path))
    with zipfile.ZipFile(path, "w") as archive:  # a .pt2 layout whose program is missing
        archive.writestr("bad/archive_format", "pt2")
        archive.writestr("bad/models/model.json", "{}")
    with pytest.raises(InputError, match="is not a loadable torch.export program"):
        resolve_model(str(path))
