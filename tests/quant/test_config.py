from __future__ import annotations

import dataclasses

import pytest

from npukit.errors import InputError
from npukit.quant.config import (FLAT_NAMES, ActivationEqualization, AdaRound, CalibrationSpec, CpuKernels, FloatHead,
                                 Precision, QuantConfig, RangeSearch, Recipe, RecipeChoice, Scheme, from_flat,
                                 to_flat)


def test_defaults_are_per_channel_uint8_minmax() -> None:
    c = QuantConfig()
    assert (c.scheme.per_channel, c.scheme.symmetric_weights, c.scheme.activation_dtype,
            c.calibration.method) == (True, True, "uint8", "minmax")
    assert not c.scheme.activation_signed and Scheme(activation_dtype="int8").activation_signed
    assert c.recipe.steps() == [] and c.precision.float_head is None and not c.cpu.reduce_range


@pytest.mark.parametrize("kwargs", [
    {"method": "kl"}, {"activation_dtype": "int4"}, {"percentile": 40.0}, {"percentile": 100.5},
    {"num_bins": 100}, {"num_bins": 2050}, {"calib_samples": 0},
    {"int16_nodes": ("a",), "exclude": ("a",)}, {"gemm_convs": True, "reduce_range": True},
    {"adaround": True, "symmetric_weights": False}, {"adaround": True, "adaround_iterations": 0},
    {"activation_equalization": True, "activation_equalization_alpha": 1.5},
    {"range_search": True, "range_search_passes": 0}, {"choose_recipe": True, "recipe_budget_s": 0},
    {"choose_recipe": True, "cle": True}, {"choose_recipe": True, "int16_budget": 0.1}, {"int16_budget": 2.0},
    {"float_stem": True, "float_head_macs": 0.1}, {"float_head_macs": 1.5}, {"score_on": "gpu"}, {"bogus": 1},
])
def test_bad_values_raise_input_error(kwargs: dict) -> None:
    with pytest.raises(InputError):
        from_flat(**kwargs)


def test_a_step_with_options_is_its_record_or_none() -> None:
    """A step that takes options is on when its record is there (with those options) and off when it is None; a float
    head is timed here or chosen by accuracy within a MAC share, never both."""
    recipe = Recipe(adaround=AdaRound(iterations=7), range_search=RangeSearch(passes=1))
    assert recipe.steps() == ["adaround", "range_search"] and recipe.adaround.iterations == 7
    assert Precision(float_head=FloatHead()).timed_head and Precision(float_head=FloatHead()).head_share == 0.0
    scored = Precision(float_head=FloatHead("accuracy", 0.1))
    assert not scored.timed_head and scored.head_share == 0.1
    for bad in (lambda: FloatHead("accuracy"), lambda: FloatHead("latency", 0.1), lambda: FloatHead("flops"),
                lambda: Recipe(choose=RecipeChoice(), bias_correction=True)):
        with pytest.raises(InputError):
            bad()


def test_flat_names_map_onto_the_parts() -> None:
    """quantize's flat vocabulary (its flags, older reports) builds the same config as the parts do."""
    flat = from_flat(per_channel=False, exclude=["fc"], method="auto", calib_samples=8, cle=True,
                     activation_equalization=True, activation_equalization_alpha=0.3, adaround=True,
                     adaround_iterations=5, float_stem=True, int16_budget=0.2, reduce_range=True, pair_channels=False)
    parts = QuantConfig(scheme=Scheme(per_channel=False, exclude=("fc",)),
                        calibration=CalibrationSpec(method="auto", samples=8),
                        recipe=Recipe(cle=True, activation_equalization=ActivationEqualization(0.3),
                                      adaround=AdaRound(5)),
                        precision=Precision(float_head=FloatHead(), int16_budget=0.2),
                        cpu=CpuKernels(reduce_range=True, pair_channels=False))
    assert flat == parts
    assert from_flat(choose_recipe=True, recipe_budget_s=30).recipe.choose == RecipeChoice(30.0)
    assert from_flat(float_head_macs=0.1).precision.float_head == FloatHead("accuracy", 0.1)
    assert from_flat(adaround=False, adaround_iterations=5).recipe.adaround is None
    assert set(FLAT_NAMES) >= {"gemm_convs", "range_search_passes", "score_on", "float_fragile"}
    for config in (flat, parts, QuantConfig(), from_flat(choose_recipe=True), from_flat(float_head_macs=0.2)):
        assert from_flat(**to_flat(config)) == config and set(to_flat(config)) == set(FLAT_NAMES)


def test_with_replaces_fields_of_one_part() -> None:
    base = QuantConfig(scheme=Scheme(exclude=("a",)), recipe=Recipe(cle=True))
    moved = base.with_scheme(exclude=("a", "b")).with_calibration(method="mse").with_cpu(reduce_range=True)
    assert moved.scheme.exclude == ("a", "b") and moved.calibration.method == "mse" and moved.cpu.reduce_range
    assert moved.recipe == base.recipe and base.scheme.exclude == ("a",)
    with pytest.raises(InputError):  # validated again across the parts
        base.with_recipe(adaround=AdaRound()).with_scheme(symmetric_weights=False)


def test_lists_become_tuples_and_reports_read_part_by_part() -> None:
    c = QuantConfig(scheme=Scheme(exclude=["fc"], int16_nodes=["conv1"]))
    assert c.scheme.exclude == ("fc",) and c.scheme.int16_nodes == ("conv1",)
    as_dict = c.as_dict()
    assert as_dict["scheme"]["exclude"] == ("fc",) and set(as_dict) == {f.name for f in dataclasses.fields(c)}
