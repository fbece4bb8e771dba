"""InputSpec: the forms it parses, its errors, and fixing symbolic dimensions into a model before anything else."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.frontend.shapes import (InputSpec, apply_input_spec, fix_inputs, fixed_shapes, input_dims, require_static,
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
    with pytest.raises(InputError, match="has rank 3 but input 'x' of the model has rank 4") as info:
        InputSpec.parse("1,3,8").resolve(model)
    # the declared sizes to fill in, not 1,3,1,1 (a shape the model cannot run at)
    assert info.value.hint.endswith("x=1,3,H,W with H, W the sizes you run it at")
    with pytest.raises(InputError, match="axis 1 is fixed to 3"):
        InputSpec.parse("1,5,8,8").resolve(model, override_static=False)
    assert InputSpec.parse("1,5,8,8").resolve(model) == {"x": (1, 5, 8, 8)}  # ORT decides (apply_input_spec)


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
    with pytest.raises(InputError, match=r"input shape x=1,7 does not fit the model"):  # x @ W: W is 4x3
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
    state = _contrib_gelu([2, "batch", 128])  # a recurrent state whose batch axis is not axis 0 (Silero VAD)
    with pytest.raises(InputError) as info:
        require_static(state, needs="quantize")
    assert "--input-shape x=2,1,128" in info.value.one_line()
    with pytest.raises(InputError) as info:  # Paddle2ONNX's unknown dims: named by axis, never "?" in the flag
        require_static(_contrib_gelu([1, 3, "?", "width"]), needs="quantize")
    assert "--input-shape x=1,3,D2,width" in info.value.one_line()


def _contrib_gelu(dims: list) -> onnx.ModelProto:
    """y = Relu(com.microsoft.Gelu(x)): ONNX shape inference knows no com.microsoft op, so once the input is fixed it
    cannot work out y's shape (as with the Paddle/TF exports whose outputs came back shapeless)."""
    graph = helper.make_graph(
        [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"), helper.make_node("Relu", ["g"], ["y"])],
        "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def test_an_output_inference_cannot_shape_keeps_its_declared_rank() -> None:
    fixed = apply_input_spec(_contrib_gelu(["N", "L"]), InputSpec.parse("1,4"))
    onnx.checker.check_model(fixed)  # "Field 'shape' of 'type' is required but missing" before the fix
    dims = fixed.graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param for d in dims] == [1, 4]  # N and L sized from the input they share
    other = _contrib_gelu(["N", 4])
    other.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "rows"  # a name no input has
    dims = apply_input_spec(other, InputSpec.parse("1,4")).graph.output[0].type.tensor_type.shape.dim
    assert [d.dim_value or d.dim_param for d in dims] == ["rows", 4]


@pytest.mark.parametrize("unknown", ["?", "-1", ""])
def test_question_marks_and_numbers_as_dim_names_are_each_their_own(unknown: str) -> None:
    """Paddle2ONNX names every unknown dim '?' (ppocr_cls: x [-1, 3, '?', '?']): two '?' are two dims."""
    model = _two_input_conv()
    for value in (*model.graph.input, *model.graph.output):
        for axis in (0, 2, 3):
            value.type.tensor_type.shape.dim[axis].dim_param = unknown if axis else "-1"
    fixed = apply_input_spec(model, InputSpec.parse(["x=1,3,48,192", "skip=1,4,48,192"]))
    assert input_dims(fixed) == {"x": (1, 3, 48, 192), "skip": (1, 4, 48, 192)}
    onnx.checker.check_model(fixed)
    with pytest.raises(InputError, match="symbolic dimension 'H' is 8"):  # real names are still one size
        apply_input_spec(_two_input_conv(), InputSpec.parse(["x=1,3,8,8", "skip=1,4,9,8"]))


def _placeholder_conv(*, reshape_to: list[int] | None = None) -> onnx.ModelProto:
    """Conv on a placeholder static input [10, 3, 8, 8] (as CenterFace declares [10, 3, 32, 32]); with
    ``reshape_to`` a Reshape after it to a shape baked in for that size, behind an Abs that ONNX shape inference
    does not evaluate (so only running the model finds the mismatch)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv")]
    out_dims: list = [10, 4, 8, 8]
    if reshape_to is not None:
        inits.append(numpy_helper.from_array(np.array(reshape_to, np.int64), "target"))
        nodes += [helper.make_node("Abs", ["target"], ["shape"], name="abs"),
                  helper.make_node("Reshape", ["c", "shape"], ["y"], name="flatten_for_10")]
        out_dims = [None] * len(reshape_to)
    else:
        nodes[0].output[0] = "y"
    graph = helper.make_graph(nodes, "placeholder",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [10, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_dims)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    onnx.checker.check_model(model)
    return model


def test_a_full_shape_overrides_placeholder_static_dims_with_a_note() -> None:
    from npukit.frontend.shapes import InputShapeOverride

    model = _placeholder_conv()
    with pytest.warns(InputShapeOverride, match=r"x axis 0: 10 -> 1; x axis 2: 8 -> 48; x axis 3: 8 -> 64"):
        fixed = apply_input_spec(model, InputSpec.parse("1,3,48,64"))
    assert input_dims(fixed) == {"x": (1, 3, 48, 64)}
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 48, 64]  # re-inferred
    assert run(make_session(fixed), {"x": np.zeros((1, 3, 48, 64), np.float32)})[0].shape == (1, 4, 48, 64)
    with pytest.raises(InputError, match="axis 0 is fixed to 10"):
        InputSpec.parse("1,3,48,64").resolve(model, override_static=False)


def test_a_model_that_cannot_run_at_the_overridden_shape_names_the_failing_node() -> None:
    with pytest.raises(InputError) as info:  # shape inference passes; ORT's run finds the baked-in size
        apply_input_spec(_placeholder_conv(reshape_to=[10, 256]), InputSpec.parse("1,3,8,8"))
    text = info.value.one_line()
    assert "\n" not in text and "x axis 0: 10 -> 1" in text and "node 'flatten_for_10' (Reshape) fails" in text
    with pytest.raises(InputError) as info:  # shape inference itself fails: the node is found and shown with inputs
        apply_input_spec(_unnamed_add(), InputSpec.parse("2,3,8,8"))
    assert "node #1 (Add, unnamed) fails on inputs 'c' 2x4x8x8, 'bias' 10x4x8x8" in info.value.one_line()


def test_a_symbolic_size_the_model_cannot_run_at_names_the_failing_node() -> None:
    """Silero VAD's 'sequence' given 100 (its STFT Conv needs more) passed shape inference, then optimize-graph's
    check met ORT's error as an internal error (exit 1); a size it runs at is kept as before, with no override
    note."""
    weight = numpy_helper.from_array(np.ones((1, 1, 8), np.float32), "w")
    to_3d = numpy_helper.from_array(np.array([1, 1, -1], np.int64), "s")
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["r"]),
                               helper.make_node("Conv", ["r", "w"], ["y"], name="conv")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "T"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight, to_3d])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputError) as info:
        fix_inputs(model, "x=1,4")
    text = info.value.one_line()
    assert "the model does not run at input shape x=1,4 (sizes given: x axis 1: T -> 4): node 'conv' (Conv) " \
        "fails" in text, text
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fixed = fix_inputs(model, "x=1,16")
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [1, 1, 9]


def _unnamed_add() -> onnx.ModelProto:
    """Conv(x) + a bias of the placeholder's size [10, 4, 8, 8], nodes unnamed (CenterFace's are)."""
    model = _placeholder_conv()
    model.graph.node[0].name = ""
    model.graph.node[0].output[0] = "c"
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((10, 4, 8, 8), np.float32), "bias"))
    model.graph.node.append(helper.make_node("Add", ["c", "bias"], ["y"]))
    return model


@pytest.mark.parametrize("batch", ["batch", "?", None])
def test_keep_batch_keeps_an_unknown_batch_symbolic(batch) -> None:
    """Paddle2ONNX's batch is -1 (an unnamed dim): with the other sizes given, a server still batches on it."""
    fixed = fix_inputs(_contrib_gelu([batch, 3, "?", "?"]), "1,3,8,8", keep_batch=True)
    dims = input_dims(fixed)["x"]
    assert not isinstance(dims[0], int) and dims[1:] == (3, 8, 8)
    assert input_dims(fix_inputs(_contrib_gelu([batch, 3, "?", "?"]), "1,3,8,8"))["x"] == (1, 3, 8, 8)



def test_a_kept_batch_stays_symbolic_in_the_outputs_inference_cannot_shape() -> None:
    """RetinaFace with --input-shape 1,3,480,640 for serving: the input kept its symbolic batch, but its outputs
    (which shape inference cannot follow) were declared with batch 1, and every bound batched run failed."""
    fixed = fix_inputs(_contrib_gelu(["batch_size", 3, "h", "w"]), "1,3,8,8", keep_batch=True)
    dims = [d.dim_param or d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch_size", 3, 8, 8]
    pinned = fix_inputs(_contrib_gelu(["batch_size", 3, "h", "w"]), "1,3,8,8")
    assert [d.dim_param or d.dim_value for d in pinned.graph.output[0].type.tensor_type.shape.dim] == [1, 3, 8, 8]
