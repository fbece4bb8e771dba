"""Model size: file bytes with external data, serialized bytes, stored tensor bytes by dtype."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.measure.size import model_size


def _model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16])],
        [numpy_helper.from_array(np.ones((16, 16), dtype=np.float32), "w"),
         numpy_helper.from_array(np.array([16], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model


def test_sizes_in_memory_and_on_disk(tmp_path) -> None:
    model = _model()
    mem = model_size(model)
    assert mem.file_bytes is None
    assert mem.serialized_bytes == model.ByteSize()
    assert mem.weights_bytes_by_dtype == {"float32": 16 * 16 * 4, "int64": 8}
    assert mem.weights_bytes == 16 * 16 * 4 + 8
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    disk = model_size(path)
    assert disk.file_bytes == path.stat().st_size and disk.external_data_bytes == 0
    assert model_size(path.read_bytes()).serialized_bytes == disk.serialized_bytes


def test_external_data_counts_in_the_file_size(tmp_path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save(_model(), path, save_as_external_data=True, all_tensors_to_one_file=True, location="ext.bin",
              size_threshold=0)
    result = model_size(path)
    ext = (tmp_path / "ext.bin").stat().st_size
    assert result.external_data_bytes == ext >= 16 * 16 * 4
    assert result.file_bytes == path.stat().st_size + ext
    assert result.serialized_bytes < 16 * 16 * 4  # weights live outside the protobuf
    assert result.weights_bytes_by_dtype["float32"] == 16 * 16 * 4


def test_bad_paths(tmp_path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        model_size(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\x00not a model")
    with pytest.raises(InputError, match="not an ONNX model"):
        model_size(bad)
