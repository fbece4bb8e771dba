"""The recipe space: recipes map onto QuantConfig as documented, round-trip through study parameters, and pruning
drops only the choices that cannot differ on the model."""

from __future__ import annotations

import optuna
import pytest

from npukit.errors import InputError
from npukit.quant.config import CalibrationSpec, CpuKernels, FloatHead, Precision, QuantConfig, Scheme
from npukit.search.space import DEFAULT, SPACES, Recipe, get_space

BASE = QuantConfig(scheme=Scheme(exclude=("user",)),
                   calibration=CalibrationSpec(method="auto"),
                   cpu=CpuKernels(reduce_range=True))
HEAD = ("stem", "dw")
RANKING = ("stem", "c3", "c4", "c5")


def test_the_default_recipe_is_quantize_with_its_head() -> None:
    config = DEFAULT.config(BASE, head=HEAD, ranking=RANKING)
    assert config.scheme.exclude == ("user", "stem", "dw")
    assert config.scheme.int16_nodes == () and not config.recipe.cle and config.scheme.per_channel
    assert config.calibration.method == "auto"
    assert config.cpu.reduce_range  # the CPU's scheme carried from the base


def test_lifts_take_the_most_sensitive_layers_not_already_float() -> None:
    int16 = Recipe(lift="int16", lift_layers=2).config(BASE, head=HEAD, ranking=RANKING)
    assert int16.scheme.int16_nodes == ("c3", "c4")  # "stem" is in the float head
    floats = Recipe(lift="float", lift_layers=2, float_head=False).config(BASE, head=HEAD, ranking=RANKING)
    assert floats.scheme.exclude == ("user", "stem", "c3") and floats.scheme.int16_nodes == ()


def test_the_base_must_not_time_a_head_again() -> None:
    with pytest.raises(ValueError):
        DEFAULT.config(QuantConfig(precision=Precision(float_head=FloatHead())), head=(), ranking=())
    with pytest.raises(ValueError):  # nor choose a scored one (the mobile base) again per trial
        DEFAULT.config(QuantConfig(precision=Precision(float_head=FloatHead("accuracy", 0.1))), head=(), ranking=())


def test_params_round_trip_and_the_default_is_in_every_space() -> None:
    space = get_space("full")
    recipe = Recipe(per_channel=False, method="mse", cle=True, lift="float", lift_layers=4, adaround=True)
    assert space.recipe(recipe.params()) == recipe
    assert all(s.contains(DEFAULT) for s in SPACES.values())
    assert not SPACES["quick"].contains(recipe)  # AdaRound is not in the quick space
    assert SPACES["quick"].size() == 2 * 5 * 2 * 2 * 2 * 2 * 7


def test_suggest_reads_an_optuna_trial() -> None:
    space = SPACES["quick"]
    recipe = Recipe(method="entropy", bias_correction=True, lift="int16", lift_layers=1)
    params = {k: v for k, v in recipe.params().items() if len(space.knobs()[k]) > 1}
    assert space.suggest(optuna.trial.FixedTrial(params)) == recipe


def test_pruning_drops_lifts_past_the_layers_and_a_moot_head() -> None:
    space, notes = SPACES["quick"].pruned(rankable=2, has_head=False)
    assert space.lift == ("none", "int16x1", "int16x2", "floatx1", "floatx2") and space.float_head == (True,)
    assert len(notes) == 2 and "floatx4" in notes[0]
    same, none = SPACES["quick"].pruned(rankable=10, has_head=True)
    assert same == SPACES["quick"] and none == []


def test_bad_recipes_and_spaces_are_input_errors() -> None:
    with pytest.raises(InputError):
        Recipe(lift="int4", lift_layers=1)
    with pytest.raises(InputError):
        Recipe(lift="none", lift_layers=2)
    with pytest.raises(InputError, match="unknown search space"):
        get_space("huge")
