"""npukit serve-bench end to end on a tiny model: a report with every load's figures; bad input exits 2."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from npukit.cli import main
from tests.runtime.test_engine import _model


def test_serve_bench_writes_every_figure(tmp_path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(model), "--duration", "0.2", "--loads", "1.0", "--max-workers", "2",
                 "--report", str(report), "--html"]) == 0
    assert report.with_suffix(".html").is_file()
    data = json.loads(report.read_text())
    serving = data["results"]["serving"]
    assert serving["device"]["device"] == "cpu"
    assert set(serving["single"]) == {"plain", "pool"} and set(serving["curve"]) == {"1", "2"}
    assert set(serving["curve_plain"]) == {"1", "2"}  # the plain loop run again beside each point
    for w in ("1", "2"):
        ratio = serving["curve"][w]["throughput_per_s"] / serving["curve_plain"][w]["throughput_per_s"]
        assert serving["speedup"][w] == pytest.approx(ratio, abs=1e-3)
    assert "the plain loop run just before it" in data["verdict"]
    assert len(serving["open"]["plain"]) == len(serving["open"]["workers"]) == len(serving["open"]["batched"]) == 1
    assert serving["open"]["batched"][0]["completed"] > 0
    # the batch sizes formed are in the open-loop table (they were in the JSON only)
    table = next(t for t in data["tables"] if t["title"].startswith("Open loop"))
    assert table["columns"][-1] == "batches formed (size: count)"
    formed = serving["batching"]["batches"][0]
    assert table["rows"][-1][-1] == ", ".join(f"{k}: {v}" for k, v in formed.items()) and table["rows"][0][-1] == "-"
    assert set(serving["allocated_bytes_per_call"]) == {"plain", "bound_buffers", "runtime"}
    assert serving["split"]["note"].startswith("measured") and serving["split"]["measured"]
    assert set(serving["startup_ms"]) == {"plain_session_ms", "cached_session_ms", "runtime_ms", "runtime_cached_ms"}
    assert all(v > 0 for v in serving["startup_ms"].values())


def test_serve_bench_refuses_bad_input(tmp_path, capsys) -> None:
    text = tmp_path / "m.txt"
    text.write_text("not a model")
    assert main(["serve-bench", str(text)]) == 2
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    assert main(["serve-bench", str(model), "--device", "gpu"]) == 2
    assert "unknown device" in capsys.readouterr().err
    assert main(["serve-bench", str(model), "--duration", "0"]) == 2  # the parser's refusal: one line
    err = capsys.readouterr().err
    assert "above 0" in err and len(err.strip().splitlines()) == 1
    from onnx import TensorProto, helper  # a compiled HTP context model: refused, saying what to serve instead

    node = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft", source="QNNExecutionProvider")
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y")]
    ctx = helper.make_model(helper.make_graph([node], "ctx", io[:1], io[1:]))
    onnx.save(ctx, str(tmp_path / "m.ctx.onnx"))
    assert main(["serve-bench", str(tmp_path / "m.ctx.onnx"), "--device", "qnn-htp@SM8650"]) == 2
    assert "compiled HTP context model" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ctx.onnx", "m.onnx", "m.txt"]


def test_serve_bench_takes_a_fixed_batch_larger_than_one(tmp_path) -> None:
    model = tmp_path / "m2.onnx"
    onnx.save(_model(batch=2), str(model))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(model), "--duration", "0.2", "--loads", "1.0", "--max-workers", "1",
                 "--report", str(report)]) == 0
    serving = json.loads(report.read_text())["results"]["serving"]
    assert serving["single"]["pool"]["completed"] > 0 and serving["single"]["pool"]["failed"] == 0


def test_serve_bench_buckets_a_model_with_symbolic_sizes(tmp_path, capsys) -> None:
    model = _model()
    for dim, name in ((2, "h"), (3, "w")):  # the tiny net at any height and width
        model.graph.input[0].type.tensor_type.shape.dim[dim].dim_param = name
    path = tmp_path / "any_size.onnx"
    onnx.save(model, str(path))
    report = tmp_path / "buckets.json"
    assert main(["serve-bench", str(path), "--bucket", "1,3,8,8", "--bucket", "1,3,12,12", "--duration", "0.2",
                 "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["verdict"].startswith("INFO serve-bench: 2 bucket(s)")
    buckets = data["results"]["buckets"]
    assert set(buckets) == {"1x3x8x8", "1x3x12x12", "1x3x6x6", "1x3x10x10"}  # and 85% of each, padded into it
    exact = [buckets["1x3x8x8"], buckets["1x3x12x12"]]
    assert all(b["max_abs_difference"] == 0 and b["latency_ratio_p50"] > 0 for b in exact)
    padded = buckets["1x3x10x10"]  # the global pool averages the padding in: reported, not hidden
    assert padded["bucket"] == "1x3x12x12" and padded["padding"] == pytest.approx(1 - 100 / 144, abs=1e-4)
    assert padded["max_abs_difference"] > 0 and padded["latency_ratio_p50"] > 0
    assert "requests padded into a bucket (1x3x6x6 in 1x3x8x8, 1x3x10x10 in 1x3x12x12" in data["verdict"]
    capsys.readouterr()
    assert main(["serve-bench", str(path), "--bucket", "3,8,8"]) == 2  # not the input's rank
    assert main(["serve-bench", str(path), "--bucket", "1,3,x,8"]) == 2
    err = capsys.readouterr().err
    assert "has 3 dimensions" in err and "positive integers" in err
    # --data was ignored (the table said seeded inputs), and a model of fixed sizes was bucketed
    data = tmp_path / "x.npy"
    np.save(data, np.zeros((2, 3, 8, 8), np.float32))
    assert main(["serve-bench", str(path), "--bucket", "1,3,8,8", "--data", str(data)]) == 2
    assert "--data is not read there" in capsys.readouterr().err
    data.unlink()
    fixed = tmp_path / "fixed.onnx"
    onnx.save(_model(), str(fixed))
    assert main(["serve-bench", str(fixed), "--bucket", "1,3,8,8"]) == 2
    assert "has fixed sizes ['n', 3, 8, 8]" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["any_size.onnx", "buckets.json", "fixed.onnx"]


def test_serve_bench_passes_prefer_and_device_concurrency_to_every_runtime(tmp_path, capsys) -> None:
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(model), "--duration", "0.2", "--loads", "1.0", "--max-workers", "2",
                 "--prefer", "latency", "--device-concurrency", "1", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["serving"]["prefer"] == "latency"
    assert data["config"]["serving"]["device_concurrency"] == 1
    serving = data["results"]["serving"]
    assert serving["device"]["device_concurrency"] == 1  # the CPU, limited to one graph at a time as asked
    measured = serving["split"]["measured"]
    assert serving["split"]["note"].startswith("measured for latency")
    assert measured and all(r["latency_ms"] is not None for r in measured)  # timed for a latency-first split only
    capsys.readouterr()
    assert main(["serve-bench", str(model), "--device-concurrency", "0"]) == 2
    assert "--device-concurrency: 0 must be at least 1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "serve.json"]


def test_a_fixed_batch_and_a_scalar_input_are_served_without_batching(tmp_path) -> None:
    """Silero VAD's form: a fixed batch axis and a rank-0 input (its sample rate). The runtime serves it (it used to
    fail on the scalar's shape) and the report has no batched rows, only the note why."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT), helper.make_node("Mul", ["x", "srf"], ["y"])],
        "scalar", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
                   helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = tmp_path / "scalar.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(model), "--duration", "0.2", "--loads", "1.0", "--max-workers", "1",
                 "--report", str(report)]) == 0
    serving = json.loads(report.read_text())["results"]["serving"]
    assert set(serving["open"]) == {"plain", "workers"} and serving["open"]["workers"][0]["completed"] > 0
    assert serving["batching"]["note"].startswith("batching off")


def test_serve_bench_fixes_a_given_input_shape_and_asks_for_one_it_needs(tmp_path, capsys) -> None:
    model = _model()
    for dim, name in ((2, "h"), (3, "w")):
        model.graph.input[0].type.tensor_type.shape.dim[dim].dim_param = name
    path = tmp_path / "any_size.onnx"
    onnx.save(model, str(path))
    assert main(["serve-bench", str(path), "--duration", "0.2"]) == 2  # seeded requests need every size
    err = capsys.readouterr().err
    assert "--input-shape" in err and len(err.strip().splitlines()) <= 2
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(path), "--input-shape", "1,3,8,8", "--duration", "0.2", "--loads", "1.0",
                 "--max-workers", "1", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["config"]["input_shape"] and data["results"]["serving"]["single"]["pool"]["completed"] > 0
    # the model's symbolic batch stays symbolic: the sizes given are one request's (the batch was fixed to 1 and the
    # report said "export it with --dynamic-batch")
    assert not data["results"]["serving"]["batching"]["note"]
    assert main(["serve-bench", str(tmp_path / "nope.onnx")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve-bench", str(path), "--input-shape", "1,3,8,8", "--bucket", "1,3,8,8"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["any_size.onnx", "serve.json"]


def test_the_plain_loop_runs_on_the_device_the_runtime_serves_on(tmp_path) -> None:
    """On the HTP the plain loop's session was ORT's CPU EP: its capacity set the open-loop rates and queued
    minutes of work on the HTP emulator for a one-second load point."""
    pytest.importorskip("onnxruntime_qnn")
    from npukit.measure.serving import plain_session

    model = tmp_path / "m.onnx"
    onnx.save(_model(batch=1), str(model))  # the HTP takes static shapes only
    assert plain_session(str(model), "cpu").get_providers() == ["CPUExecutionProvider"]
    assert plain_session(str(model), "qnn-htp@SM8650").get_providers()[0] == "QNNExecutionProvider"


def test_seeded_requests_for_an_integer_input_are_said_to_be_arbitrary(tmp_path) -> None:
    """Without --data an int64 input gets small random values (a sample rate or mode flag a model branches on would
    take a path real data never takes): the verdict says so and asks for --data."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "kf"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
                                           helper.make_tensor_value_info("k", TensorProto.INT64, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "rate.onnx"
    onnx.save(model, str(path))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(path), "--duration", "0.2", "--loads", "1.0", "--max-workers", "1",
                 "--report", str(report)]) == 0
    assert "integer input(s) 'k' small random values" in json.loads(report.read_text())["verdict"]


def test_requests_that_fail_make_the_verdict_fail_and_are_counted_in_the_tables(tmp_path, monkeypatch) -> None:
    """Batched RetinaFace requests failed (a bound output declared with batch 1): 35 of 64 in one load, and
    serve-bench exited 0 with an INFO verdict, the load's figures counting only the requests answered."""
    from npukit.runtime.engine import Runtime

    original = Runtime._run_batch

    def batches_fail(self, slot, batch):
        if len(batch) > 1:
            raise RuntimeError("Got invalid dimensions for output: loc")
        return original(self, slot, batch)

    monkeypatch.setattr(Runtime, "_run_batch", batches_fail)
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    report = tmp_path / "serve.json"
    code = main(["serve-bench", str(model), "--duration", "0.3", "--loads", "4.0", "--max-workers", "1",
                 "--max-wait-ms", "20", "--report", str(report)])
    data = json.loads(report.read_text())
    failed = sum(r["failed"] for r in data["results"]["serving"]["open"]["batched"])
    assert failed > 0 and code == 1 and not data["passed"]
    assert data["verdict"].startswith("FAIL serve-bench: ") and "Got invalid dimensions for output: loc" in \
        data["verdict"]
    table = next(t for t in data["tables"] if t["title"].startswith("Open loop"))
    assert "failed" in table["columns"]


@pytest.mark.parametrize("extra, said", [(["--duration", "0.001"], "must be at least 0.1 s"),
                                         (["--loads", "inf"], "must be multiples"),
                                         (["--loads", "1000"], "must be multiples"),
                                         (["--max-wait-ms", "nan"], "max_wait_ms nan"),
                                         (["--max-wait-ms", "-1"], "max-wait")])
def test_odd_loads_and_durations_are_refused_before_any_measurement(tmp_path, capsys, extra, said) -> None:
    """--duration 0.001 and --loads inf ended in an internal error after the start-up measurements; --loads 1000 ran
    21 s for a 0.3 s load; --max-wait-ms nan was taken."""
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    assert main(["serve-bench", str(model), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_batch_in_input_shape_for_a_symbolic_batch_is_refused(tmp_path, capsys) -> None:
    """--input-shape 4,3,8,8 on a model with a symbolic batch was served as 1-sample requests without a word."""
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    assert main(["serve-bench", str(model), "--input-shape", "4,3,8,8", "--duration", "0.2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "a batch of 4, but a request holds one sample" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_max_batch_1_serves_no_batched_row(tmp_path) -> None:
    """--max-batch 1 ("1: off") still added a row titled "batches up to 1"."""
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(model), "--duration", "0.2", "--loads", "1.0", "--max-workers", "1",
                 "--max-batch", "1", "--report", str(report)]) == 0
    serving = json.loads(report.read_text())["results"]["serving"]
    assert set(serving["open"]) == {"plain", "workers"} and serving["batching"]["note"] == "batching off: max_batch 1"


def test_sizes_the_model_leaves_open_are_taken_from_the_data(tmp_path) -> None:
    """serve-bench needed --input-shape though --data gave the sizes (bench takes them from the data)."""
    model = _model()
    for dim, name in ((2, "h"), (3, "w")):
        model.graph.input[0].type.tensor_type.shape.dim[dim].dim_param = name
    path = tmp_path / "any_size.onnx"
    onnx.save(model, str(path))
    data = tmp_path / "x.npy"
    np.save(data, np.random.default_rng(0).standard_normal((4, 3, 8, 8)).astype(np.float32))
    report = tmp_path / "serve.json"
    assert main(["serve-bench", str(path), "--data", str(data), "--duration", "0.2", "--loads", "1.0",
                 "--max-workers", "1", "--report", str(report)]) == 0
    config = json.loads(report.read_text())["config"]
    assert config["input_shape_from"] == "the data's first request" and config["input_shape"]


def test_serve_bench_verdict_names_the_hosts_drift() -> None:
    """The speedup is taken against the plain loop run just before the point; where the plain loop's runs spread by
    more than 5% the verdict says the host's speed moved."""
    from npukit.measure.serving import ServingResult
    from npukit.measure.load import LoadResult
    from npukit.verbs.serve_bench import _plain_runs

    def load(per_s: float) -> LoadResult:
        return LoadResult(mode="closed", level=1, completed=int(per_s), refused=0, failed=0, seconds=1.0,
                          latency_ms={"p50": 1.0, "p99": 1.0})

    result = ServingResult(device={}, startup_ms={}, single={"plain": load(100)}, allocated_bytes_per_call={},
                           curve={1: load(90), 2: load(150)}, open={}, batching={}, cpu="",
                           curve_plain={1: load(100), 2: load(60)})
    assert result.speedup(2) == pytest.approx(2.5)  # against 60/s beside it, not the 100/s at the start
    assert result.plain_range() == (60, 100)
    # the figure beside the ratio is its denominator (it was the highest run: 0.95x "(plain loop 1184.5)" with
    # 1096.3 requests/s, 0.93x of that)
    assert _plain_runs(result, 2).startswith("plain loop 60.0 requests/s; 60.0-100.0 over its 3 runs")
    steady = ServingResult(device={}, startup_ms={}, single={"plain": load(100)}, allocated_bytes_per_call={},
                           curve={1: load(90)}, open={}, batching={}, cpu="", curve_plain={1: load(97)})
    assert _plain_runs(steady, 1) == "plain loop 97.0 requests/s"


def test_requests_are_spread_over_the_data(tmp_path) -> None:
    """serve-bench's 16 requests were the data's first 16 (a folder sorted by class gave one class)."""
    from npukit.config import PreprocessConfig
    from npukit.verbs.serve_bench import _requests

    data = tmp_path / "d.npy"
    np.save(data, np.arange(40, dtype=np.float32)[:, None, None, None] * np.ones((40, 3, 8, 8), np.float32))
    picked = [int(r["x"].flat[0]) for r in _requests(_model(), data, 4, PreprocessConfig())]
    assert len(picked) == 4 and picked[0] > 0 and picked[-1] > 30, picked


def test_a_symbolic_batch_is_served_on_the_htp_at_one_request(tmp_path) -> None:
    """serve-bench --device qnn-htp on a model with a symbolic batch (PP-OCR cls, YOLOv8n) was refused with "the QNN
    EP needs static shapes ... --input-shape x=1,3,48,192", the flag already given: the batch was kept symbolic for
    batching, which the HTP does not do. It is fixed to 1 there, as compile and bench take it."""
    pytest.importorskip("onnxruntime_qnn")
    model, report = tmp_path / "m.onnx", tmp_path / "serve.json"
    onnx.save(_model(), str(model))  # x[n, 3, 8, 8]
    for extra in ([], ["--input-shape", "x=1,3,8,8"]):
        assert main(["serve-bench", str(model), "--device", "qnn-htp@SM8650", "--duration", "0.2", "--loads", "1",
                     "--report", str(report), *extra]) == 0, extra
        data = json.loads(report.read_text())
        assert data["config"]["input_shape"] and data["results"]["serving"]["device"]["device"].startswith("qnn-htp")
