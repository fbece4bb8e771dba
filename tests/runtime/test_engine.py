"""The serving runtime: same outputs as a plain session, batching, bound buffers, bad requests, back-pressure, close."""

from __future__ import annotations

import platform
import threading
import time
from concurrent.futures import Future

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.measure.load import closed_loop, open_loop
from npukit.runtime.engine import Overloaded, Runtime, RuntimeConfig
from npukit.runtime.ort import make_session
from npukit.runtime.pool import BoundBuffers


def _model(batch: int | str = "n") -> onnx.ModelProto:
    """x[batch, 3, 8, 8] -> Conv 3x3 (3->4) -> Relu -> GlobalAveragePool -> Flatten -> y[batch, 4]."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
             helper.make_node("Flatten", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _requests(n: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


def _plain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    return make_session(model).run(None, feeds)[0]


@pytest.mark.parametrize("pool", [True, False])
def test_the_runtime_answers_what_a_plain_session_answers(pool: bool) -> None:
    model = _model()
    requests = _requests(12)
    with Runtime(model, device="cpu", workers=2, threads=1, pool=pool) as rt:
        futures = [rt.submit(r) for r in requests]
        for r, f in zip(requests, futures):
            np.testing.assert_array_equal(f.result()[0], _plain(model, r))
        np.testing.assert_array_equal(np.concatenate([y[0] for y in rt.map(requests)]),
                                      np.concatenate([_plain(model, r) for r in requests]))  # in order
    assert not [t for t in threading.enumerate() if t.name.startswith("npukit-runtime")]  # close joined them


def test_requests_arriving_together_run_as_one_batch_and_each_caller_gets_its_rows() -> None:
    model = _model()
    requests = _requests(8)
    with Runtime(model, device="cpu", workers=1, threads=1, max_batch=4, max_wait_ms=200.0) as rt:
        futures = [rt.submit(r) for r in requests]
        results = [f.result()[0] for f in futures]
        batches = dict(rt.batch_sizes)
    assert max(batches) > 1 and sum(k * v for k, v in batches.items()) == 8
    for r, y in zip(requests, results):
        np.testing.assert_allclose(y, _plain(model, r), rtol=1e-5, atol=1e-6)


def test_a_fixed_batch_axis_turns_batching_off_and_says_why() -> None:
    with Runtime(_model(batch=1), device="cpu", workers=1, max_batch=4) as rt:
        assert rt.config.max_batch == 1 and "not a symbolic batch in 'x' (axis 0 is 1)" in rt.batching_note
        np.testing.assert_array_equal(rt.run(_requests(1)[0])[0], _plain(_model(batch=1), _requests(1)[0]))


def test_symbolic_sizes_are_fixed_by_input_shape_and_the_refusal_says_how() -> None:
    """A detector's [batch, 3, height, width]: refused with the flag and the Python argument to pass; served with
    input_shape (the batch stays symbolic, so requests still batch); a one-input model takes an array alone, and a
    request of another kind fails alone with a one-line InputError."""
    model = _model()
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "height"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "width"
    with pytest.raises(InputError) as info:
        Runtime(model, device="cpu", workers=1)
    assert "--input-shape x=1,3,N,N" in info.value.hint and "input_shape='x=1,3,N,N'" in info.value.hint
    request = _requests(1)[0]
    with Runtime(model, device="cpu", workers=1, max_batch=2, input_shape="x=1,3,8,8") as rt:
        assert rt.config.max_batch == 2 and not rt.batching_note
        np.testing.assert_allclose(rt.run(request["x"])[0], _plain(_model(), request), rtol=1e-5, atol=1e-6)
        with pytest.raises(InputError, match="a request is a dict of input name -> numpy array .* not a list"):
            rt.run([request["x"]])


def test_batching_off_names_each_input_without_a_batch_axis() -> None:
    """Silero VAD's inputs: audio [batch, sequence] batches; its state [2, batch, 128] and the scalar rate do not."""
    from npukit.runtime.engine import batching_off
    from npukit.runtime.pool import InputSignature

    audio = InputSignature("input", np.dtype(np.float32), (None, None))
    state = InputSignature("state", np.dtype(np.float32), (2, None, 128))
    rate = InputSignature("sr", np.dtype(np.int64), ())
    assert batching_off([audio], 4) == "" and batching_off([audio, state, rate], 1) == ""
    note = batching_off([audio, state, rate], 4)
    assert "not a symbolic batch in 'state' (axis 0 is 2), 'sr' (a scalar)" in note and "'input'" not in note


def _baked_batch() -> onnx.ModelProto:
    """x[n, 3, 4] -> Relu -> Reshape to the constant [1, -1, 4]: a symbolic batch whose graph keeps a batch of 1
    inside, as YOLOX's and PicoDet's exports do (their --dynamic-batch copies)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])]
    graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "k", 4])],
                              [numpy_helper.from_array(np.array([1, -1, 4], np.int64), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_outputs_that_do_not_follow_the_batch_turn_batching_off() -> None:
    """Four such requests batched gave one request all four results and the others empty arrays, no error."""
    model = _baked_batch()
    rng = np.random.default_rng(2)
    requests = [{"x": rng.standard_normal((1, 3, 4)).astype(np.float32)} for _ in range(6)]
    with Runtime(model, device="cpu", workers=1, threads=1, max_batch=4, max_wait_ms=100.0) as rt:
        assert rt.config.max_batch == 1 and "keeps a batch of 1 inside" in rt.batching_note
        for r, f in zip(requests, [rt.submit(r) for r in requests]):
            np.testing.assert_array_equal(f.result()[0], _plain(model, r))


def test_a_batch_whose_outputs_do_not_have_one_row_per_request_is_run_one_at_a_time(monkeypatch) -> None:
    """Where the start-up probe cannot tell (outputs whose row count depends on the data), a batch whose outputs
    lack one row per request is answered request by request, never sliced into empty or merged results."""
    import npukit.runtime.engine as engine

    monkeypatch.setattr(engine, "batch_mismatch", lambda *args, **kwargs: "")
    model = _baked_batch()
    rng = np.random.default_rng(3)
    requests = [{"x": rng.standard_normal((1, 3, 4)).astype(np.float32)} for _ in range(6)]
    with Runtime(model, device="cpu", workers=1, threads=1, max_batch=4, max_wait_ms=200.0) as rt:
        results = [f.result()[0] for f in [rt.submit(r) for r in requests]]
        assert max(rt.batch_sizes) > 1
    for r, y in zip(requests, results):
        np.testing.assert_array_equal(y, _plain(model, r))


def test_a_bad_request_fails_alone_and_the_runtime_keeps_serving() -> None:
    good = _requests(1)[0]
    with Runtime(_model(), device="cpu", workers=1) as rt:
        wrong = {"has shape [1, 2, 8, 8]": {"x": good["x"][:, :2]}, "is float64": {"x": good["x"].astype(np.float64)},
                 "names inputs ['input']": {"input": good["x"]}}
        for said, feeds in wrong.items():
            error = rt.submit(feeds).exception()
            assert isinstance(error, InputError) and said in error.message
        np.testing.assert_array_equal(rt.run(good)[0], _plain(_model(), good))


def test_a_full_queue_refuses_and_close_without_drain_cancels_what_waits(monkeypatch) -> None:
    release = threading.Event()
    rt = Runtime(_model(), device="cpu", workers=1, queue_limit=1)
    original = rt._run
    monkeypatch.setattr(rt, "_run", lambda slot, batch: (release.wait(5), original(slot, batch))[1])
    request = _requests(1)[0]
    running = rt.submit(request)
    deadline = time.time() + 5
    while rt._queue.qsize() and time.time() < deadline:  # the worker took the first request
        time.sleep(0.01)
    waiting = rt.submit(request)
    with pytest.raises(Overloaded, match="queue_limit"):
        rt.submit(request)
    closer = threading.Thread(target=rt.close, kwargs={"drain": False})
    closer.start()
    release.set()
    closer.join(5)
    assert not closer.is_alive() and running.result(5) and waiting.cancelled()
    with pytest.raises(RuntimeError, match="closed"):
        rt.submit(request)
    with pytest.raises(RuntimeError, match="closed"):  # a bad request too (was a failed future: "wrong shape")
        rt.submit({"x": np.zeros((2, 2), np.float32)})


def test_bound_buffers_are_reused_and_follow_new_inputs() -> None:
    model = _model(batch=1)
    session = make_session(model)
    buffers = BoundBuffers(session, {"x": (1, 3, 8, 8)})
    a, b = _requests(2)
    first = buffers.run(a)
    np.testing.assert_array_equal(first[0], _plain(model, a))
    second = buffers.run(b)
    assert second[0] is first[0]  # the same bound array, overwritten
    np.testing.assert_array_equal(second[0], _plain(model, b))


def test_results_go_into_the_callers_arrays() -> None:
    request = _requests(1)[0]
    out = [np.empty((1, 4), np.float32)]
    with Runtime(_model(), device="cpu", workers=1) as rt:
        got = rt.run(request, out=out)
    assert got[0] is out[0]
    np.testing.assert_array_equal(out[0], _plain(_model(), request))


def test_a_wrong_out_array_fails_its_request_alone_and_the_runtime_keeps_serving() -> None:
    """out= of the wrong shape raised inside the worker thread, which died: that future and every later one hung."""
    request = _requests(1)[0]
    with Runtime(_model(), device="cpu", workers=1) as rt:
        error = rt.submit(request, out=[np.empty((3,), np.float32)]).exception(5)
        assert isinstance(error, InputError) and "out[0] is float32 [3], output 'y' is float32 [1, 4]" in error.message
        assert "one per output" in rt.submit(request, out=np.empty((1, 4), np.float32)).exception(5).message
        np.testing.assert_array_equal(rt.run(request)[0], _plain(_model(), request))  # the worker still serves
        # a read-only array of the right shape killed the worker in np.copyto: every later request hung
        frozen = np.empty((1, 4), np.float32)
        frozen.setflags(write=False)
        assert "out[0] is read-only" in rt.submit(request, out=[frozen]).exception(5).message
        np.testing.assert_array_equal(rt.run(request)[0], _plain(_model(), request))


def test_queue_waits_are_kept_for_the_last_requests_only(monkeypatch) -> None:
    """Every request's queue wait was kept: 200,000 requests grew the process by 29 MB, and describe() took the
    percentiles of them all."""
    from npukit.runtime import engine

    monkeypatch.setattr(engine, "WAITS_KEPT", 5)
    with Runtime(_model(), device="cpu", workers=1) as rt:
        for result in rt.map(_requests(12)):
            assert result[0].shape == (1, 4)
        assert rt.describe()["queue_wait_ms"]["of_last"] == 5 and sum(rt.batch_sizes.values()) == 12
    # map's in_flight above queue_limit raised Overloaded part-way, with requests still queued: capped
    with Runtime(_model(), device="cpu", workers=1, queue_limit=2) as rt:
        assert len(list(rt.map(_requests(20), in_flight=50))) == 20


def test_an_output_declared_with_batch_1_turns_batching_off_before_any_request_fails() -> None:
    """RetinaFace with --input-shape: the input kept a symbolic batch, its outputs were declared with batch 1; a
    plain run ignores that, a bound run refuses it, so every batched request failed (and serve-bench exited 0)."""
    model = _model()
    model.graph.output[0].type.tensor_type.shape.dim[0].Clear()
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 1
    requests = _requests(6)
    with Runtime(model, device="cpu", workers=1, threads=1, max_batch=4, max_wait_ms=50.0) as rt:
        assert rt.config.max_batch == 1 and "bound to 2 requests at once does not run" in rt.batching_note
        for r, f in zip(requests, [rt.submit(r) for r in requests]):
            np.testing.assert_array_equal(f.result(5)[0], _plain(_model(), r))


def test_map_never_overloads_its_own_queue() -> None:
    requests = _requests(20)
    with Runtime(_model(), device="cpu", workers=1, threads=1, max_batch=4, queue_limit=2) as rt:
        assert len(list(rt.map(requests))) == 20


def test_a_failed_request_s_error_is_kept_by_the_load_generators() -> None:
    def call(feeds):
        raise ValueError("bound output of the wrong shape\nmore")

    closed = closed_loop(call, _requests(1), clients=1, duration_s=0.05)
    assert closed.failed > 0 and closed.completed == 0
    assert closed.first_error == "ValueError: bound output of the wrong shape"

    def submit(feeds):
        future = Future()
        future.set_exception(RuntimeError("no"))
        return future

    opened = open_loop(submit, _requests(1), rate=200.0, duration_s=0.05)
    assert opened.failed == opened.sent > 0 and opened.first_error == "RuntimeError: no"


def test_config_errors_are_input_errors() -> None:
    for bad in ({"device": "gpu"}, {"workers": 0}, {"max_batch": 0}, {"max_wait_ms": -1}, {"queue_limit": 0},
                {"device": "cpu@SM8650"}):
        with pytest.raises(InputError):
            RuntimeConfig(**bad)


@pytest.mark.skipif(platform.machine().lower() in ("aarch64", "arm64"), reason="on Arm the HTP may be real")
def test_auto_takes_the_cpu_on_x86_and_says_why() -> None:
    with Runtime(_model(), device="auto", workers=1) as rt:
        assert rt.device.device == "cpu" and rt.device.reason


def test_load_generators_count_what_happened() -> None:
    requests = _requests(4)
    with Runtime(_model(), device="cpu", workers=2) as rt:
        closed = closed_loop(rt.run, requests, clients=2, duration_s=0.3)
        opened = open_loop(rt.submit, requests, rate=200.0, duration_s=0.3)
    assert closed.completed > 0 and closed.failed == 0 and closed.latency_ms["p50"] > 0
    assert opened.completed > 0 and opened.refused == 0 and opened.sent == opened.completed + opened.failed

    def refusing(_feeds):
        raise Overloaded("full")

    refused = open_loop(refusing, requests, rate=200.0, duration_s=0.2, refused=Overloaded)
    assert refused.completed == 0 and refused.refused > 0 and refused.sent == refused.refused

    def slow_to_submit(_feeds):  # the generator's own work: it cannot offer 1000/s at 10 ms a request
        import time
        from concurrent.futures import Future

        time.sleep(0.01)
        done: Future = Future()
        done.set_result(None)
        return done

    late = open_loop(slow_to_submit, requests, rate=1000.0, duration_s=0.2)
    assert late.behind_s > 0.5 * late.seconds  # said, so the report can tell the client's limit from the server's
    assert open_loop(slow_to_submit, requests, rate=5.0, duration_s=0.4).behind_s < 0.05


def test_a_cached_optimized_graph_gives_the_same_answers(tmp_path) -> None:
    request = _requests(1)[0]
    with Runtime(_model(), device="cpu", workers=1, cache_dir=str(tmp_path)) as first:
        assert first.cache == "miss"
        want = first.run(request)[0]
    (cached,) = tmp_path.iterdir()  # one file, nothing half-written beside it
    assert cached.name.endswith(".optimized.onnx")
    with Runtime(_model(), device="cpu", workers=1, cache_dir=str(tmp_path)) as second:
        assert second.cache == "hit"
        np.testing.assert_array_equal(second.run(request)[0], want)
    np.testing.assert_allclose(want, _plain(_model(), request), rtol=1e-6)


def _any_size_model() -> onnx.ModelProto:
    """_model() with symbolic height and width (a fully convolutional net with a global pool)."""
    model = _model()
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "h", "w"
    return model


def test_buckets_match_per_size_sessions_and_pad_what_is_smaller() -> None:
    from npukit.frontend.shapes import fix_input_shape
    from npukit.runtime.buckets import BucketedRuntime

    model = _any_size_model()
    buckets = [(1, 3, 16, 16), (1, 3, 8, 8), (1, 3, 12, 12)]
    rng = np.random.default_rng(3)
    with BucketedRuntime(model, buckets, device="cpu", workers=1) as rt:
        assert list(rt.runtimes) == [(1, 3, 8, 8), (1, 3, 12, 12), (1, 3, 16, 16)]  # smallest first
        for shape in buckets:  # a request of a bucket's own size: exactly what a session at that size gives
            x = rng.standard_normal(shape).astype(np.float32)
            want = make_session(fix_input_shape(model, shape, dynamic_batch=False)).run(None, {"x": x})[0]
            np.testing.assert_array_equal(rt.run({"x": x})[0], want)
        small = rng.standard_normal((1, 3, 10, 9)).astype(np.float32)
        padded = np.zeros((1, 3, 12, 12), np.float32)
        padded[:, :, :10, :9] = small
        want = make_session(fix_input_shape(model, (1, 3, 12, 12), dynamic_batch=False)).run(None, {"x": padded})[0]
        np.testing.assert_array_equal(rt.run({"x": small})[0], want)
        assert rt.padding[-1] == pytest.approx(1 - 90 / 144)
        mixed = [{"x": rng.standard_normal(s).astype(np.float32)} for s in [(1, 3, 16, 16), (1, 3, 8, 8)] * 3]
        assert [y[0].shape for y in rt.map(mixed, in_flight=2)] == [(1, 4)] * 6
        too_big = rt.submit({"x": np.zeros((1, 3, 20, 8), np.float32)}).exception()
        assert isinstance(too_big, InputError) and "no bucket" in too_big.message
    with BucketedRuntime(model, [(1, 3, 8, 8)], device="cpu", workers=1, fit="exact") as exact:
        assert isinstance(exact.submit({"x": np.zeros((1, 3, 6, 6), np.float32)}).exception(), InputError)


def _map_model() -> onnx.ModelProto:
    """x[1, 3, h, w] -> Conv 3x3 (pad 1) -> Relu -> y[1, 4, h, w], and -> MaxPool 2x2 -> z[1, 4, h/2, w/2], and
    -> GlobalAveragePool -> Flatten -> g[1, 4]: maps at the input's resolution and at half of it, and scores."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("MaxPool", ["y"], ["z"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["y"], ["p"]), helper.make_node("Flatten", ["p"], ["g"])]
    info = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "maps", [info("x", TensorProto.FLOAT, [1, 3, "h", "w"])],
                              [info("y", TensorProto.FLOAT, [1, 4, "h", "w"]),
                               info("z", TensorProto.FLOAT, [1, 4, "h2", "w2"]), info("g", TensorProto.FLOAT, [1, 4])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_padded_request_gets_its_maps_cropped_back_to_its_size() -> None:
    """A 10x6 request padded into a 16x16 bucket: the full-resolution map comes back 10x6 and the half-resolution
    one 5x3, equal to a session at 10x6 (a zero-padded conv sees the same zeros); the pooled scores come back as the
    bucket gives them (averaged over the padding too: what measure_buckets reports); ``out`` buffers stay whole."""
    from npukit.frontend.shapes import fix_input_shape
    from npukit.runtime.buckets import BucketedRuntime, crop_maps

    model = _map_model()
    x = np.random.default_rng(4).standard_normal((1, 3, 10, 6)).astype(np.float32)
    alone = make_session(fix_input_shape(model, (1, 3, 10, 6), dynamic_batch=False)).run(None, {"x": x})
    with BucketedRuntime(model, [(1, 3, 16, 16)], device="cpu", workers=1) as rt:
        y, z, g = rt.run({"x": x})
        assert y.shape == (1, 4, 10, 6) and z.shape == (1, 4, 5, 3) and g.shape == (1, 4)
        np.testing.assert_allclose(y, alone[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(z, alone[1], rtol=1e-6, atol=1e-6)
        assert not np.allclose(g, alone[2])
        out = [np.empty((1, 4, 16, 16), np.float32), np.empty((1, 4, 8, 8), np.float32), np.empty((1, 4), np.float32)]
        assert rt.run({"x": x}, out=out)[0].shape == (1, 4, 16, 16)
    assert [o.shape for o in crop_maps([np.zeros((1, 4, 16, 16)), np.zeros((1, 4, 6, 16))], (10, 6), (16, 16))] \
        == [(1, 4, 10, 6), (1, 4, 6, 16)]  # 16/6 is no integer stride: left whole


def test_a_fixed_batch_of_two_comes_back_whole() -> None:
    model = _model(batch=2)
    rng = np.random.default_rng(5)
    request = {"x": rng.standard_normal((2, 3, 8, 8)).astype(np.float32)}
    out = [np.empty((2, 4), np.float32)]
    with Runtime(model, device="cpu", workers=1) as rt:
        np.testing.assert_array_equal(rt.run(request)[0], _plain(model, request))
        np.testing.assert_array_equal(rt.run(request, out=out)[0], _plain(model, request))


def test_the_split_of_the_cores_is_measured_when_not_given(monkeypatch) -> None:
    from npukit.runtime import split

    assert split.candidates(2) == [(2, 1), (1, 2)] and split.candidates(6) == [(6, 1), (3, 2), (2, 3), (1, 6)]
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with Runtime(_model(), device="cpu") as rt:
        table = rt.describe()["split"]["measured"]
        assert [(r["workers"], r["threads"]) for r in table] == [(2, 1), (1, 2)]
        best = max(table, key=lambda r: r["runs_per_s"])
        assert (rt.config.workers, rt.config.threads) == (best["workers"], best["threads"])
        assert rt.split_note.startswith("measured")
        np.testing.assert_array_equal(rt.run(_requests(1)[0])[0], _plain(_model(), _requests(1)[0]))
    with Runtime(_model(), device="cpu", threads=2) as given:
        assert (given.config.workers, given.config.threads) == (1, 2) and given.split_note == "given"
    with Runtime(_model(), device="cpu", prefer="latency") as fast:  # the split whose lone request is fastest
        table = fast.describe()["split"]["measured"]
        quickest = min(r["latency_ms"] for r in table)
        picked = next(r for r in table if (r["workers"], r["threads"]) == (fast.config.workers, fast.config.threads))
        assert picked["latency_ms"] <= quickest * 1.05 and fast.split_note.startswith("measured for latency")


def test_latency_first_takes_the_fastest_request_and_ties_go_to_throughput() -> None:
    from npukit.runtime.split import Split, choose

    table = [Split(4, 1, 400.0, 10.0), Split(2, 2, 300.0, 5.2), Split(1, 4, 150.0, 5.0)]
    assert choose(table, "throughput") == table[0]
    assert choose(table, "latency") == table[1]  # within 5% of the fastest request, and twice the throughput
    assert choose([Split(2, 1, 200.0, 9.0), Split(1, 2, 120.0, 5.0)], "latency").threads == 2
    with pytest.raises(InputError, match="prefer must be throughput or latency"):
        RuntimeConfig(device="cpu", prefer="fast")


def test_a_missing_model_is_a_one_line_input_error(tmp_path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        Runtime(tmp_path / "nope.onnx", device="cpu", workers=1)


def test_runtimes_on_one_device_share_its_concurrency_limit() -> None:
    """Two runtimes (two workers each) on a device limited to one graph at a time never run at once; without the
    limit they do. The limit is the device's while a runtime has it open: another limit meanwhile is refused, and
    it is free again once they close."""
    model, intervals, guard = _model(), [], threading.Lock()

    def slow(runtime: Runtime) -> None:
        run = runtime.session.run

        def timed(*args, **kwargs):
            start = time.perf_counter()
            time.sleep(0.01)  # long enough that two unlimited workers overlap
            out = run(*args, **kwargs)
            with guard:
                intervals.append((start, time.perf_counter()))
            return out
        runtime.session.run = timed

    def overlaps() -> int:
        spans = sorted(intervals)
        return sum(b[0] < a[1] for a, b in zip(spans, spans[1:]))

    for limit, expect_overlap in ((1, False), (None, True)):
        intervals.clear()
        with Runtime(model, device="cpu", workers=2, threads=1, pool=False, device_concurrency=limit) as first, \
                Runtime(model, device="cpu", workers=2, threads=1, pool=False) as second:
            assert first.gate is second.gate and first.describe()["device_concurrency"] == limit
            slow(first), slow(second)
            futures = [rt.submit(r) for r in _requests(12) for rt in (first, second)]
            for f in futures:
                f.result(timeout=30)
            if limit is not None:
                with pytest.raises(InputError, match="already runs at most 1 graph"):
                    Runtime(model, device="cpu", workers=1, device_concurrency=2)
        assert len(intervals) == 24
        assert (overlaps() > 0) == expect_overlap, (limit, overlaps())
    with Runtime(model, device="cpu", workers=1, device_concurrency=2) as later:  # both closed: a new limit
        assert later.gate.limit == 2
    with pytest.raises(InputError, match="device_concurrency must be at least 1"):
        RuntimeConfig(device="cpu", device_concurrency=0)


def test_a_damaged_cache_entry_is_made_again_and_a_file_for_cache_dir_is_refused(tmp_path) -> None:
    """A cut-short entry made every later start fail with "ONNX Runtime cannot load the model ... re-export it",
    blaming the user's model; a file given as cache_dir was a bare FileExistsError."""
    request = _requests(1)[0]
    with Runtime(_model(), device="cpu", workers=1, cache_dir=str(tmp_path)) as first:
        want = first.run(request)[0]
    (cached,) = tmp_path.iterdir()
    cached.write_bytes(cached.read_bytes()[:100])
    with Runtime(_model(), device="cpu", workers=1, cache_dir=str(tmp_path)) as again:
        assert again.cache == "miss"
        np.testing.assert_array_equal(again.run(request)[0], want)
    with pytest.raises(InputError, match="is a file, not a folder"):
        Runtime(_model(), device="cpu", workers=1, cache_dir=str(cached))


def test_a_numpy_scalar_is_taken_as_a_rank_0_input_and_overloaded_is_exported() -> None:
    """Silero VAD's sample rate read from an .npz (z['sr'][0], an np.int64) was refused as "not a numpy array"."""
    import npukit
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Cast", ["sr"], ["y"], to=TensorProto.FLOAT)], "s",
                              [helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with Runtime(model, device="cpu", workers=1) as rt:
        assert float(rt.run({"sr": np.int64(16000)})[0]) == 16000.0
        assert float(rt.run({"sr": 16000})[0]) == 16000.0  # a Python int too (was "input 'sr' is a int")
    assert npukit.Overloaded is Overloaded


def test_calls_timed_in_turn_see_the_same_drift_in_the_host() -> None:
    """measure_buckets timed a session for its whole duration, then the bucket: a host slowing in between read as
    the bucket's cost (1.93x on PP-OCRv4 det, 1.00x timed in turn). Here the host slows down as time passes; two
    equal calls timed in turn come out equal, each with its own calls' time as its seconds."""
    from npukit.measure.load import alternating

    started = time.perf_counter()

    def work(_: object) -> None:  # slower the later it is called
        time.sleep(0.0005 + (time.perf_counter() - started) * 0.01)

    timed = alternating({"a": work, "b": work}, [{}], duration_s=0.3)
    a, b = timed["a"], timed["b"]
    assert a.completed == b.completed > 10 and a.failed == 0
    assert 0.8 < b.latency_ms["p50"] / a.latency_ms["p50"] < 1.25
    assert a.seconds < 0.3 and a.throughput == pytest.approx(a.completed / a.seconds)


@pytest.mark.parametrize("pool", [True, False])
def test_a_failed_run_is_raised_on_its_future_without_ort_logging_it(capfd, pool) -> None:
    """A serving load of requests 1 in 16 of which failed (a Gather index out of range) printed 3,969 lines of ORT's
    "Non-zero status code returned" to stderr beside the FAIL verdict that already named the error."""
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Gather", ["d", "i"], ["y"])], "g",
                              [helper.make_tensor_value_info("i", TensorProto.INT64, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
                              [numpy_helper.from_array(np.arange(4, dtype=np.float32), "d")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with Runtime(model, device="cpu", workers=1, pool=pool) as rt:
        assert float(rt.run({"i": np.array([2])})[0][0]) == 2.0
        capfd.readouterr()
        assert rt.submit({"i": np.array([9])}).exception(5) is not None
        assert "onnxruntime" not in capfd.readouterr().err
