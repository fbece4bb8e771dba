"""Target profiles as data: which ops a backend takes, under which constraints, and the quantization it needs.

A profile is read by generic code (``partition.analyze``, ``fix.apply_fixes``); nothing outside a profile module
knows a target by name. A constraint is a small object whose ``check(node)`` returns None when the node satisfies it
and otherwise one line saying why not ("Conv: dilation > 1 with stride > 1 not supported").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

FLOAT_DTYPES = frozenset({"float32", "float16", "bfloat16", "float64"})
SMALL_CONSTANT = 16  # elements of a constant whose values a rule may read
QUANT_DTYPES = frozenset({"uint8", "int8", "uint16", "int16", "int4", "uint4"})
INDEX_DTYPES = frozenset({"int32", "int64", "bool"})


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """dtype name ("float32", "uint8", ...; None if unknown), shape (ints, dim names or None), constant or not, a
    small constant's values (axes, pads, exponents: up to ``SMALL_CONSTANT`` elements, flattened; else None),
    ``from_shapes``: not a constant, but computed from the input shapes and constants alone (Shape -> Gather ->
    Concat), so a constant once the shapes are static and folded, and ``overridable``: an initializer the model
    also lists as a graph input, which ONNX Runtime (IR version 4 on) lets a caller override, so its execution
    providers do not take it for a constant; ``shifted_zero_points``: dequantized per channel from int8 with a
    non-zero zero point somewhere (weights ``npukit quantize`` moved onto ORT's integer GEMM on a VNNI CPU)."""

    dtype: str | None
    shape: tuple[int | str | None, ...] | None
    constant: bool = False
    values: tuple[float, ...] | None = None
    from_shapes: bool = False
    overridable: bool = False
    shifted_zero_points: bool = False

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What a rule sees of one node (or one QDQ node unit: then dtypes are the quantized ones)."""

    op_type: str
    domain: str
    attributes: Mapping[str, Any]
    inputs: tuple[TensorInfo | None, ...]  # None for an omitted optional input
    outputs: tuple[TensorInfo, ...]
    quantized: bool = False

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attributes.get(name, default)


class Constraint(Protocol):
    def check(self, node: NodeInfo) -> str | None: ...


@dataclasses.dataclass(frozen=True)
class AttrIn:
    """Attribute ``name`` (``default`` when absent) must be one of ``allowed``."""

    name: str
    allowed: tuple[Any, ...]
    default: Any = None

    def check(self, node: NodeInfo) -> str | None:
        value = node.attr(self.name, self.default)
        if value in self.allowed:
            return None
        return f"{node.op_type}: {self.name} {value!r} not supported (supported: {', '.join(map(repr, self.allowed))})"


@dataclasses.dataclass(frozen=True)
class AllAttrValuesAtMost:
    """Every element of list attribute ``name`` must be <= ``limit`` (e.g. dilations 1)."""

    name: str
    limit: int

    def check(self, node: NodeInfo) -> str | None:
        values = node.attr(self.name) or ()
        if all(v <= self.limit for v in values):
            return None
        return f"{node.op_type}: {self.name} {list(values)} not supported (each must be <= {self.limit})"


@dataclasses.dataclass(frozen=True)
class NoDilationWithStride:
    """Dilation > 1 and stride > 1 together are not supported."""

    def check(self, node: NodeInfo) -> str | None:
        dilated = any(d > 1 for d in node.attr("dilations") or ())
        strided = any(s > 1 for s in node.attr("strides") or ())
        return f"{node.op_type}: dilation > 1 with stride > 1 not supported" if dilated and strided else None


OPEN_SHAPES = "needs static shapes"  # in every reason a shape fix clears (fix_input_shape, fold_constants)
OVERRIDABLE = "also a graph input"  # in every reason initializers_as_constants clears


def unchecked(node: NodeInfo, unknown: str) -> str:
    """The reason for a node a rule cannot be checked on, ``unknown`` saying what is unknown in the model as given
    (an input's rank, a size, an axes input computed from Shape nodes) and what it leaves open: not the rule's
    refusal, which would name a wrong cause, but the open shapes, which the shape fixes clear (analyze names them).
    On a target that requires static shapes the analysis drops it for its own static-shapes reason."""
    return (f"{node.op_type}: {unknown} ({OPEN_SHAPES}: fix the input shape and fold the constants the sizes are "
            "computed from, as analyze --fix does)")


@dataclasses.dataclass(frozen=True)
class InputRank:
    """Input ``index`` must have a rank in [min_rank, max_rank]; an unknown rank cannot be checked (``unchecked``)."""

    index: int = 0
    min_rank: int = 0
    max_rank: int = 8

    def check(self, node: NodeInfo) -> str | None:
        if self.index >= len(node.inputs) or node.inputs[self.index] is None:
            return None
        rank = node.inputs[self.index].rank  # type: ignore[union-attr]
        limits = f"rank {self.min_rank}..{self.max_rank}"
        if rank is None:
            return unchecked(node, f"the input's rank is unknown here, so {limits} cannot be checked")
        if self.min_rank <= rank <= self.max_rank:
            return None
        return f"{node.op_type}: input rank {rank} not supported ({limits})"


@dataclasses.dataclass(frozen=True)
class ConstantInput:
    """Input ``index``, when present, must be a constant (initializer or Constant output)."""

    index: int
    label: str

    def check(self, node: NodeInfo) -> str | None:
        if self.index >= len(node.inputs) or node.inputs[self.index] is None:
            return None
        tensor = node.inputs[self.index]
        if tensor.constant:  # type: ignore[union-attr]
            return None
        if tensor.overridable:  # type: ignore[union-attr]
            return (f"{node.op_type}: {self.label} must be constant (an initializer {OVERRIDABLE}: ONNX Runtime "
                    "lets a caller override it)")
        if tensor.from_shapes:  # type: ignore[union-attr]
            return unchecked(node, f"its {self.label} is computed from the input's shapes here, a constant (as it "
                                   "must be) only once they are folded")
        return f"{node.op_type}: {self.label} must be constant"


@dataclasses.dataclass(frozen=True)
class AttrPredicate:
    """A constraint written as a function of the node: ``test(node)`` True means fine, False ``message``; None
    means it cannot be told on what is known of the node here (``unknown`` says what is missing, an input's rank, a
    shape, an axes input computed from Shape nodes, and what that leaves open), which is reported as such
    (``unchecked``), not as ``message``."""

    test: Callable[[NodeInfo], bool | None]
    message: str
    unknown: str | None = None

    def check(self, node: NodeInfo) -> str | None:
        verdict = self.test(node)
        if verdict is None:
            return unchecked(node, self.unknown or f"the shapes or values it reads are unknown here, so "
                                                   f"{self.message!r} cannot be checked")
        return None if verdict else f"{node.op_type}: {self.message}"


STEPS_UNKNOWN = "its steps are not a constant here, so whether they are all 1 cannot be told"


def unit_steps(node: NodeInfo) -> bool | None:
    """A Slice whose steps (input 4) are absent or all 1; None where steps are given but not a small constant."""
    steps = node.inputs[4] if len(node.inputs) > 4 else None
    if steps is None:
        return True
    return None if steps.values is None else all(s == 1 for s in steps.values)


@dataclasses.dataclass(frozen=True)
class OpRule:
    """How a target takes one op type. ``dtypes`` None means the profile's default dtypes."""

    op_type: str
    dtypes: frozenset[str] | None = None
    min_rank: int = 0
    max_rank: int | None = None
    constraints: tuple[Constraint, ...] = ()
    notes: str = ""
    domain: str = ""

    def failures(self, node: NodeInfo, *, default_dtypes: frozenset[str], max_rank: int | None) -> list[str]:
        """Every reason this node does not satisfy the rule (empty when it does)."""
        reasons: list[str] = []
        allowed = self.dtypes if self.dtypes is not None else default_dtypes
        seen: set[str] = set()
        for tensor in (*node.inputs, *node.outputs):
            if tensor is None or tensor.dtype is None or tensor.dtype in allowed or tensor.dtype in seen:
                continue
            seen.add(tensor.dtype)
            reasons.append(f"{node.op_type}: dtype {tensor.dtype} not supported (supported: "
                           f"{', '.join(sorted(allowed))})")
        limit = self.max_rank if self.max_rank is not None else max_rank
        for tensor in (*node.inputs, *node.outputs):  # activations: stored data (overridable too) is not checked
            if tensor is None or tensor.constant or tensor.overridable or tensor.rank is None:
                continue
            if (limit is not None and tensor.rank > limit) or tensor.rank < self.min_rank:
                reasons.append(f"{node.op_type}: rank {tensor.rank} not supported "
                               f"(rank {self.min_rank}..{limit if limit is not None else 'any'})")
                break
        for constraint in self.constraints:
            why = constraint.check(node)
            if why:
                reasons.append(why)
        return reasons


@dataclasses.dataclass(frozen=True)
class PatternStep:
    """One node of a fusion pattern: its op type, its inputs (``"x"``: the pattern's input, an int: the output of
    that earlier step, ``"*"``: anything else, e.g. a constant; in any order) and attribute values it must have."""

    op_type: str
    inputs: tuple[str | int, ...]
    attributes: Mapping[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Fusion:
    """Nodes a backend fuses into one op of its own (``into``) before checking it; each pattern is one form.

    The intermediate results of a matched pattern must be used only inside it. The fused group is checked against
    the rule for ``into`` with the pattern's input, the last step's output and the last step's attributes. ``input_ranks``: the ranks of the
    pattern's input the backend fuses at (empty: any); at another rank, or an unknown one, each node is checked on
    its own.
    """

    name: str
    into: str
    patterns: tuple[tuple[PatternStep, ...], ...]
    notes: str = ""
    input_ranks: tuple[int, ...] = ()


# GELU as torch's exporters write it without a Gelu op, x * 0.5 * (1 + Erf(x / sqrt(2))), in its exported orders
ERF_GELU_PATTERNS: tuple[tuple[PatternStep, ...], ...] = (
    (PatternStep("Div", ("x", "*")), PatternStep("Erf", (0,)), PatternStep("Add", (1, "*")),
     PatternStep("Mul", (2, "*")), PatternStep("Mul", ("x", 3))),
    (PatternStep("Div", ("x", "*")), PatternStep("Erf", (0,)), PatternStep("Add", (1, "*")),
     PatternStep("Mul", ("x", 2)), PatternStep("Mul", (3, "*"))),
    (PatternStep("Div", ("x", "*")), PatternStep("Erf", (0,)), PatternStep("Add", (1, "*")),
     PatternStep("Mul", ("x", "*")), PatternStep("Mul", (2, 3))),
)


@dataclasses.dataclass(frozen=True)
class HazardSite:
    """What a Hazard's condition sees of one match: the pattern's input tensor, the op that produces it (looking
    through Q/DQ; None for a graph input or a constant), and its quantized dtype (None in a float model)."""

    input: TensorInfo
    producer: str | None
    activation_dtype: str | None


@dataclasses.dataclass(frozen=True)
class Hazard:
    """A node pattern a backend takes but computes wrongly, as measured: where ``applies(site)`` holds, the backend's
    result differs from the model's. ``patterns`` are PatternStep forms (matched through Q/DQ pairs), their input
    produced by one of ``producers`` (empty: any; looking through ``transparent`` ops whose other inputs are
    constant, which the backend folds into the op before them) and quantized to one of ``activation_dtypes``
    (empty: any); a float model counts as quantized to ``float_as`` (the activations npukit's quantization gives
    the target; None: a float model is not affected). ``fix`` names the rewrite
    (``npukit.targets.hazards.REWRITES``) after which the backend computes it right; ``evidence`` says how it was
    measured."""

    name: str
    patterns: tuple[tuple[PatternStep, ...], ...]
    applies: Callable[[HazardSite], bool]
    reason: str
    producers: tuple[str, ...] = ()
    transparent: tuple[str, ...] = ()
    activation_dtypes: tuple[str, ...] = ()
    float_as: str | None = None
    fix: str | None = None
    evidence: str = ""

    def check(self, site: HazardSite) -> bool:
        """Whether this hazard hits ``site``."""
        if self.producers and site.producer not in self.producers:
            return False
        dtype = site.activation_dtype if site.activation_dtype is not None else self.float_as
        if dtype is None or (self.activation_dtypes and dtype not in self.activation_dtypes):
            return False
        return bool(self.applies(site))


GRAPH_OPTIMIZATIONS = (None, "ort-basic")


@dataclasses.dataclass(frozen=True)
class Quantization:
    """What a target needs from a quantized model, and whether it takes float at all."""

    weights: str
    activations: tuple[str, ...]
    accepts_float: bool
    float_note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class DocSource:
    title: str
    url: str
    version: str

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class TargetProfile:
    """One backend, as data.

    ``dtypes`` is the default set of tensor dtypes an op rule accepts; ``max_rank`` the default largest rank.
    ``qdq_units`` says the backend takes DQ -> op -> Q as one quantized op; ``drops_lone_qdq_partitions`` that a
    partition made of a single Q or DQ node is left to the CPU; ``graph_io_qdq_on_cpu`` that a Q reading a graph
    input or a DQ writing a graph output stays on the CPU, except where the output comes from one of the
    ``layout_ops`` (run in the backend's layout): the layout transform then puts a Transpose, taken with that DQ,
    before the graph output. ``fusions`` are node patterns the backend fuses into one
    op of its own and checks as that op. ``graph_optimizations`` names the graph optimizations the runtime applies
    before the backend partitions the model ("ort-basic": ONNX Runtime's basic level), which ``analyze`` applies
    too. ``substitutions`` names the fix rules (``npukit.targets.fix.FIXES``) the target wants, in order of
    preference. ``hazards`` are patterns the backend takes but computes wrongly (``Hazard``), each with its rewrite.
    """

    name: str
    display_name: str
    sources: tuple[DocSource, ...]
    ops: Mapping[str, OpRule]
    quantization: Quantization
    layout: str
    requires_static_shapes: bool
    dtypes: frozenset[str]
    max_rank: int | None = None
    known_limits: tuple[str, ...] = ()
    substitutions: tuple[str, ...] = ()
    qdq_units: bool = True
    drops_lone_qdq_partitions: bool = False
    graph_io_qdq_on_cpu: bool = False
    layout_ops: frozenset[str] = frozenset()
    fusions: tuple[Fusion, ...] = ()
    graph_optimizations: str | None = None
    variants: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    hazards: tuple[Hazard, ...] = ()

    def __post_init__(self) -> None:
        if self.layout not in ("NCHW", "NHWC"):
            raise ValueError(f"profile {self.name}: layout must be NCHW or NHWC, got {self.layout!r}")
        for key, rule in self.ops.items():
            if key != rule.op_type:
                raise ValueError(f"profile {self.name}: ops[{key!r}] holds a rule for {rule.op_type!r}")
        if self.graph_optimizations not in GRAPH_OPTIMIZATIONS:
            raise ValueError(f"profile {self.name}: graph_optimizations must be one of {GRAPH_OPTIMIZATIONS}")

    def rule_for(self, op_type: str, domain: str = "") -> OpRule | None:
        """The rule for ``op_type`` in ``domain`` ("" and "ai.onnx" are the same), or None."""
        rule = self.ops.get(op_type)
        if rule is None or normalize_domain(rule.domain) != normalize_domain(domain):
            return None
        return rule

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "sources": [s.as_dict() for s in self.sources],
            "ops": sorted(self.ops),
            "quantization": self.quantization.as_dict(),
            "layout": self.layout,
            "requires_static_shapes": self.requires_static_shapes,
            "dtypes": sorted(self.dtypes),
            "max_rank": self.max_rank,
            "known_limits": list(self.known_limits),
            "substitutions": list(self.substitutions),
            "fusions": [f.name for f in self.fusions],
            "graph_optimizations": self.graph_optimizations,
            "hazards": [{"name": h.name, "reason": h.reason, "fix": h.fix} for h in self.hazards],
        }


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def rules(op_types: Sequence[str] | str, **common: Any) -> dict[str, OpRule]:
    """OpRules without op-specific constraints for several op types (``op_types`` may be a space-separated string)."""
    names = op_types.split() if isinstance(op_types, str) else list(op_types)
    return {name: OpRule(name, **common) for name in names}


def with_rules(base: Mapping[str, OpRule], *extra: OpRule) -> dict[str, OpRule]:
    """``base`` with the given rules added or replacing those of the same op type."""
    merged = dict(base)
    for rule in extra:
        merged[rule.op_type] = rule
    return merged
