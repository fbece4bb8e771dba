"""What each step of ``quantize`` did: one typed record per step, in the order the steps run.

A step that did not run leaves its record None. The records ``quantize`` writes itself are TypedDicts (plain dicts
at run time, so the report's JSON is the record as it is); the others are the ``summary()`` of the algorithm's result
(``EqualizeResult``, ``AdaRoundResult``, ...). ``as_dict`` gives the records that ran, in pipeline order, as the
report and a QAT checkpoint store them; ``from_dict`` reads that back.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict


class FoldedAffinesRecord(TypedDict):
    """Constant scales and shifts after convs (Mul / Add / Sub / Div) folded into them before anything is
    calibrated, so each such block has one output grid instead of one per node."""

    into: dict[str, str]  # each affine node folded away -> the conv that took it


class FloatHeadRecord(TypedDict):
    """The stem convs (and the chain after them) left in float because they run fastest so on this CPU."""

    nodes: list[str]
    max_k: int  # a conv reducing over at most this many inputs per output is a stem
    heads: list[dict[str, Any]]  # per stem: the chain tried and its latency ratios (``HeadChoice.summary``)
    dropped: str  # why a head was dropped (it would have left every conv in float), or ""


class FloatJoinsRecord(TypedDict):
    """Joins of tensors on very different scales (boxes and scores), and the nodes after them, left in float."""

    nodes: list[str]
    ratio: float  # the largest-|value| ratio between inputs from which a join stays float
    joins: list[dict[str, Any]]


class FloatSquaresRecord(TypedDict):
    """Squares read back by a root, logarithm or division (magnitudes, variances), with the nodes between, left in
    float."""

    nodes: list[str]
    chains: list[dict[str, Any]]  # per square: the square, the node reading it back, the nodes of the chain


class FloatFragileRecord(TypedDict):
    """Depthwise (grouped) convs whose output one 8-bit grid on their input ruins, left in float with the node that
    writes that input."""

    nodes: list[str]
    threshold_db: float  # a conv below this output SQNR, with its input alone rounded, stays float
    samples: int  # calibration samples measured on
    convs: list[dict[str, Any]]  # per fragile conv: its input, that SQNR, the producer kept with it


class CalibrationRecord(TypedDict, total=False):
    method: str  # the method asked for ("auto" when chosen)
    chosen: str  # with "auto": the method chosen
    samples: int
    tensors: int


class BiasCorrectionRecord(TypedDict):
    nodes: int
    samples: int
    mean_abs_shift: float


class FloatConvsRecord(TypedDict):
    """Float convs of the plan; those reading a quantized input through a DequantizeLinear of their own; any that
    ORT would still run on its own per-tensor int8 grid (opset below 13)."""

    float_convs: list[str]
    quantized_input_kept_float: list[str]
    int8_by_ort: list[str]


@dataclasses.dataclass
class QuantSteps:
    """The records of ``quantize``'s steps, None for a step that did not run (fields in pipeline order)."""

    folded_affines: FoldedAffinesRecord | None = None
    float_stem: FloatHeadRecord | None = None
    float_joins: FloatJoinsRecord | None = None
    float_squares: FloatSquaresRecord | None = None
    int16_plan: dict[str, Any] | None = None  # TensorPlan.summary(): the 16-bit tensors chosen within the budget
    recipe: dict[str, Any] | None = None  # recipe.choose's record: each candidate recipe's held-out score, the choice
    cle: dict[str, Any] | None = None  # EqualizeResult.summary()
    activation_equalization: dict[str, Any] | None = None  # StreamEqualizeResult.summary()
    pair_channels: dict[str, Any] | None = None  # PairChannelsResult.summary()
    float_fragile: FloatFragileRecord | None = None
    auto: dict[str, Any] | None = None  # choose_method's candidates and their held-out SQNR
    calibration: CalibrationRecord | None = None
    float_head_scored: dict[str, Any] | None = None  # the head chosen by score: nodes, share, each stem's candidates
    adaround: dict[str, Any] | None = None  # AdaRoundResult.summary()
    bias_correction: BiasCorrectionRecord | None = None
    range_search: dict[str, Any] | None = None  # RangeSearchResult.summary()
    conv_kernels: dict[str, Any] | None = None  # KernelChoice.summary()
    plan: dict[str, Any] | None = None  # QuantPlan.summary() and the tensors not emitted as planned
    float_convs: FloatConvsRecord | None = None

    @property
    def float_head_nodes(self) -> tuple[str, ...]:
        """The convs the float head (timed or scored) left in float (none without one)."""
        return tuple(self.float_stem["nodes"] if self.float_stem else ()) + tuple(
            self.float_head_scored["nodes"] if self.float_head_scored else ())

    def ran(self) -> list[str]:
        """The names of the steps that ran, in pipeline order."""
        return [f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None]

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.ran()}

    @classmethod
    def from_dict(cls, records: dict[str, Any]) -> QuantSteps:
        return cls(**records)
