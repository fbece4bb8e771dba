from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

from npukit.runtime.ort import make_session, random_feeds, run
from npukit.targets import analyze, apply_fixes, get_target
from npukit.targets.fix import (
    DecomposeGroupNormPass,
    GeluTanhDecomposePass,
    GeluToErfPass,
    GlobalAveragePoolToReduceMeanPass,
    GlobalPoolToPoolPass,
    HardSigmoidToClipPass,
    HardSwishToClipPass,
    HardSwishToHardSigmoidPass,
)
from tests.targets._models import make, single, vi


def _apply(model, pass_):
    ir_model = ir.serde.deserialize_model(model)
    result = pass_(ir_model)
    assert result.modified
    fixed = ir.serde.serialize_model(result.model)
    onnx.checker.check_model(fixed)
    return fixed


def _max_rel(a, b):
    s_a, s_b = make_session(a, optimization="disable"), make_session(b, optimization="disable")
    feeds = random_feeds(s_a, seed=3)
    feeds = {k: v * 4 for k, v in feeds.items()}  # reach the kinks of HardSwish/HardSigmoid
    ra, rb = run(s_a, feeds)[0], run(s_b, feeds)[0]
    return float(np.max(np.abs(ra - rb)) / np.max(np.abs(ra)))


def _groupnorm(opset, per_group):
    scale = np.linspace(0.5, 1.5, 2 if per_group else 4).astype(np.float32)
    bias = np.linspace(-1, 1, 2 if per_group else 4).astype(np.float32)
    inits = [numpy_helper.from_array(scale, "sc"), numpy_helper.from_array(bias, "b")]
    return single("GroupNormalization", shape=(2, 4, 3, 3), opset=opset, inits=inits, extra_inputs=["sc", "b"],
                  out_shape=[2, 4, 3, 3], num_groups=2, epsilon=1e-5)


@pytest.mark.parametrize("model, pass_, ops", [
    (single("HardSwish", opset=14), HardSwishToHardSigmoidPass(), {"Mul", "HardSigmoid"}),
    (single("HardSwish", opset=14), HardSwishToClipPass(), {"Add", "Clip", "Mul", "Div"}),
    (single("HardSigmoid", alpha=0.3, beta=0.4), HardSigmoidToClipPass(), {"Mul", "Add", "Clip"}),
    (_groupnorm(21, per_group=False), DecomposeGroupNormPass(), {"Reshape", "InstanceNormalization", "Mul", "Add"}),
    (_groupnorm(18, per_group=True), DecomposeGroupNormPass(), {"Reshape", "InstanceNormalization", "Mul", "Add"}),
    (single("GlobalAveragePool"), GlobalAveragePoolToReduceMeanPass(), {"ReduceMean"}),
    (single("GlobalAveragePool", opset=18), GlobalAveragePoolToReduceMeanPass(), {"ReduceMean"}),
    (single("GlobalAveragePool"), GlobalPoolToPoolPass(), {"AveragePool"}),
    (single("GlobalMaxPool"), GlobalPoolToPoolPass(), {"MaxPool"}),
    (single("Gelu", opset=20), GeluToErfPass(), {"Div", "Erf", "Mul", "Add"}),
    (single("Gelu", opset=20, approximate="tanh"), GeluTanhDecomposePass(), {"Mul", "Add", "Tanh"}),
])
def test_fix_numerics_and_ops(model, pass_, ops):
    fixed = _apply(model, pass_)
    assert {n.op_type for n in fixed.graph.node} == ops
    assert fixed.graph.output[0].name == "y"
    assert _max_rel(model, fixed) < 2e-6


def test_exact_gelu_is_not_replaced_by_the_tanh_form():
    pass_ = GeluTanhDecomposePass()
    result = pass_(ir.serde.deserialize_model(single("Gelu", opset=20)))
    assert not result.modified and "exact Gelu" in pass_.notes[0]


def test_groupnorm_needs_static_channels():
    pass_ = DecomposeGroupNormPass()
    model = _groupnorm(21, per_group=False)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "H"
    assert not pass_(ir.serde.deserialize_model(model)).modified
    assert "static" in pass_.notes[0]


def test_apply_fixes_picks_what_the_target_lacks_and_verifies():
    model = single("HardSigmoid", shape=("N", 3, 8, 8))
    result = apply_fixes(model, get_target("litert"), input_shape=(1, 3, 8, 8))
    assert [a["fix"] for a in result.applied] == ["fix_input_shape", "hardsigmoid_to_clip"]
    assert result.errors is not None and result.errors.max_rel < 1e-5
    assert analyze(result.model, get_target("litert")).delegated_nodes == 3
    # QNN takes HardSigmoid: nothing to substitute, only the shape is fixed
    qnn = apply_fixes(model, get_target("qnn-htp"), input_shape=(1, 3, 8, 8))
    assert [a["fix"] for a in qnn.applied] == ["fix_input_shape"] and qnn.errors is None
    dims = qnn.model.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [1, 3, 8, 8]


def test_apply_fixes_hardswish_form_follows_the_target():
    model = single("HardSwish", opset=14)
    nnapi = apply_fixes(model, get_target("nnapi"))
    assert [a["fix"] for a in nnapi.applied] == ["hardswish_to_clip"]
    assert analyze(nnapi.model, get_target("nnapi")).delegated_nodes == len(nnapi.model.graph.node)
    xnn = apply_fixes(helper_model_gap(), get_target("xnnpack"))
    assert {n.op_type for n in xnn.model.graph.node} == {"AveragePool"}


def helper_model_gap():
    return make([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [vi("x", [1, 3, 8, 8])],
                [vi("y", [1, 3, 1, 1])])
