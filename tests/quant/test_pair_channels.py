from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.quant.algorithms.stream_equalize import find_stream_groups
from npukit.quant.config import CpuKernels, QuantConfig, Scheme
from npukit.quant.cpu.pair_channels import greedy_pairing, pair_channels, pair_scales
from npukit.quant.layer_sqnr import sqnr_db
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn

CONFIG = QuantConfig(scheme=Scheme(per_channel=True), cpu=CpuKernels(reduce_range=True))


def _weight(model: onnx.ModelProto, name: str) -> np.ndarray:
    return next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == name)


def _set(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    init = next(i for i in model.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return sqnr_db(float((ref.astype(np.float64) ** 2).sum()), float(((ref - got).astype(np.float64) ** 2).sum()))


def unequal_pairs_model() -> onnx.ModelProto:
    """tiny_cnn (Clip) whose pointwise Conv weighs channels 0-3 ten times more than 4-7: in the original order the
    kernels add two large weights in pairs (0, 1) and (2, 3)."""
    model = tiny_cnn(activation="Clip", seed=4)
    w3 = _weight(model, "w3").copy()
    w3[:, :4] *= 10.0
    _set(model, "w3", w3)
    return model


def test_greedy_pairing_puts_each_large_weight_beside_a_small_one() -> None:
    a = np.array([[1.0, 0.9, 0.1, 0.05], [0.8, 1.0, 0.02, 0.1]])
    order = greedy_pairing(a)
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    assert {frozenset(order[:2].tolist()), frozenset(order[2:].tolist())} != {frozenset({0, 1}), frozenset({2, 3})}
    np.testing.assert_array_less(pair_scales(a, order), pair_scales(a))
    assert pair_scales(a, order).max() <= 1.1 + 1e-12


def test_an_odd_channel_count_leaves_one_channel_alone_at_the_end() -> None:
    a = np.array([[1.0, 1.0, 1.0, 0.0, 0.0]])
    order = greedy_pairing(a)
    assert sorted(order.tolist()) == [0, 1, 2, 3, 4]
    assert pair_scales(a, order).max() == 1.0  # every large channel next to a zero one, or alone


def test_permutation_groups_run_through_clip_and_depthwise_convs() -> None:
    groups, _ = find_stream_groups(tiny_cnn(activation="Clip"), permutation=True)
    by_consumer = {g.consumers: g for g in groups}
    assert by_consumer[("pw",)].producers == ("conv1",) and by_consumer[("pw",)].channelwise == ("dw",)
    assert by_consumer[("fc",)].producers == ("pw",)
    scaling, skipped = find_stream_groups(tiny_cnn(activation="Clip"))  # scaling stops at the Clip
    assert all("dw" not in g.consumers or g.producers != ("conv1",) for g in scaling) and skipped


def test_pairing_keeps_the_float_model_and_lowers_the_pair_scales() -> None:
    model = unequal_pairs_model()
    result = pair_channels(model, CONFIG)
    samples = make_samples(8)
    np.testing.assert_allclose(outputs(result.model, samples), outputs(model, samples), rtol=1e-5, atol=1e-5)
    group = next(g for g in result.groups if g["consumers"] == ["pw"])
    assert group["channelwise"] == ["dw"] and group["log_scale_after"] < group["log_scale_before"]
    old, new = _weight(model, "w3").reshape(6, 8), _weight(result.model, "w3").reshape(6, 8)
    # (pw's own output channels were reordered too, for fc: compare each row with its own largest weight)
    before = pair_scales(old) / np.abs(old).max(axis=1)
    after = pair_scales(new) / np.abs(new).max(axis=1)
    assert np.median(before) > 1.5 and np.all(after < 1.1)
    # the writer and the depthwise Conv moved with the reader, so channel c is still the same channel
    order = [int(np.flatnonzero(np.all(_weight(model, "w2") == row, axis=(1, 2, 3)))[0])
             for row in _weight(result.model, "w2")]
    np.testing.assert_array_equal(_weight(result.model, "w1"), _weight(model, "w1")[order])
    np.testing.assert_array_equal(np.sort(new, axis=0), np.sort(old[:, order], axis=0))


def test_pairing_is_only_for_the_pair_bounded_grid_and_helps_the_int8_model() -> None:
    model = unequal_pairs_model()
    samples = make_samples(32, seed=5)
    held = make_samples(32, seed=6)
    reference = outputs(model, held)
    config = CONFIG.with_calibration(method="minmax")
    paired = quantize(model, samples, config=config)
    plain = quantize(model, samples, config=config.with_cpu(pair_channels=False))
    assert paired.steps.pair_channels["groups"] >= 1 and plain.steps.pair_channels is None
    gained = _sqnr(reference, outputs(paired.model, held)) - _sqnr(reference, outputs(plain.model, held))
    assert gained > 1.0, gained
    for other in (config.with_cpu(reduce_range=False), config.with_scheme(per_channel=False),
                  config.with_recipe(bias_correction=True)):
        assert quantize(model, samples, config=other).steps.pair_channels is None


def test_a_bias_shared_by_two_reordered_nodes_is_copied_not_reordered_twice() -> None:
    model = unequal_pairs_model()
    dw = next(n for n in model.graph.node if n.name == "dw")
    _set(model, "b1", _weight(model, "b2"))
    dw.input[2] = "b1"  # the exporter's merge of equal constants: conv1 and the depthwise Conv share one bias
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "b2"))
    result = pair_channels(model, CONFIG)
    assert any(g["consumers"] == ["pw"] for g in result.groups)
    samples = make_samples(4)
    np.testing.assert_allclose(outputs(result.model, samples), outputs(model, samples), rtol=1e-5, atol=1e-5)
