"""InputSpec: the forms it parses, its errors, and fixing symbolic dimensions into a model before anything else."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend.shapes import (InputSpec, apply_input_spec, fixed_shapes, input_dims, require_static,
                                    symbolic_inputs)
from npukit.runtime.ort import make_session, run

from .conftest import make_matmul_model


def _two_input_conv() -> onnx.ModelProto:
    """y = Conv(x) + skip, with x: [N, 3, H, W], skip: [N, 4, H, W] (H and W shared by both inputs)."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "skip"], ["y"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
                helper.make_tensor_value_info("skip", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize(("given", "shapes"), [
    ("1,3,640,640", ((None, (1, 3, 640, 640)),)),
    ("1x3x64x64", ((None, (1, 3, 64, 64)),)),
    ((1, 3, 8, 8), ((None, (1, 3, 8, 8)),)),
    (["x=1,3,8,8"], (("x", (1, 3, 8, 8)),)),
    (["x=1,3,8,8", "skip=1,4,8,8"], (("x", (1, 3, 8, 8)), ("skip", (1, 4, 8, 8)))),
    ({"x": [1, 3, 8, 8]}, (("x", (1, 3, 8, 8)),)),
])
def test_parse_forms(given, shapes) -> None:
    spec = InputSpec.parse(given)
    assert spec is not None and spec.shapes == shapes
    assert InputSpec.parse(spec) is spec and InputSpec.parse(None) is None


@pytest.mark.parametrize(("given", "message"), [
    ("1,3,a,8", "not a list of integers"),
    ("1,0,8,8", "positive dimensions"),
    ("=1,3,8,8", "empty input name"),
    (["1,3,8,8", "skip=1,4,8,8"], "without a name can only be given alone"),
    (["x=1,3,8,8", "x=1,3,4,4"], "more than one shape"),
])
def test_parse_errors(given, message) -> None:
    with pytest.raises(InputError, match=message):
        InputSpec.parse(given)


def test_resolve_checks_names_ranks_and_static_dims() -> None:
    model = _two_input_conv()
    assert InputSpec.parse("1,3,8,8").resolve(model) == {"x": (1, 3, 8, 8)}
    with pytest.raises(InputError, match="no input named 'y'") as info:
        InputSpec.parse(["y=1,3,8,8"]).resolve(model)
    assert "'x', 'skip'" in info.value.hint
    with pytest.raises(InputError, match="has rank 3 but input 'x' of the model has rank 4"):
        InputSpec.parse("1,3,8").resolve(model)
    with pytest.raises(InputError, match="axis 1 is fixed to 3"):
        InputSpec.parse("1,5,8,8").resolve(model)


def test_apply_fixes_inputs_shared_dims_and_infers_outputs() -> None:
    model = _two_input_conv()
    fixed = apply_input_spec(model, InputSpec.parse(["x=2,3,8,6"]))
    assert input_dims(fixed) == {"x": (2, 3, 8, 6), "skip": (2, 4, 8, 6)}  # N, H, W shared by skip too
    out = fixed.graph.output[0].type.tensor_type.shape
    assert [d.dim_value for d in out.dim] == [2, 4, 8, 6]
    assert not symbolic_inputs(fixed, allow_batch=False) and fixed_shapes(fixed)["skip"] == (2, 4, 8, 6)
    assert input_dims(model)["x"] == ("N", 3, "H", "W")  # the original is untouched
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32),
             "skip": rng.standard_normal((2, 4, 8, 6)).astype(np.float32)}
    np.testing.assert_array_equal(run(make_session(model), feeds)[0], run(make_session(fixed), feeds)[0])
    assert apply_input_spec(model, None) is model


def test_apply_rejects_two_sizes_for_one_symbolic_name_and_misfits() -> None:
    with pytest.raises(InputError, match="symbolic dimension 'H' is 8 for input 'x' but 9 for input 'skip'"):
        apply_input_spec(_two_input_conv(), InputSpec.parse(["x=1,3,8,8", "skip=1,4,9,8"]))
    with pytest.raises(InputError, match=r"input shape x=\(1, 7\) does not fit the model"):  # x @ W: W is 4x3
        apply_input_spec(make_matmul_model(), InputSpec.parse(["x=1,7"]), override_static=True)


def test_require_static_names_inputs_dims_and_the_flag() -> None:
    model = _two_input_conv()
    with pytest.raises(InputError) as info:
        require_static(model, needs="quantize")
    text = info.value.one_line()
    assert "quantize needs static input shapes" in text and "input 'x' is Nx3xHxW" in text
    assert "--input-shape x=1,3,H,W" in text and "--input-shape skip=1,4,H,W" in text and "\n" not in text
    only_batch = apply_input_spec(model, InputSpec.parse(["x=1,3,8,8"]), dynamic_batch=True)
    require_static(only_batch, needs="quantize")  # a symbolic batch alone runs as 1
    with pytest.raises(InputError):
        require_static(only_batch, needs="the HTP", allow_batch=False)
