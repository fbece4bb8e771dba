"""runtime.session_cache: ORT's optimized graph on disk, keyed by a model's bytes or by its file's path and time."""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.runtime.ort import make_session
from npukit.runtime.session_cache import cached_session

X = {"x": np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)}


def _model(seed: int) -> onnx.ModelProto:
    """x[1, 3, 8, 8] -> Conv 3x3 (3->4, weights by ``seed``) -> Relu -> y."""
    w = numpy_helper.from_array(np.random.default_rng(seed).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["c"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _answer(model: onnx.ModelProto) -> np.ndarray:
    return make_session(model).run(None, X)[0]


def test_a_file_is_keyed_by_its_path_and_time_and_a_rewritten_file_is_optimized_again(tmp_path) -> None:
    model, cache = tmp_path / "m.onnx", tmp_path / "cache"
    onnx.save(_model(0), model)
    first, state, _ = cached_session(model, threads=1, cache_dir=cache)
    assert state == "miss"
    again, state, entry = cached_session(str(model), threads=1, cache_dir=cache)
    assert state == "hit" and entry.name.endswith(".optimized.onnx")
    np.testing.assert_array_equal(again.run(None, X)[0], first.run(None, X)[0])
    np.testing.assert_allclose(first.run(None, X)[0], _answer(_model(0)), rtol=1e-5, atol=1e-6)
    onnx.save(_model(1), model)  # the same size: another time
    os.utime(model, ns=(entry.stat().st_mtime_ns + 10**9,) * 2)
    rewritten, state, _ = cached_session(model, threads=1, cache_dir=cache)
    assert state == "miss"
    np.testing.assert_allclose(rewritten.run(None, X)[0], _answer(_model(1)), rtol=1e-5, atol=1e-6)


def test_new_external_data_beside_an_unchanged_file_is_optimized_again(tmp_path) -> None:
    """The weights of a model saved with external data live in another file: rewriting that file alone must not
    start from the old weights' optimized graph."""
    model, cache = tmp_path / "m.onnx", tmp_path / "cache"
    onnx.save(_model(0), model, save_as_external_data=True, location="m.data", size_threshold=0)
    _, state, _ = cached_session(model, threads=1, cache_dir=cache)
    _, state_again, _ = cached_session(model, threads=1, cache_dir=cache)
    assert (state, state_again) == ("miss", "hit")
    stamp = os.stat(model).st_mtime_ns
    (tmp_path / "m.data").write_bytes(numpy_helper.to_array(_model(1).graph.initializer[0]).tobytes())  # w alone
    os.utime(model, ns=(stamp, stamp))  # m.onnx as it was: only m.data is new
    session, state, _ = cached_session(model, threads=1, cache_dir=cache)
    assert state == "miss"
    np.testing.assert_allclose(session.run(None, X)[0], _answer(_model(1)), rtol=1e-5, atol=1e-6)


def test_bytes_are_keyed_by_their_hash(tmp_path) -> None:
    data = _model(0).SerializeToString()
    assert [cached_session(data, threads=1, cache_dir=tmp_path)[1] for _ in range(2)] == ["miss", "hit"]
    assert cached_session(_model(1).SerializeToString(), threads=1, cache_dir=tmp_path)[1] == "miss"
    assert len(list(tmp_path.iterdir())) == 2  # one entry each, nothing beside them
