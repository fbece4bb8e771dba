from __future__ import annotations

import json

import onnx
import pytest

from npukit.errors import InputError
from npukit.targets import analyze_model, get_target
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


def test_analyze_model_builds_a_report(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(conv_relu_erf_conv(), path)
    analyses, report = analyze_model(path, ["qnn-htp", "cpu"], input_shape=(1, 3, 8, 8))
    assert [a.target for a in analyses] == ["qnn-htp", "cpu"]
    titles = [t.title for t in report.tables]
    assert titles[:2] == ["Operator support by target", "Delegation by target"]
    assert "Nodes left to the CPU on qnn-htp" in titles
    assert report.figures[0].data == {"labels": ["qnn-htp", "cpu"], "values": [100.0, 100.0]}
    json.loads(report.to_json())


def test_analyze_model_with_fix_writes_the_fixed_model(tmp_path):
    model = single("HardSigmoid", shape=("N", 3, 8, 8))
    out = tmp_path / "fixed.onnx"
    analyses, report = analyze_model(model, ["litert"], input_shape=(1, 3, 8, 8), fix=True, output=out)
    assert analyses[0].delegated_nodes == 3 and out.exists()
    assert report.sections["fixes"]["litert"]["applied"][1]["fix"] == "hardsigmoid_to_clip"
    assert report.verdict.startswith("PASS analyze --fix: fixed for litert, every fixed model within")
    table = next(t for t in report.tables if t.title.startswith("Fixes applied (--fix)"))
    assert table.rows[0][0] == "litert" and "hardsigmoid_to_clip x1" in table.rows[0][1] and table.rows[0][3] == str(out)


def test_with_several_targets_only_the_models_a_fix_changed_are_written(tmp_path):
    """cpu needs nothing here: no byte-identical copy for it beside litert's fixed model."""
    model = single("HardSigmoid", shape=(1, 3, 8, 8))
    out = tmp_path / "fixed.onnx"
    _, report = analyze_model(model, ["litert", "cpu"], fix=True, output=out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fixed.litert.onnx"]
    rows = {r[0]: r for r in next(t for t in report.tables if t.title.startswith("Fixes applied")).rows}
    assert rows["cpu"][1:] == ["nothing to fix", "-", "not written"]


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
