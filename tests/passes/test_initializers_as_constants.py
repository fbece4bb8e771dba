"""InitializersAsConstantsPass: initializers that are also graph inputs (IR version 3 models) become constants."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from npukit.passes.initializers_as_constants import InitializersAsConstantsPass
from npukit.runtime.ort import make_session

from .tiny import apply, assert_equivalent, const, info, make_model


def _ir3_model() -> onnx.ModelProto:
    w = np.arange(6, dtype=np.float32).reshape(2, 3) / 10
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
                       [info("x", [1, 2]), info("w", [2, 3]), info("b", [3])], [info("y", [1, 3])],
                       [const("w", w), const("b", [0.5, -0.5, 1.0])], opset=9)
    model.ir_version = 3  # every initializer listed as an input, as IR 3 requires
    onnx.checker.check_model(model)
    return model


def test_initializers_leave_the_inputs_and_the_ir_version_allows_it() -> None:
    model = _ir3_model()
    pass_ = InitializersAsConstantsPass()
    out = apply(pass_, model)
    assert [i.name for i in out.graph.input] == ["x"] and {i.name for i in out.graph.initializer} == {"w", "b"}
    assert out.ir_version >= 4 and pass_.rewrites == 2 and any("IR version 3 -> 4" in n for n in pass_.notes)
    onnx.checker.check_model(out)
    assert [i.name for i in make_session(out).get_inputs()] == ["x"]  # ORT asks for the real input only
    assert_equivalent(model, out, rtol=0.0)


def test_a_model_without_such_inputs_is_left_alone() -> None:
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [info("x", [2])], [info("y", [2])])
    pass_ = InitializersAsConstantsPass()
    out = apply(pass_, model)
    assert pass_.rewrites == 0 and out.ir_version == model.ir_version and [i.name for i in out.graph.input] == ["x"]
