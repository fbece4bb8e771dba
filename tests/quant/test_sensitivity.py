from __future__ import annotations

import pytest

from npukit.errors import InputError
from npukit.quant.config import FloatHead, Precision, QuantConfig, Scheme
from npukit.quant.precision.sensitivity import choose_mixed_precision, layer_sensitivity, output_sqnr
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, tiny_cnn


def test_sensitivity_ranks_every_quantized_conv_and_gemm() -> None:
    model = tiny_cnn(spread=1.0)
    samples = make_samples(8)
    ranking = layer_sensitivity(quantize(model, samples, config=QuantConfig(scheme=Scheme(per_channel=False))), samples)
    assert {name for name, _ in ranking} == {"conv1", "dw", "pw", "fc"}
    costs = [cost for _, cost in ranking]
    assert costs == sorted(costs, reverse=True) and costs[0] > 0


@pytest.mark.parametrize("mode", ["int16", "exclude"])
def test_lifting_the_most_sensitive_layers_reaches_the_target(mode) -> None:
    model = tiny_cnn(spread=1.0)
    samples, held = make_samples(12), make_samples(8, seed=4)
    config = QuantConfig(scheme=Scheme(per_channel=False))
    baseline = output_sqnr(model, quantize(model, samples, config=config).model, held)
    plan = choose_mixed_precision(model, samples, config=config, target_sqnr_db=baseline + 1.5, max_layers=4,
                                  mode=mode, eval_samples=held)
    assert plan.baseline_sqnr_db == pytest.approx(baseline)
    assert plan.reached and plan.sqnr_db >= baseline + 1.5 and 1 <= len(plan.nodes) <= 4
    assert set(plan.nodes) <= {n for n, _ in plan.sensitivity}
    lifted = plan.config.scheme.int16_nodes if mode == "int16" else plan.config.scheme.exclude
    assert set(lifted) == set(plan.nodes)
    assert [len(t["nodes"]) for t in plan.tried] == sorted(len(t["nodes"]) for t in plan.tried)
    # nothing to do when the target is already met
    easy = choose_mixed_precision(model, samples, config=config, target_sqnr_db=baseline - 1.0, max_layers=2,
                                  mode=mode, eval_samples=held)
    assert easy.nodes == () and easy.reached and len(easy.tried) == 1


def test_bad_arguments() -> None:
    with pytest.raises(InputError, match="max_layers"):
        choose_mixed_precision(tiny_cnn(), make_samples(2), config=QuantConfig(), target_sqnr_db=30, max_layers=0)


def test_the_trials_keep_the_float_head_chosen_for_the_base(monkeypatch) -> None:
    import numpy as np

    from npukit.quant import qdq
    from tests.quant.test_float_head import _chain_model

    timed = []
    real = qdq.float_heads
    monkeypatch.setattr(qdq, "float_heads", lambda *a, **k: timed.append(1) or real(*a, **k))
    model = _chain_model(branch_after=4)
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(size=(1, 3, 8, 8)).astype(np.float32)} for _ in range(6)]
    plan = choose_mixed_precision(model, samples, config=QuantConfig(precision=Precision(float_head=FloatHead())),
                                  target_sqnr_db=99.0, max_layers=2, mode="int16")
    assert len(timed) == 1 and len(plan.tried) > 1  # the head was timed for the base only
    # the base's head, as exclusions
    assert not plan.config.precision.timed_head and plan.config.scheme.exclude[0] == "stem"
    assert plan.result.steps.float_stem is None
