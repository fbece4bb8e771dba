"""The HTP's compiled graph cached by the runtime: a later start loads it, answers the same and keeps the placement."""

from __future__ import annotations

import numpy as np
import onnx

from npukit.runtime.compile import compile_qnn_context
from npukit.runtime.context_cache import context_key
from npukit.runtime.engine import Runtime
from tests.runtime.conftest import requires_qnn
from tests.runtime.tiny_qdq import qdq_conv_model

pytestmark = requires_qnn


def _feeds() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).uniform(-1.5, 1.5, (1, 3, 8, 8)).astype(np.float32)}


def test_a_later_start_loads_the_compiled_graph_and_answers_the_same(tmp_path) -> None:
    model, cache = qdq_conv_model(), tmp_path / "cache"
    with Runtime(model, device="qnn-htp@SM8650", workers=1) as plain:
        want = plain.run(_feeds())
        placed = plain.device
    assert plain.cache == "off"
    from npukit.runtime.engine import EMULATOR_NOTE, htp_emulated

    assert (EMULATOR_NOTE in placed.reason) == htp_emulated()  # x86: the emulator's speed, said where it is placed
    with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=str(cache)) as first:
        assert first.cache == "miss" and first.device == placed
        np.testing.assert_array_equal(first.run(_feeds())[0], want[0])
    key = context_key(model.SerializeToString(), "SM8650")
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.ctx.onnx", f"{key}.json"]  # nothing else left
    stored = onnx.load(str(cache / f"{key}.ctx.onnx"))
    assert "EPContext" in {n.op_type for n in stored.graph.node}
    assert placed.cpu_nodes and "QuantizeLinear" in {n.op_type for n in stored.graph.node}  # the CPU's node kept
    with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=str(cache)) as again:
        assert again.cache == "hit" and again.device == placed  # the placement chosen when it was compiled
        np.testing.assert_array_equal(again.run(_feeds())[0], want[0])
    # another SoC is another binary: compiled again, beside the first
    with Runtime(model, device="qnn-htp@SM8350", workers=1, cache_dir=str(cache)) as other:
        assert other.cache == "miss"
    assert len(list(cache.glob("*.ctx.onnx"))) == 2


def test_a_broken_entry_is_compiled_again_and_a_compiled_model_is_not_cached(tmp_path) -> None:
    model, cache = qdq_conv_model(), tmp_path / "cache"
    key = context_key(model.SerializeToString(), "SM8650")
    cache.mkdir()
    (cache / f"{key}.ctx.onnx").write_bytes(b"not a model")
    (cache / f"{key}.json").write_text("{}")
    with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=str(cache)) as rt:
        assert rt.cache == "miss"
        want = rt.run(_feeds())
    with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=str(cache)) as rt:
        assert rt.cache == "hit"
    (cache / f"{key}.json").write_text('{"device": "qnn-htp@SM8650"}')  # a placement that lacks what is read
    with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=str(cache)) as rt:
        assert rt.cache == "miss" and rt.device.npu_nodes > 0
    compiled = tmp_path / "ctx.onnx"
    compile_qnn_context(model, compiled, soc="SM8650")
    other = tmp_path / "other"
    with Runtime(str(compiled), device="qnn-htp@SM8650", workers=1, cache_dir=str(other)) as rt:
        assert rt.cache == "off" and not other.exists()  # already compiled: nothing to keep
        np.testing.assert_allclose(rt.run(_feeds())[0], want[0], atol=6.0 / 255)


def test_a_cold_start_compiles_the_graph_once(monkeypatch, tmp_path) -> None:
    """The placement is read from the session the runtime serves with: one QNN session (one compile) per cold
    start, with or without a cache."""
    import npukit.runtime.qnn as qnn

    made: list[bool] = []
    real = qnn.create_session_with_log

    def counting(*args, **kwargs):
        made.append(bool(kwargs.get("verbose")))
        return real(*args, **kwargs)

    monkeypatch.setattr(qnn, "create_session_with_log", counting)
    model = qdq_conv_model()
    for cache_dir in (None, str(tmp_path / "cache")):
        made.clear()
        with Runtime(model, device="qnn-htp@SM8650", workers=1, cache_dir=cache_dir) as rt:
            assert rt.device.npu_nodes == 7 and rt.device.cpu_nodes == ("q_x",)
            rt.run(_feeds())
        assert made == [False], made  # one quiet session: QNN composes and finalizes the graph once
