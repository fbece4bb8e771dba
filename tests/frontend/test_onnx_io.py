"""load_onnx's errors, save_onnx (single file and external data), fix_input_shape."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npukit.errors import InputError
from npukit.frontend import onnx_io
from npukit.frontend.onnx_io import load_onnx, named_nodes, save_onnx, static_input_shape
from npukit.frontend.shapes import fix_input_shape
from npukit.runtime.ort import make_session, run

from .conftest import make_matmul_model


def test_load_valid(matmul_onnx: Path) -> None:
    model = load_onnx(matmul_onnx)
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Add", "Relu"]
    assert static_input_shape(model) == (1, 4)


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"hello, this is a text file\n", "is a text file, not an ONNX model"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(256)), "is a JPEG image"),
        (b"PK\x03\x04" + bytes(64), "zip archive"),
        (b"", "is empty"),
        (b"<\x00\x00\x00ET12eh00 \x00\x00\x00" + bytes(64), "is an ExecuTorch program"),  # compile's .pte
        (b"\x1c\x00\x00\x00TFL3\x14\x00 \x00" + bytes(64), "is a LiteRT"),  # compile's .tflite
    ],
)
def test_load_not_onnx(tmp_path: Path, content: bytes, expected: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(InputError, match=expected):
        load_onnx(path)


def test_load_missing_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_onnx(tmp_path / "nope.onnx")
    with pytest.raises(InputError, match="is a directory"):
        load_onnx(tmp_path)


@pytest.mark.parametrize("keep", [0.5, 0.93])
def test_load_truncated(tmp_path: Path, matmul_onnx: Path, keep: float) -> None:
    data = matmul_onnx.read_bytes()
    path = tmp_path / "truncated.onnx"
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InputError, match="truncated or corrupt") as info:
        load_onnx(path)
    assert "\n" not in info.value.one_line()


def test_load_checker_failure(tmp_path: Path) -> None:
    model = make_matmul_model()
    model.graph.node[2].input[0] = "undefined_tensor"
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(InputError, match="fails the ONNX checker: .*undefined_tensor"):
        load_onnx(path)


def test_save_single_file(tmp_path: Path) -> None:
    out = save_onnx(make_matmul_model(), tmp_path / "sub" / "m.onnx")
    assert out.is_file() and not (tmp_path / "sub" / "m.onnx.data").exists()
    assert sorted(p.name for p in out.parent.iterdir()) == ["m.onnx"]  # no temp files left
    onnx.checker.check_model(str(out))


def test_save_external_data_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_io, "SINGLE_FILE_LIMIT_BYTES", 0)  # as if the weights were over 2 GB
    original = make_matmul_model(width=256)  # tensors over ir.save's 256-byte inline threshold
    out = save_onnx(original, tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx.data").is_file()
    raw = onnx.load(out, load_external_data=False)
    assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in raw.graph.initializer)
    loaded = load_onnx(out)
    for before, after in zip(original.graph.initializer, loaded.graph.initializer):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(before), onnx.numpy_helper.to_array(after))
    (tmp_path / "big.onnx.data").unlink()
    with pytest.raises(InputError, match="external data file 'big.onnx.data' .* is missing"):
        load_onnx(out)


def test_fix_input_shape_static_and_dynamic() -> None:
    model = make_matmul_model()
    fixed = fix_input_shape(model, (5, 4), dynamic_batch=False)
    dims = fixed.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [5, 4]
    assert [d.dim_value for d in fixed.graph.output[0].type.tensor_type.shape.dim] == [5, 3]
    onnx.checker.check_model(fixed, full_check=True)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(run(make_session(fixed), {"x": x})[0], run(make_session(model), {"x": x})[0],
                               rtol=0, atol=1e-6)

    dynamic = fix_input_shape(make_matmul_model(batch=1), (1, 4), dynamic_batch=True)
    assert dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    x3 = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    assert run(make_session(dynamic), {"x": x3})[0].shape == (3, 3)


def test_fix_input_shape_wrong_rank_and_misfit() -> None:
    with pytest.raises(InputError, match="has rank 3 but input 'x' of the model has rank 2"):
        fix_input_shape(make_matmul_model(), (1, 4, 1), dynamic_batch=False)
    with pytest.raises(InputError, match=r"input shape 1,7 does not fit the model"):
        fix_input_shape(make_matmul_model(), (1, 7), dynamic_batch=False)


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=1, max_size=512))
def test_load_arbitrary_bytes_is_input_error(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    path.write_bytes(data)
    with pytest.raises(InputError):
        load_onnx(path)


def test_named_nodes_names_the_unnamed_and_the_repeated_without_clashing() -> None:
    helper, TensorProto = onnx.helper, onnx.TensorProto
    nodes = [helper.make_node("Relu", ["x"], ["a"]),  # unnamed: Relu_0
             helper.make_node("Relu", ["a"], ["b"], name="Relu_2"),  # taken: the unnamed third becomes Relu_2_1
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("Relu", ["c"], ["d"], name="Relu_2")]  # repeated: renamed Relu_3
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [1])], [value("d", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph)
    named = named_nodes(model)
    assert [n.name for n in named.graph.node] == ["Relu_0", "Relu_2", "Relu_2_1", "Relu_3"]
    assert [n.name for n in model.graph.node] == ["", "Relu_2", "", "Relu_2"]  # the input is left as it was
    assert named_nodes(named) is named


def test_saved_models_declare_only_the_opsets_their_nodes_use(tmp_path) -> None:
    """prune's and substitute's artifacts declared 8 opset domains no node used (a torch export's
    org.pytorch.aten, ai.onnx.preview.training, ...)."""
    import onnx
    from onnx import TensorProto, helper

    from npukit.frontend.onnx_io import save_onnx

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("org.pytorch.aten", 1),
                                                    helper.make_opsetid("ai.onnx.preview.training", 1)])
    save_onnx(model, tmp_path / "m.onnx")
    assert [(o.domain, o.version) for o in onnx.load(tmp_path / "m.onnx").opset_import] == [("", 17)]
