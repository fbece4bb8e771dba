"""analyze --target nnapi / coreml against ONNX Runtime's own mobile usability checker
(``onnxruntime.tools.mobile_helpers.usability_checker``), which optimizes the model at ORT's basic level before it
counts what the NNAPI and CoreML EPs take, as ORT does before those EPs partition the graph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnxruntime.tools.mobile_helpers import usability_checker as ort_checker
from onnxruntime.tools.onnx_model_utils import ModelProtoWithShapeInfo, optimize_model

from npukit.targets import analyze, get_target
from tests.targets._models import make, vi


def _conv_bn(rng, x: str, y: str, c_in: int, c_out: int, tag: str) -> tuple[list, list]:
    w = numpy_helper.from_array(rng.standard_normal((c_out, c_in, 3, 3)).astype(np.float32), f"{tag}_w")
    bn = [numpy_helper.from_array(v.astype(np.float32), f"{tag}_{k}") for k, v in
          (("g", rng.uniform(0.5, 1.5, c_out)), ("b", rng.standard_normal(c_out)),
           ("m", rng.standard_normal(c_out)), ("v", rng.uniform(0.5, 1.5, c_out)))]
    nodes = [helper.make_node("Conv", [x, w.name], [f"{tag}_c"], name=f"{tag}_conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", [f"{tag}_c", *(t.name for t in bn)], [y], name=f"{tag}_bn")]
    return nodes, [w, *bn]


def _se_block() -> onnx.ModelProto:
    """Conv+BN+Relu, Conv+BN, then a squeeze-excite gate through HardSigmoid (which NNAPI lacks), a Dropout and
    an Identity: the shape of the blocks of PP-OCR's classifier and MobileNetV3."""
    rng = np.random.default_rng(0)
    a, ia = _conv_bn(rng, "x", "a", 3, 8, "b1")
    b, ib = _conv_bn(rng, "r", "b", 8, 8, "b2")
    nodes = [*a, helper.make_node("Relu", ["a"], ["r"], name="relu"), *b,
             helper.make_node("GlobalAveragePool", ["b"], ["p"], name="gap"),
             helper.make_node("HardSigmoid", ["p"], ["g"], name="hsig", alpha=1 / 6),
             helper.make_node("Mul", ["b", "g"], ["m"], name="gate"),
             helper.make_node("Dropout", ["m"], ["d"], name="drop"),
             helper.make_node("Identity", ["d"], ["y"], name="ident")]
    return make(nodes, [vi("x", [1, 3, 16, 16])], [vi("y", None)], [*ia, *ib])


def _ort_counts(model: onnx.ModelProto, tmp_path: Path, check) -> tuple[int, int, int]:
    """ORT's checker on ``model`` after ORT's basic optimizations, as its command line does."""
    source, optimized = tmp_path / "m.onnx", tmp_path / "basic.onnx"
    onnx.save(model, source)
    optimize_model(source, optimized)  # the checker's own step: ORT's basic level
    info = check(ModelProtoWithShapeInfo(optimized).model_with_shape_info, True)
    return info.num_nodes, info.num_supported_nodes, info.num_partitions


@pytest.mark.parametrize("target, check", [
    ("nnapi", ort_checker.check_nnapi_partitions),
    ("coreml", lambda m, fixed: ort_checker.check_coreml_partitions(m, fixed, "coreml_supported_mlprogram_ops.md")),
])
def test_mobile_eps_see_the_graph_after_orts_basic_optimizations(target, check, tmp_path) -> None:
    model = _se_block()
    a = analyze(model, get_target(target))
    nodes, supported, partitions = _ort_counts(model, tmp_path, check)
    # BatchNormalization folded into the Conv, Dropout and Identity removed: neither is counted as a CPU fallback
    assert {"BatchNormalization", "Dropout", "Identity"}.isdisjoint(v.op_type for v in a.nodes)
    assert (len(a.nodes), a.delegated_nodes, len(a.partitions)) == (nodes, supported, partitions)
    if target == "nnapi":
        assert [v.op_type for v in a.unsupported] == ["HardSigmoid"] and len(a.partitions) == 2
    else:
        assert a.unsupported == () and len(a.partitions) == 1


def test_only_function_ops_orts_cpu_ep_inlines_are_kept_out_of_its_way(monkeypatch) -> None:
    """Relu has a function body from opset 14 but a CPU kernel: ORT leaves it, so it is optimized with the graph (a
    Relu cut out of it blocked the folding of shapes that pass through it: Silero VAD's If). HardSwish has no CPU
    kernel: behind a target that takes it, it is kept out of ORT's way and put back."""
    from npukit.targets import partition
    from tests.targets._models import single

    passes = []
    real = partition._basic_pass
    monkeypatch.setattr(partition, "_basic_pass", lambda m: passes.append([n.op_type for n in m.graph.node])
                        or real(m))
    relu = analyze(single("Relu", opset=15), get_target("nnapi"))
    assert [v.op_type for v in relu.nodes] == ["Relu"] and passes == [["Relu"]]  # one pass, on the whole graph
    passes.clear()
    hswish = analyze(single("HardSwish", opset=14), get_target("qnn-htp"))
    assert [v.op_type for v in hswish.nodes] == ["HardSwish"] and hswish.unsupported == ()
    assert passes == [["HardSwish"], []]  # inlined by the first pass, so kept out of the second


@pytest.mark.parametrize("x_shape, slope_shape, taken", [
    ([1, 4, 8, 8], [4, 1, 1], True), ([1, 4, 8, 8], [1], True), ([1, 4, 8], [4, 1, 1], True),
    ([1, 4, 8, 8], [1, 4, 1, 1], False),  # torch's export of nn.PReLU(C) before a 4D input: MTCNN's ONet
    ([1, 4], [4], False),  # after a Linear layer: X needs rank 3 or 4
    ([1, 1, 8, 8], [1], False),  # one slope over one channel (a Core ML crash ORT steers around)
])
def test_coreml_takes_prelu_as_its_op_builder_does(x_shape, slope_shape, taken) -> None:
    slope = numpy_helper.from_array(np.full(slope_shape, 0.25, np.float32), "slope")
    model = make([helper.make_node("PRelu", ["x", "slope"], ["y"])], [vi("x", x_shape)], [vi("y", None)], [slope])
    a = analyze(model, get_target("coreml"))
    assert (a.unsupported == ()) is taken, [v.reasons for v in a.unsupported]


def test_prelu_channel_form_fix_makes_coreml_take_mtcnns_prelus_exactly() -> None:
    """MTCNN's ONet: PReLU slopes exported as [1, C, 1, 1] before 4D inputs and a PReLU after a Linear layer. The
    analysis names prelu_channel_form for both; --fix reshapes the first to [C, 1, 1] and writes the second as
    Relu(x) - s * Relu(-x), and the fixed model's outputs equal the original's bit for bit."""
    from npukit.runtime.ort import make_session
    from npukit.targets.fix import apply_fixes

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    s4 = numpy_helper.from_array(rng.uniform(0.05, 0.5, (1, 8, 1, 1)).astype(np.float32), "s4")
    fc = numpy_helper.from_array(rng.standard_normal((8 * 6 * 6, 5)).astype(np.float32), "fc")
    s2 = numpy_helper.from_array(rng.uniform(0.05, 0.5, (5,)).astype(np.float32), "s2")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "flat")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("PRelu", ["c", "s4"], ["p"], name="prelu_conv"),
             helper.make_node("Reshape", ["p", "flat"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "fc"], ["m"], name="linear"),
             helper.make_node("PRelu", ["m", "s2"], ["y"], name="prelu_linear")]
    model = make(nodes, [vi("x", [1, 3, 8, 8])], [vi("y", None)], [w, s4, fc, s2, shape])
    coreml = get_target("coreml")
    before = {v.name: v.fix for v in analyze(model, coreml).unsupported}
    assert before == {"prelu_conv": "prelu_channel_form", "prelu_linear": "prelu_channel_form"}
    fixed = apply_fixes(model, coreml)
    assert [(a["fix"], a["rewrites"]) for a in fixed.applied] == [("prelu_channel_form", 2)]
    assert analyze(fixed.model, coreml).unsupported == ()
    x = {"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)}
    ref, out = (make_session(m, optimization="disable").run(None, x)[0] for m in (model, fixed.model))
    np.testing.assert_array_equal(out, ref)
