from __future__ import annotations

import json

import onnx
import pytest

from npukit.errors import InputError
from npukit.report.analyze import analyze_report
from npukit.targets import analyze_model, get_target
from npukit.verbs.analyze import analyze as analyze_verb
from tests.targets._models import conv_relu_erf_conv, single


@pytest.mark.parametrize("name, message", [
    ("npu9000", "unknown target 'npu9000'"),
    ("nnapi@26", "unknown NNAPI API level"),
    ("qnn-htp@SM1234", "unknown Snapdragon SoC"),
    ("coreml@17", "has no variants"),
])
def test_registry_errors(name, message):
    with pytest.raises(InputError, match=message) as info:
        get_target(name)
    assert info.value.hint


def test_unknown_target_lists_the_valid_names():
    with pytest.raises(InputError) as info:
        get_target("tpu")
    assert "qnn-htp" in info.value.hint and "litert" in info.value.hint


@pytest.mark.parametrize("name, ours", [("tflite", "litert"), ("TensorFlow_Lite", "litert"),
                                        ("executorch", "executorch-xnnpack"), ("QNN@SM8650", "qnn-htp@sm8650")])
def test_a_target_s_other_name_is_answered_with_npukit_s(name, ours):
    """--target tflite listed eight names without saying which one LiteRT (TensorFlow Lite's new name) is."""
    with pytest.raises(InputError) as info:
        get_target(name)
    assert info.value.hint == f"did you mean --target {ours}?"
    get_target(ours)  # a name that exists


def test_analyze_model_builds_a_report(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_relu_erf_conv(), path)
    outcome = analyze_model(path, ["qnn-htp", "cpu"], input_shape=(1, 3, 8, 8))
    assert [a.target for a in outcome.analyses] == ["qnn-htp", "cpu"] and not outcome.fixes
    report = analyze_report(outcome, {})
    titles = [t.title for t in report.tables]
    assert titles[:2] == ["Operator support by target", "Delegation by target"]
    assert "Nodes left to the CPU on qnn-htp" in titles
    assert report.figures[0].data == {"labels": ["qnn-htp", "cpu"], "values": [100.0, 100.0]}
    assert report.config["input_shape"] == [1, 3, 8, 8]
    json.loads(report.to_json())


def _saved(model: onnx.ModelProto, tmp_path) -> str:
    path = tmp_path / "in" / "model.onnx"
    path.parent.mkdir(exist_ok=True)
    onnx.save(model, path)
    return str(path)


def test_analyze_with_fix_writes_the_fixed_model(tmp_path):
    model = _saved(single("HardSigmoid", shape=("N", 3, 8, 8)), tmp_path)
    out = tmp_path / "fixed.onnx"
    outcome = analyze_model(model, ["litert"], input_shape=(1, 3, 8, 8), fix=True)
    assert outcome.analyses[0].delegated_nodes == 3 and not out.exists()  # the stage writes nothing
    report = analyze_verb(model, targets=["litert"], input_shape="1,3,8,8", fix=True, output=out).report
    assert out.exists()
    assert report.sections["fixes"]["litert"]["applied"][1]["fix"] == "hardsigmoid_to_clip"
    assert report.verdict.startswith("PASS analyze --fix: fixed for litert, every fixed model within")
    table = next(t for t in report.tables if t.title.startswith("Fixes applied (--fix)"))
    assert table.rows[0][0] == "litert" and "hardsigmoid_to_clip x1" in table.rows[0][1]
    assert table.rows[0][3] == str(out)


def test_with_several_targets_only_the_models_a_fix_changed_are_written(tmp_path):
    """cpu needs nothing here: no byte-identical copy for it beside litert's fixed model."""
    model = _saved(single("HardSigmoid", shape=(1, 3, 8, 8)), tmp_path)
    out = tmp_path / "out" / "fixed.onnx"
    report = analyze_verb(model, targets=["litert", "cpu"], fix=True, output=out).report
    assert sorted(p.name for p in out.parent.iterdir()) == ["fixed.litert.onnx", "fixed.report.json"]
    rows = {r[0]: r for r in next(t for t in report.tables if t.title.startswith("Fixes applied")).rows}
    assert rows["cpu"][1:] == ["nothing to fix", "-", "not written"]


def test_a_fix_no_target_can_use_writes_nothing(tmp_path):
    """Every target refusing the model is an error: no fixed model is left behind (it was written first)."""
    model = _saved(single("Relu"), tmp_path)
    out = tmp_path / "out" / "fixed.onnx"
    with pytest.raises(InputError, match="takes none"):
        analyze_verb(model, targets=["xnnpack"], fix=True, output=out)
    assert not out.exists()


def test_model_no_target_can_take_says_which_ops_and_what_to_do():
    with pytest.raises(InputError, match="takes none of the model's 1 nodes \\(Relu x1\\)") as info:
        analyze_model(single("Relu"), ["xnnpack"])
    assert "replace the unsupported ops" in info.value.hint
    with pytest.raises(InputError, match="needs static|takes none") as info:
        analyze_model(single("Relu", shape=("N", 3, 8, 8)), ["qnn-htp"])
    assert "--input-shape" in info.value.hint


def test_no_targets():
    with pytest.raises(InputError, match="no target"):
        analyze_model(single("Relu"), [])


def test_fix_says_what_needs_the_input_shape():
    """--fix with nothing to fix said so, though a target was waiting on the input shape; a fix that needs sizes to
    check itself did not say --fix was what needed them (the analysis alone runs without)."""
    outcome = analyze_model(conv_relu_erf_conv(), ["qnn-htp", "coreml"], fix=True)
    assert analyze_report(outcome, {}).verdict.endswith(
        "qnn-htp would take more with the input shape fixed: pass --input-shape")
    with pytest.raises(InputError, match="--fix for litert checks the fixed model on seeded inputs: input 'x' has "
                                         "a symbolic dimension 'H'"):
        analyze_model(single("HardSigmoid", shape=(1, 3, "H", 8)), ["litert"], fix=True)
    with pytest.raises(InputError, match="takes none of the model's 1 nodes"):  # the analysis alone: no shape asked
        analyze_model(single("HardSigmoid", shape=(1, 3, "H", 8)), ["litert"])
