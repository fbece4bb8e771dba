"""Every kind of MODEL input (factory with arguments from the current folder, TorchScript, pickled module, state dicts
with their metadata, wrapped checkpoints), the one-line diagnosis of every wrong kind, and Ctrl-C during export."""

from __future__ import annotations

import importlib.util
import json
import struct
import sys
from collections import OrderedDict
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest
import torch

from npukit.cli import main
from npukit.errors import InputError
from npukit.frontend import export as export_module
from npukit.frontend.checkpoint import sniff, strip_prefix
from npukit.frontend.spec import PICKLE_NOTE, parse_factory_spec, resolve_model
from npukit.frontend.verify import torch_reference_outputs
from npukit.runtime.ort import make_session, run

USER_MODULE = "npukit_user_models"
USER_SOURCE = '''
import torch


class Net(torch.nn.Module):
    example_input_shape = (1, 3, 16, 16)

    def __init__(self, num_classes=3, width=1.0):
        super().__init__()
        channels = max(1, int(8 * width))
        self.conv = torch.nn.Conv2d(3, channels, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.fc = torch.nn.Linear(channels, num_classes)
        with torch.no_grad():  # running statistics that make BatchNorm more than an identity
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).mean(dim=(2, 3)))


def build(num_classes=3, width=1.0):
    torch.manual_seed(0)
    return Net(num_classes, width)
'''


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tmp_path as the current folder, holding the user's model module (not on sys.path, not imported yet)."""
    (tmp_path / f"{USER_MODULE}.py").write_text(USER_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ among the files the tests count
    sys.modules.pop(USER_MODULE, None)
    yield tmp_path
    sys.modules.pop(USER_MODULE, None)


def _user_module(folder: Path) -> ModuleType:
    """Import the user's module by file path, as their own script would; later loads must find it on their own."""
    spec = importlib.util.spec_from_file_location(USER_MODULE, folder / f"{USER_MODULE}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[USER_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _assert_onnx_matches(path: Path, module: torch.nn.Module, shape: tuple[int, ...], *, seed: int = 11) -> None:
    """An independent check of a written file: ORT against ``module`` on a fresh seeded input."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    session = make_session(path)
    got = run(session, {session.get_inputs()[0].name: x})
    want = torch_reference_outputs(module.eval(), [x])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _report(onnx_path: Path) -> dict:
    return json.loads(onnx_path.with_name(onnx_path.stem + ".report.json").read_text())


# ------------------------------------------------------------------------------------------- module:factory(...)


def test_factory_with_arguments_found_in_the_current_folder(user_dir: Path) -> None:
    path_before = list(sys.path)
    assert str(user_dir) not in sys.path
    out = user_dir / "net.onnx"
    assert main(["export", f"{USER_MODULE}:build(num_classes=5, width=0.5)", "-o", str(out)]) == 0
    assert sys.path == path_before  # the folder was on sys.path for the import only
    report = _report(out)
    assert report["results"]["export"]["passed"] and report["results"]["export"]["input_shape"] == [1, 3, 16, 16]
    assert "build(num_classes=5, width=0.5)" in report["results"]["model"]["description"]
    reference = sys.modules[USER_MODULE].build(num_classes=5, width=0.5)
    assert reference.fc.out_features == 5 and reference.conv.out_channels == 4
    assert [d.dim_value for d in onnx.load(out).graph.output[0].type.tensor_type.shape.dim] == [1, 5]
    _assert_onnx_matches(out, reference, (1, 3, 16, 16))


def test_factory_spec_parsing_is_literal_only(tmp_path: Path) -> None:
    assert parse_factory_spec("pkg.mod:build") == ("pkg.mod", "build", (), {})
    assert parse_factory_spec("m:f(3, 'a', width=0.5, dims=(1, 2), cfg={'k': [1, None]}, flag=True)") == (
        "m", "f", (3, "a"), {"width": 0.5, "dims": (1, 2), "cfg": {"k": [1, None]}, "flag": True})
    marker = tmp_path / "ran"
    bad = {
        "m:f(num_classes=5": "was never closed",
        f"m:f(x=open({str(marker)!r}, 'w'))": "is not a literal value",
        "m:f(x=__import__('os').system('true'))": "is not a literal value",
        "m:f(x=y)": "is not a literal value",
        "m:f(*[1])": "cannot use \\* or \\*\\*",
        "m:f(**{'a': 1})": "cannot use \\* or \\*\\*",
        "m:f(a=1).x": "expected one \\(...\\)",
        "m:f(a=1)(2)": "expected one \\(...\\)",
        "m:f[1]": "expected one \\(...\\)",
    }
    for spec, expected in bad.items():
        with pytest.raises(InputError, match=expected) as info:
            parse_factory_spec(spec)
        assert "package.module:factory(num_classes=5, width=0.5)" in info.value.hint
        assert "\n" not in info.value.one_line()
    assert not marker.exists()  # nothing in a spec is run


def test_factory_errors_say_what_to_do(user_dir: Path) -> None:
    with pytest.raises(InputError, match=r"build\(num_classes=5, depth=3\) raised TypeError") as info:
        resolve_model(f"{USER_MODULE}:build(num_classes=5, depth=3)")
    assert "build(num_classes=3, width=1.0)" in info.value.hint  # the factory's real signature
    with pytest.raises(InputError, match="cannot import 'no_such_user_module_xyz'") as info:
        resolve_model("no_such_user_module_xyz:build(width=1)")
    assert "folder" in info.value.hint and "PYTHONPATH" in info.value.hint


# ------------------------------------------------------------------------------------------------- TorchScript


@pytest.mark.parametrize(("how", "name"), [("script", "scripted.pt"), ("trace", "traced.ts"), ("trace", "model")])
def test_torchscript_file(user_dir: Path, how: str, name: str) -> None:
    eager = _user_module(user_dir).build(num_classes=4).eval()
    x = torch.randn(2, 3, 12, 12)
    scripted = torch.jit.script(eager) if how == "script" else torch.jit.trace(eager, x)
    path = user_dir / name
    torch.jit.save(scripted, str(path))
    assert sniff(path).kind == "torchscript"

    out = user_dir / "ts.onnx"
    shape_args = ["--input-shape", "2,3,12,12"] if how == "script" else []  # a traced file knows its shape
    assert main(["export", str(path), "-o", str(out), *shape_args]) == 0
    result = _report(out)["results"]["export"]
    assert result["exporter"] == "torchscript" and result["passed"]
    assert "ScriptModule" in result["fallback_reason"]  # the dynamo exporter was tried, and why it failed is kept
    assert result["input_shape"] == [2, 3, 12, 12] and result["max_rel_error"] < 1e-5
    loaded = resolve_model(str(path)).module
    assert isinstance(loaded, torch.jit.ScriptModule)
    _assert_onnx_matches(out, loaded, (2, 3, 12, 12))
    _assert_onnx_matches(out, eager, (2, 3, 12, 12), seed=12)


def test_scripted_file_without_shape_asks_for_one(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = user_dir / "scripted.pt"
    torch.jit.save(torch.jit.script(_user_module(user_dir).build().eval()), str(path))
    before = _files(user_dir)
    assert main(["export", str(path), "-o", str(user_dir / "out.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no input shape is known" in err and "--input-shape" in err and "\n" not in err
    assert _files(user_dir) == before


class _WithRate(torch.nn.Module):
    def forward(self, x: torch.Tensor, rate: int) -> torch.Tensor:  # Silero VAD's forward(x, sr: int) shape
        return x * float(rate)


def test_a_forward_with_a_non_tensor_argument_is_named_in_one_line(user_dir: Path, capsys) -> None:
    path = user_dir / "rate.pt"
    torch.jit.save(torch.jit.script(_WithRate()), str(path))
    before = _files(user_dir)
    assert main(["export", str(path), "-o", str(user_dir / "out.onnx"), "--input-shape", "x=1,16"]) == 2
    err = capsys.readouterr().err.strip()
    assert "besides its input tensor (rate: int)" in err and "wrapper module" in err and "\n" not in err
    assert _files(user_dir) == before


# ------------------------------------------------------------------------------------------- pickled nn.Module


def test_pickled_module(user_dir: Path) -> None:
    eager = _user_module(user_dir).build(num_classes=6).eval()
    path = user_dir / "whole_model.pth"
    torch.save(eager, path)
    sys.modules.pop(USER_MODULE)  # the load has to import the class's module from the current folder
    out = user_dir / "pickled.onnx"
    assert main(["export", str(path), "-o", str(out)]) == 0  # shape from the class's example_input_shape
    report = _report(out)
    assert PICKLE_NOTE in report["results"]["model"]["notes"]
    assert any(t["title"] == "Model loading" and [PICKLE_NOTE] in t["rows"] for t in report["tables"])
    assert report["results"]["export"]["passed"]
    _assert_onnx_matches(out, eager, (1, 3, 16, 16))


def test_pickled_module_under_model_key(user_dir: Path) -> None:
    eager = _user_module(user_dir).build().eval()
    path = user_dir / "train_ckpt.pt"
    torch.save({"model": eager, "epoch": 7}, path)
    sys.modules.pop(USER_MODULE)
    source = resolve_model(str(path))
    assert source.notes[0] == PICKLE_NOTE and "'model' key (left out: epoch)" in source.notes[1]
    assert isinstance(source.module, torch.nn.Module) and not source.module.training


def test_pickled_module_whose_class_is_gone(user_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = user_dir / "whole_model.pth"
    torch.save(_user_module(user_dir).build(), path)
    sys.modules.pop(USER_MODULE)
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)  # run from a folder where the class's module cannot be imported
    assert main(["export", str(path), "-o", str(elsewhere / "out.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"holds a pickled {USER_MODULE}.Net that cannot be loaded here" in err and "\n" not in err
    assert "state_dict" in err and not list(elsewhere.iterdir())


# -------------------------------------------------------------------------------------- state dicts, checkpoints


def _mnasnet_with_statistics() -> torch.nn.Module:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mnasnet0_5()
    with torch.no_grad():  # random running statistics: the outputs then depend on every layer
        for layer in model.modules():
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.running_mean.uniform_(-0.1, 0.1)
                layer.running_var.uniform_(0.5, 2.0)
    return model.eval()


def test_state_dict_keeps_its_metadata_mnasnet(tmp_path: Path) -> None:
    model = _mnasnet_with_statistics()
    state = model.state_dict()
    assert state._metadata["layers.8.0.layers.1"] == {"version": 2}  # MNASNet refuses weights without it
    path = tmp_path / "mnasnet.pth"
    torch.save(state, path)
    out = tmp_path / "mnasnet.onnx"
    assert main(["export", "torchvision:mnasnet0_5", "--weights", str(path), "--input-shape", "1,3,64,64",
                 "--exporter", "torchscript", "-o", str(out)]) == 0  # the faster exporter: loading is under test
    assert _report(out)["results"]["export"]["passed"]
    _assert_onnx_matches(out, model, (1, 3, 64, 64))


@pytest.mark.parametrize("wrapper", ["state_dict", "model", "model_state_dict"])
def test_wrapped_ddp_checkpoint_keeps_metadata_mnasnet(tmp_path: Path, wrapper: str) -> None:
    model = _mnasnet_with_statistics()
    ddp = torch.nn.Module()
    ddp.module = model  # the state dict (and its _metadata) of a model wrapped as DistributedDataParallel wraps it
    path = tmp_path / "ckpt.pth"
    torch.save({wrapper: ddp.state_dict(), "optimizer": {"state": {}, "param_groups": []}, "epoch": 3}, path)
    source = resolve_model("torchvision:mnasnet0_5", weights=str(path))
    assert source.notes == (f"took the weights under the checkpoint's {wrapper!r} key (left out: optimizer, epoch)",
                            "stripped the 'module.' prefix from every key (saved from DataParallel / "
                            "DistributedDataParallel)")
    assert source.module is not None
    for key, value in source.module.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key


def test_strip_prefix_rekeys_metadata() -> None:
    state = OrderedDict([("module.fc.weight", torch.ones(1)), ("module.bn.running_mean", torch.zeros(1))])
    state._metadata = OrderedDict([("", {"version": 1}), ("module", {"version": 1}), ("module.fc", {"version": 1}),
                                   ("module.bn", {"version": 2})])
    stripped = strip_prefix(state, "module.")
    assert list(stripped) == ["fc.weight", "bn.running_mean"]
    assert stripped._metadata == OrderedDict([("", {"version": 1}), ("fc", {"version": 1}), ("bn", {"version": 2})])


def test_copied_state_dict_without_metadata_is_explained(tmp_path: Path) -> None:
    path = tmp_path / "copied.pth"
    torch.save(dict(_mnasnet_with_statistics().state_dict()), path)  # a plain dict copy drops _metadata
    with pytest.raises(InputError, match="version should be set to 1 or 2 instead of None") as info:
        resolve_model("torchvision:mnasnet0_5", weights=str(path))
    assert "_metadata" in info.value.hint and "\n" not in info.value.one_line()


@pytest.mark.parametrize("layout", ["state_dict+module", "model", "model_state_dict", "lightning", "compiled"])
def test_wrapped_checkpoint_exports(user_dir: Path, layout: str) -> None:
    eager = _user_module(user_dir).build()
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.25)  # weights that differ from what the factory builds
    state = eager.state_dict()
    prefix = {"state_dict+module": "module.", "lightning": "model.", "compiled": "_orig_mod."}.get(layout, "")
    prefixed = {prefix + k: v for k, v in state.items()}
    key = {"state_dict+module": "state_dict", "lightning": "state_dict", "compiled": None}.get(layout, layout)
    path = user_dir / "ckpt.pth"
    torch.save({key: prefixed, "epoch": 1} if key else prefixed, path)
    out = user_dir / "wrapped.onnx"
    assert main(["export", f"{USER_MODULE}:build", "--weights", str(path), "-o", str(out)]) == 0
    notes = _report(out)["results"]["model"]["notes"]
    assert (f"took the weights under the checkpoint's {key!r} key (left out: epoch)" in notes) == bool(key)
    assert any(repr(prefix) in n for n in notes) == bool(prefix)
    _assert_onnx_matches(out, eager, (1, 3, 16, 16))


def test_weights_file_never_runs_code(user_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    marker = user_dir / "code_ran"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = user_dir / "weights.pth"
    torch.save({"fc.weight": torch.zeros(3, 8), "extra": Payload()}, path)
    assert main(["export", f"{USER_MODULE}:build", "--weights", str(path), "-o", str(user_dir / "o.onnx")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds pickled Python objects (io.open), not just tensors" in err and "\n" not in err
    assert not marker.exists() and not (user_dir / "o.onnx").exists()


def test_safetensors_weights(user_dir: Path) -> None:
    safetensors_torch = pytest.importorskip("safetensors.torch")
    eager = _user_module(user_dir).build(num_classes=4)
    with torch.no_grad():
        eager.fc.bias.fill_(0.5)
    path = user_dir / "model.safetensors"
    safetensors_torch.save_file(eager.state_dict(), str(path))
    source = resolve_model(f"{USER_MODULE}:build(num_classes=4)", weights=str(path))
    assert source.module is not None and torch.equal(source.module.fc.bias, torch.full((4,), 0.5))


# -------------------------------------------------------------------------------------- wrong kinds of input


def _safetensors_bytes(tensors: int) -> bytes:
    header = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(tensors)}
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"\0" * (4 * tensors)


def _wrong_inputs(folder: Path) -> dict[str, tuple[list[str], list[str]]]:
    """case -> (CLI arguments after ``export``, fragments the one-line error must hold)."""
    net = _user_module(folder).build()
    state = net.state_dict()
    torch.save(state, folder / "weights.pth")
    torch.save({"state_dict": state, "epoch": 2}, folder / "ckpt.ckpt")
    torch.save(torch.optim.SGD(net.parameters(), lr=0.1).state_dict(), folder / "optim.pt")
    torch.save(torch.zeros(3), folder / "tensor.pt")
    torch.jit.save(torch.jit.script(net.eval()), str(folder / "scripted.onnx"))
    torch.jit.save(torch.jit.script(net.eval()), str(folder / "good_script.pt"))
    torch.save(net, folder / "whole.pth")
    torch.onnx.export(net.eval(), (torch.randn(1, 3, 16, 16),), str(folder / "real.onnx"), dynamo=False)
    (folder / "real.onnx").rename(folder / "model.pt")
    (folder / "notes.txt").write_text("just some notes\n")
    (folder / "photo.jpg").write_bytes(b"\xff\xd8\xff\xe0" + bytes(64))
    (folder / "weights.safetensors").write_bytes(_safetensors_bytes(2))
    (folder / "truncated.pt").write_bytes((folder / "weights.pth").read_bytes()[:200])
    (folder / "somedir").mkdir()
    n = len(state)
    return {
        "state dict": (["weights.pth"], [f"weights.pth holds weights ({n} tensors), not a model",
                                         "torchvision:NAME or pkg.mod:factory with --weights weights.pth"]),
        "wrapped checkpoint": (["ckpt.ckpt"], [f"training checkpoint with weights ({n} tensors) under ['state_dict']",
                                              "--weights ckpt.ckpt"]),
        "optimizer state": (["optim.pt"], ["holds an optimizer's state", "model.state_dict()"]),
        "single tensor": (["tensor.pt"], ["holds a single tensor of shape (3,), not a model"]),
        "TorchScript named .onnx": (["scripted.onnx"], ["is a TorchScript module, not an ONNX model",
                                                        "rename it to scripted.pt"]),
        "ONNX named .pt": (["model.pt"], ["is an ONNX model but its name does not end in .onnx",
                                          "rename it to model.onnx"]),
        "text file": (["notes.txt"], ["notes.txt is a text file, not a model"]),
        "Python source": ([f"{USER_MODULE}.py"], ["is Python source code", "package.module:factory"]),
        "image": (["photo.jpg"], ["is a JPEG image, not a model"]),
        "safetensors as model": (["weights.safetensors"], ["holds weights (2 tensors in safetensors format)",
                                                           "--weights weights.safetensors"]),
        "truncated torch file": (["truncated.pt"], ["is a damaged zip archive"]),
        "directory": (["somedir"], ["somedir is a directory"]),
        "missing file": (["missing.pth"], ["missing.pth does not exist"]),
        "unparsable factory": ([f"{USER_MODULE}:build(num_classes=5"], ["was never closed",
                                                                         "factory(num_classes=5, width=0.5)"]),
        "non-literal argument": ([f"{USER_MODULE}:build(num_classes=len('ab'))"], ["is not a literal value"]),
        "weights with TorchScript": (["good_script.pt", "--weights", "weights.pth"],
                                     ["--weights does not apply to a TorchScript module"]),
        "TorchScript as weights": ([f"{USER_MODULE}:build", "--weights", "good_script.pt"],
                                   ["--weights good_script.pt is a TorchScript module, not weights"]),
        "whole model as weights": ([f"{USER_MODULE}:build", "--weights", "whole.pth"],
                                   [f"holds pickled Python objects ({USER_MODULE}.Net)", "pass it as the model"]),
        "optimizer as weights": ([f"{USER_MODULE}:build", "--weights", "optim.pt"],
                                 ["optim.pt holds an optimizer's state", "not a state dict of tensors"]),
        "weights of another shape": ([f"{USER_MODULE}:build(num_classes=7)", "--weights", "weights.pth"],
                                     ["do not match the model: size mismatch for fc.weight"]),
    }


_WRONG_CASES = [
    "state dict", "wrapped checkpoint", "optimizer state", "single tensor", "TorchScript named .onnx",
    "ONNX named .pt", "text file", "Python source", "image", "safetensors as model", "truncated torch file",
    "directory", "missing file", "unparsable factory", "non-literal argument", "weights with TorchScript",
    "TorchScript as weights", "whole model as weights", "optimizer as weights", "weights of another shape",
]


def test_every_wrong_case_is_listed(user_dir: Path) -> None:
    assert set(_wrong_inputs(user_dir)) == set(_WRONG_CASES)


@pytest.mark.parametrize("case", _WRONG_CASES)
def test_wrong_input_is_one_line_exit_2_and_writes_nothing(user_dir: Path, case: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    args, fragments = _wrong_inputs(user_dir)[case]
    capsys.readouterr()
    before = _files(user_dir)
    assert main(["export", *args, "-o", "out.onnx"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    assert _files(user_dir) == before


# -------------------------------------------------------------------------------------------------- interrupt


@pytest.mark.parametrize("wrapped", [False, True])
def test_interrupt_is_not_a_dynamo_failure(factories: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str], wrapped: bool) -> None:
    def interrupted(*args, **kwargs):
        if wrapped:  # as an exporter might pass Ctrl-C on: wrapped in its own error
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as exc:
                raise RuntimeError("export aborted") from exc
        raise KeyboardInterrupt

    def must_not_run(*args, **kwargs):
        raise AssertionError("an interrupt must not fall back to the TorchScript exporter")

    monkeypatch.setattr(export_module, "_run_dynamo", interrupted)
    monkeypatch.setattr(export_module, "_run_torchscript", must_not_run)
    out = tmp_path / "out.onnx"
    assert main(["export", f"{factories}:tiny_cnn", "-o", str(out)]) == 130
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: interrupted") and "\n" not in err
    assert not out.exists() and list(tmp_path.iterdir()) == []
