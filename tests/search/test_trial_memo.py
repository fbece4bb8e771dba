"""Trials built one after another in one process share the calibrations and weight grids of the recipes before them
(``npukit.quant.memo``); each trial's artifact and figures are the ones it builds alone."""

from __future__ import annotations

from npukit.quant import memo
from npukit.search.space import Recipe

RECIPES = (Recipe(), Recipe(per_channel=False), Recipe(bias_correction=True),
           Recipe(method="mse", bias_correction=True), Recipe(method="minmax"), Recipe(cle=True), Recipe())


def test_trials_in_one_process_build_what_each_builds_alone() -> None:
    from npukit.quant.calibration import calibrate
    from npukit.quant.config import QuantConfig
    from npukit.search.trial import TrialBuilder
    from npukit.tasks.base import QualityGate
    from tests.quant.conftest import make_samples, tiny_cnn

    builder = TrialBuilder(model=tiny_cnn(spread=0.5), calib=make_samples(8), evaluation=make_samples(4, seed=7),
                           gate=QualityGate(), base=QuantConfig())
    warm = [builder.build(r) for r in RECIPES]
    assert calibrate._GATHERED.hits and calibrate._RANGES.hits  # the later trials recalled the earlier ones' work
    for recipe, built in zip(RECIPES, warm):
        memo.clear()
        with memo.disabled():
            cold = builder.build(recipe)
        assert built.error == cold.error == "", recipe.label()
        assert built.model.SerializeToString() == cold.model.SerializeToString(), recipe.label()
        assert (built.metric, built.worst_sqnr_db, built.failures, built.passed) == \
            (cold.metric, cold.worst_sqnr_db, cold.failures, cold.passed), recipe.label()
