"""Recipe "auto" (npukit.quant.recipe): the plain recipe kept unless another is clearly better on held-out samples,
within a time budget; the rule on known numbers, and quantize with it on the tiny CNN."""

from __future__ import annotations

import dataclasses

import pytest

from npukit.errors import InputError
from npukit.quant import recipe
from npukit.quant.calibration.auto import split_samples
from npukit.quant.config import AdaRound, CalibrationSpec, QuantConfig, Recipe, RecipeChoice
from npukit.quant.qdq import quantize
from npukit.verbs.quantize import resolve_recipe
from tests.quant.conftest import make_samples, tiny_cnn


def _scored(total: float, per: list[float], method: str = "minmax") -> recipe.Scored:
    return recipe.Scored(total, tuple(per), method, 1.0)


def test_sign_test_p_values() -> None:
    assert recipe.sign_test(10, 10) == pytest.approx(1 / 1024)
    assert recipe.sign_test(9, 10) == pytest.approx(11 / 1024)
    assert recipe.sign_test(8, 10) == pytest.approx(56 / 1024)  # 0.055: not enough at 0.05
    assert recipe.sign_test(0, 0) == 1.0 and recipe.sign_test(2, 2) == 0.25


def test_a_higher_score_on_two_samples_does_not_replace_the_plain_recipe() -> None:
    """ddddocr's YOLOX text detector, measured: equalized 22.9 against 21.6 dB over 2 held-out images, better on one
    and worse on the other; on the evaluation images it is the worse."""
    chosen, record = recipe.choose({"plain": _scored(21.6, [16.92, 28.31], "percentile"),
                                    "equalized": _scored(22.9, [18.61, 27.83], "mse")}, skipped={}, budget_s=60)
    assert chosen == "plain" and record["flags"] == ""
    assert "better on 1 of 2" in record["candidates"]["equalized"]["against_first"]


def test_clearly_better_on_every_held_out_sample_replaces_it() -> None:
    """MobileNetV2 (random weights), measured: equalized better on all 10 held-out crops."""
    plain = [27.37, 26.42, 27.43, 27.46, 22.51, 22.78, 22.66, 22.71, 22.29, 22.79]
    equalized = [29.17, 28.02, 29.08, 29.72, 23.52, 23.84, 23.75, 23.96, 23.22, 24.17]
    chosen, record = recipe.choose({"plain": _scored(22.8, plain), "equalized": _scored(23.9, equalized)},
                                   skipped={}, budget_s=60)
    assert chosen == "equalized" and record["flags"] == "--cle --equalize-activations --bias-correction"
    # better sample by sample but lower over all (one sample's large error dominates the sum): not replaced
    chosen, _ = recipe.choose({"plain": _scored(24.0, plain), "equalized": _scored(23.9, equalized)},
                              skipped={}, budget_s=60)
    assert chosen == "plain"


def test_ties_sample_by_sample_keep_the_first() -> None:
    same = [48.13] * 3
    chosen, record = recipe.choose({"plain": _scored(48.13, same), "equalized": _scored(48.13, same)},
                                   skipped={}, budget_s=60)
    assert chosen == "plain" and "better on 0 of 0" in record["candidates"]["equalized"]["against_first"]


def test_the_budget_rule() -> None:
    assert recipe.within_budget(20.0, 30.0, 60.0) and not recipe.within_budget(31.0, 30.0, 60.0)


def test_quantize_with_choose_recipe_runs_each_candidate_and_keeps_its_steps() -> None:
    samples = make_samples(16)
    result = quantize(tiny_cnn(spread=0.5), samples, config=QuantConfig(calibration=CalibrationSpec(method="auto"),
                                                                        recipe=Recipe(choose=RecipeChoice())))
    record = result.steps.recipe
    assert set(record["candidates"]) == set(recipe.CANDIDATES) and not record["skipped"]
    assert record["held_out_samples"] == split_samples(16).held_out
    chosen = record["chosen"]
    ran = result.steps.ran()
    equalizing = {"cle", "activation_equalization", "bias_correction"}
    assert (equalizing <= set(ran)) == (chosen == "equalized")
    assert ran.index("recipe") < ran.index("auto") < ran.index("calibration")
    # the kept recipe's model is the one that recipe gives alone (same steps, same ranges, same bytes)
    alone = quantize(tiny_cnn(spread=0.5), samples,
                     config=QuantConfig(calibration=CalibrationSpec(method="auto"), recipe=recipe.CANDIDATES[chosen]))
    assert alone.model.SerializeToString() == result.model.SerializeToString()
    assert record["candidates"][chosen]["method"] == alone.steps.auto["chosen"]


def test_a_spent_budget_skips_the_later_candidates() -> None:
    result = quantize(tiny_cnn(), make_samples(8),
                      config=QuantConfig(calibration=CalibrationSpec(method="auto"),
                                         recipe=Recipe(choose=RecipeChoice(budget_s=1e-6))))
    record = result.steps.recipe
    assert record["chosen"] == "plain" and list(record["candidates"]) == ["plain"]
    assert "over the 0 s budget" in record["skipped"]["equalized"]


def test_choose_recipe_refuses_recipe_flags() -> None:
    with pytest.raises(InputError, match="choose_recipe picks the recipe itself; cle"):
        QuantConfig(recipe=Recipe(choose=RecipeChoice(), cle=True))
    flags = dict(cle=False, activation_equalization=False, bias_correction=False, adaround=False,
                 range_search=False, int16_budget=0.0, mixed_precision=False, budget_s=30.0)
    assert resolve_recipe("plain", **flags) == Recipe()
    assert resolve_recipe("plain", **flags | {"cle": True}) == Recipe(cle=True)
    equalized = resolve_recipe("equalized", **flags | {"adaround": True})
    assert equalized == dataclasses.replace(recipe.CANDIDATES["equalized"], adaround=AdaRound())
    assert resolve_recipe("auto", **flags) == Recipe(choose=RecipeChoice(30.0))
    with pytest.raises(InputError, match="--adaround cannot be given with it"):
        resolve_recipe("auto", **flags | {"adaround": True})
