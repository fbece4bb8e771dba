"""The recipe space the optimize verb searches: each knob of npukit's post-training quantization that changes what
the artifact computes or how fast it runs on the CPU, as a frozen ``Recipe`` and the choices a ``RecipeSpace`` offers.

A recipe is applied to the configuration ``npukit quantize`` would build with no flags (this CPU's scheme: activation
dtype, weight range, conv kernel choice), so the default recipe *is* the quantize verb's default. Two knobs read what
the first trial (the default recipe) measured once: the float head its timing chose (kept as exclusions, so no trial
times it again and every trial keeps the same head), and the layer sensitivity ranking (the k layers whose 8-bit step
adds most noise lifted to 16-bit activations or left in float).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from npukit.errors import InputError
from npukit.quant.calibration.observers import METHODS
from npukit.quant.config import ActivationEqualization, AdaRound, QuantConfig, RangeSearch

Lift = Literal["none", "int16", "float"]


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One point of the space. ``float_head``: the CPU's timed float head (as the default recipe chose it) kept;
    ``lift``/``lift_layers``: the ``lift_layers`` most sensitive layers lifted to 16-bit activations (int16) or
    left in float."""

    per_channel: bool = True
    method: str = "auto"
    cle: bool = False
    equalize_activations: bool = False
    bias_correction: bool = False
    float_head: bool = True
    lift: Lift = "none"
    lift_layers: int = 0
    adaround: bool = False
    range_search: bool = False

    def __post_init__(self) -> None:
        if self.lift not in ("none", "int16", "float"):
            raise InputError(f"unknown lift {self.lift!r}", hint="use none, int16 or float")
        if (self.lift == "none") != (self.lift_layers == 0):
            raise InputError(f"lift {self.lift!r} with {self.lift_layers} layers", hint="none goes with 0 layers")

    @property
    def lift_choice(self) -> str:
        """The lift as one categorical value: "none", "int16x2", "floatx1", ..."""
        return "none" if self.lift == "none" else f"{self.lift}x{self.lift_layers}"

    @staticmethod
    def parse_lift(value: str) -> tuple[Lift, int]:
        if value == "none":
            return "none", 0
        kind, count = value.split("x")
        return kind, int(count)  # type: ignore[return-value]

    def label(self) -> str:
        """A short name: granularity, method, then each step that is on."""
        parts = ["pc" if self.per_channel else "pt", self.method]
        parts += [name for name, on in (("cle", self.cle), ("ae", self.equalize_activations),
                                        ("bc", self.bias_correction), ("ada", self.adaround),
                                        ("rs", self.range_search)) if on]
        if not self.float_head:
            parts.append("no-head")
        if self.lift != "none":
            parts.append(self.lift_choice)
        return " ".join(parts)

    def params(self) -> dict[str, Any]:
        """The recipe as the study's parameters (``RecipeSpace.recipe`` reads them back)."""
        out = dataclasses.asdict(self)
        del out["lift"], out["lift_layers"]
        out["lift"] = self.lift_choice
        return out

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def config(self, base: QuantConfig, *, head: Sequence[str], ranking: Sequence[str]) -> QuantConfig:
        """``base`` (quantize's default configuration on this CPU, with the float head turned off) with this recipe:
        ``head`` the default recipe's float head nodes, ``ranking`` the quantized layers most sensitive first."""
        if base.precision.float_head is not None:
            raise ValueError("the base configuration must have no float head step: the search keeps the head the "
                             "default recipe chose once")
        scheme, steps = base.scheme, base.recipe
        exclude = scheme.exclude + (tuple(n for n in head if n not in scheme.exclude) if self.float_head else ())
        lifted = [n for n in ranking if n not in exclude][: self.lift_layers]
        int16 = scheme.int16_nodes + tuple(lifted) if self.lift == "int16" else scheme.int16_nodes
        if self.lift == "float":
            exclude += tuple(lifted)
        return (base.with_scheme(per_channel=self.per_channel, exclude=exclude, int16_nodes=int16)
                .with_calibration(method=self.method)
                .with_recipe(cle=self.cle, bias_correction=self.bias_correction,
                             activation_equalization=(steps.activation_equalization or ActivationEqualization())
                             if self.equalize_activations else None,
                             adaround=(steps.adaround or AdaRound()) if self.adaround else None,
                             range_search=(steps.range_search or RangeSearch()) if self.range_search else None))


DEFAULT = Recipe()  # npukit quantize with no recipe flags
# Tried right after the default, before the sampler proposes anything: the recovery recipe npukit documents (the
# demo's: CLE, activation equalization, bias correction; best on MobileNetV2 and the PP-OCR classifier in
# benchmarks/results/default_recipe.md, worse on YOLOX and PicoDet there), per-tensor (the faster kernels on some
# CPUs), and bias correction alone. A walk over known recipes first is how accuracy-driven tuners start too; the
# sampler then learns from them.
SEEDS: tuple[Recipe, ...] = (Recipe(cle=True, equalize_activations=True, bias_correction=True),
                             Recipe(per_channel=False), Recipe(bias_correction=True))


@dataclasses.dataclass(frozen=True)
class RecipeSpace:
    """The choices of each knob. ``name`` identifies it in the study (a resumed search must use the same space)."""

    name: str
    per_channel: tuple[bool, ...] = (True, False)
    method: tuple[str, ...] = METHODS
    cle: tuple[bool, ...] = (False, True)
    equalize_activations: tuple[bool, ...] = (False, True)
    bias_correction: tuple[bool, ...] = (False, True)
    float_head: tuple[bool, ...] = (True, False)
    lift: tuple[str, ...] = ("none", "int16x1", "int16x2", "int16x4", "floatx1", "floatx2", "floatx4")
    adaround: tuple[bool, ...] = (False,)
    range_search: tuple[bool, ...] = (False,)

    def knobs(self) -> dict[str, tuple[Any, ...]]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "name"}

    def size(self) -> int:
        total = 1
        for choices in self.knobs().values():
            total *= len(choices)
        return total

    def contains(self, recipe: Recipe) -> bool:
        params = recipe.params()
        return all(params[name] in choices for name, choices in self.knobs().items())

    def pruned(self, *, rankable: int, has_head: bool) -> tuple[RecipeSpace, list[str]]:
        """The space with the choices that cannot differ on this model removed, before anything is timed:
        lifting more layers than the model has quantized layers, and the float-head switch where the CPU's scheme
        chose no head. Returns the space and one line per pruning."""
        notes = []
        lift = tuple(v for v in self.lift if Recipe.parse_lift(v)[1] <= rankable)
        if lift != self.lift:
            notes.append(f"lift: at most {rankable} quantized layer(s) to lift; dropped "
                         f"{', '.join(v for v in self.lift if v not in lift)}")
        head = self.float_head if has_head else (True,)
        if head != self.float_head:
            notes.append("float head: the target's scheme kept no conv in float on this model; the switch is moot")
        return dataclasses.replace(self, lift=lift or ("none",), float_head=head), notes

    def suggest(self, trial: Any) -> Recipe:
        """The next recipe from an Optuna trial (a knob with one choice is not a parameter)."""
        params = {name: (trial.suggest_categorical(name, list(choices)) if len(choices) > 1 else choices[0])
                  for name, choices in self.knobs().items()}
        return self.recipe(params)

    def recipe(self, params: dict[str, Any]) -> Recipe:
        """A recipe from study parameters; knobs absent (one choice) take that choice."""
        values = {name: params.get(name, choices[0]) for name, choices in self.knobs().items()}
        kind, count = Recipe.parse_lift(values.pop("lift"))
        return Recipe(lift=kind, lift_layers=count, **values)


SPACES = {
    # every knob that costs at most a few calibration passes (MobileNetV2: 20-65 s a trial on 2 cores)
    "quick": RecipeSpace("quick"),
    # plus AdaRound and range search (minutes each per trial on MobileNetV2)
    "full": RecipeSpace("full", adaround=(False, True), range_search=(False, True)),
}


def get_space(name: str) -> RecipeSpace:
    if name not in SPACES:
        raise InputError(f"unknown search space {name!r}", hint=f"use one of {', '.join(SPACES)}")
    return SPACES[name]
