from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from npukit.targets import TARGETS, analyze, get_target
from npukit.targets.qnn_htp import SOCS
from tests.targets._models import single


def _verdict(model, target, **kw):
    analysis = analyze(model, get_target(target), **kw)
    return next(v for v in analysis.nodes if v.op_type != "Constant")


@pytest.mark.parametrize("name", TARGETS)
def test_every_profile_names_its_source_and_takes_conv_or_explains(name):
    profile = get_target(name)
    assert profile.sources and all(s.url.startswith("https://") and s.version for s in profile.sources)
    assert profile.layout in ("NCHW", "NHWC")
    w = numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w")
    v = _verdict(single("Conv", inits=[w], extra_inputs=["w"]), name)
    assert v.supported, v.reasons


@pytest.mark.parametrize("target, op, attrs, supported, reason", [
    ("qnn-htp", "Erf", {}, False, "Erf: not supported by Qualcomm HTP"),
    ("qnn-htp", "HardSwish", {}, True, None),
    ("qnn-htp", "LpNormalization", {"p": 1}, False, "LpNormalization: p 1 not supported"),
    ("qnn-htp", "ReduceProd", {}, False, "ReduceProd is not supported on the NPU"),
    ("qnn-htp", "MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2]}, False, "dilations [2, 2] not supported"),
    ("nnapi", "HardSwish", {}, False, "HardSwish: not supported by Android NNAPI"),
    ("nnapi", "DepthToSpace", {"blocksize": 2, "mode": "CRD"}, False, "DepthToSpace: mode 'CRD' not supported"),
    ("coreml", "Erf", {}, True, None),
    ("xnnpack", "Relu", {}, False, "Relu: not supported by XNNPACK"),
    ("litert", "HardSigmoid", {}, False, "HardSigmoid: not supported by LiteRT"),
    ("cpu", "GroupNormalization", {}, True, None),
])
def test_single_op_rules(target, op, attrs, supported, reason):
    v = _verdict(single(op, **attrs), target)
    assert v.supported is supported
    if reason:
        assert any(reason in r for r in v.reasons), v.reasons


def test_qnn_resize_modes_and_conv_dilation_rules():
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "s")
    ok = _verdict(single("Resize", inits=[scales], extra_inputs=["", "s"], mode="linear"), "qnn-htp")
    assert ok.supported, ok.reasons
    bad = _verdict(single("Resize", inits=[scales], extra_inputs=["", "s"], mode="linear", antialias=1,
                          opset=18), "qnn-htp")
    assert any("antialias 1 not supported" in r for r in bad.reasons)


def test_nnapi_feature_levels_gate_ops():
    assert _verdict(single("Abs"), "nnapi@29").supported
    v = _verdict(single("Abs"), "nnapi@27")
    assert not v.supported and "not supported by Android NNAPI (API 27)" in v.reasons[0]
    assert not _verdict(single("Elu"), "nnapi@29").supported
    assert _verdict(single("Elu"), "nnapi@30").supported


def test_static_shapes_required_by_qnn_but_not_by_cpu():
    model = single("Relu", shape=("N", 3, 8, 8))
    v = _verdict(model, "qnn-htp")
    assert not v.supported and any("needs static shapes" in r for r in v.reasons)
    assert v.fix == "fix_input_shape"
    assert _verdict(model, "cpu").supported
    assert _verdict(model, "qnn-htp", input_shape=(1, 3, 8, 8)).supported


def test_shape_fix_named_only_where_it_removes_every_reason():
    """A node computing on the data with an op the target lacks stays refused whatever its shapes: no fix is named
    (analyze used to offer fix_input_shape for ConvInteger and DynamicQuantizeLinear on a dynamic input); a Shape
    node, which ORT folds away once the shapes are fixed, keeps the shape fix."""
    from onnx import helper

    from tests.targets._models import make, vi

    data_op = _verdict(single("Erf", shape=("N", 3, 8, 8)), "qnn-htp")
    assert not data_op.supported and data_op.fix is None, data_op
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("ConstantOfShape", ["s"], ["z"], name="zeros"),
             helper.make_node("Add", ["x", "z"], ["y"], name="add")]
    model = make(nodes, [vi("x", ["N", 3])], [vi("y", ["N", 3])])
    verdicts = {v.name: v for v in analyze(model, get_target("qnn-htp")).nodes}
    assert not verdicts["shape"].supported and verdicts["shape"].fix == "fix_input_shape", verdicts["shape"]
    assert verdicts["add"].fix == "fix_input_shape"
    static = {v.name: v for v in analyze(model, get_target("qnn-htp"), input_shape=(1, 3)).nodes}
    assert "shape" not in static  # ORT folded it: what the fix said
    from onnx import TensorProto, numpy_helper

    weight = numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(2, 3), "w")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wf"], name="dq"),
             helper.make_node("Add", ["x", "wf"], ["y"], name="add")]
    dq = make(nodes, [vi("x", ["N", 3])], [vi("y", ["N", 3], TensorProto.FLOAT)], [weight, scale])
    weights = {v.name: v for v in analyze(dq, get_target("coreml")).nodes}
    assert "dq" not in weights or weights["dq"].fix is None, weights["dq"]  # a weight's DQ computes on no shape


def test_dtype_rule():
    from onnx import TensorProto

    from tests.targets._models import make, vi
    from onnx import helper

    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [4], TensorProto.DOUBLE)],
                 [vi("y", [4], TensorProto.DOUBLE)])
    v = _verdict(model, "qnn-htp")
    assert any("dtype float64 not supported" in r for r in v.reasons)


def test_soc_table_has_the_required_snapdragons():
    for part, arch in {"SM8350": 68, "SM8450": 69, "SM8550": 73, "SM8650": 75, "SM8750": 79}.items():
        assert SOCS[part].htp_arch == arch and SOCS[part].soc_model > 0
    v68 = get_target("qnn-htp@SM8350")
    assert not v68.quantization.accepts_float
    analysis = analyze(single("Relu"), v68)
    assert analysis.needs_quantization and analysis.delegated_nodes == 1
    assert "quantize" in analysis.notes[0]
