"""Offset planners: place every buffer of a :class:`~npukit.memory.lifetimes.Lifetimes` in one arena so that buffers
live at the same step never share bytes. Each planner is a plain function returning a :class:`MemoryPlan`;
:func:`check_plan` verifies the invariant and :func:`best_plan` keeps the smallest arena of all of them.

Offsets are aligned to 64 bytes, as ORT's CPU arena aligns its blocks. No plan can beat :func:`lower_bound`, the most
bytes live at one step.

- naive: no reuse, buffers one after another (the arena is the sum of the sizes);
- greedy by size: biggest buffer first, each at the lowest offset that clears every placed buffer whose lifetime
  overlaps its own;
- greedy by breadth (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020): steps
  with the most live bytes first, and within a step its unplaced buffers biggest first, each into the smallest gap
  between overlapping placed buffers that fits it (best fit), else on top.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from npukit.memory.lifetimes import Lifetimes, TensorLife

ALIGNMENT = 64


class PlanInvariantError(AssertionError):
    """A plan breaks the invariant: a planner bug, never bad user input."""


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Offsets (bytes into the arena) per buffer name, the arena size, the execution order it was made for and the
    algorithm that made it."""

    algorithm: str
    order: tuple[str, ...]
    offsets: Mapping[str, int]
    arena_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {"algorithm": self.algorithm, "arena_bytes": self.arena_bytes, "order": list(self.order),
                "offsets": dict(self.offsets)}


def align(size: int, alignment: int = ALIGNMENT) -> int:
    return -(-size // alignment) * alignment


def lower_bound(lifetimes: Lifetimes) -> int:
    """The most bytes live at one step: no plan's arena is smaller."""
    return lifetimes.peak_bytes


def plan_naive(lifetimes: Lifetimes) -> MemoryPlan:
    offsets: dict[str, int] = {}
    top = 0
    for t in lifetimes.tensors:
        offsets[t.name] = top
        top += align(t.size)
    return _plan("naive", lifetimes, offsets)


class _Placed:
    """Placed buffers indexed by step, to find those overlapping a lifetime without scanning them all."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self._at: dict[int, list[TensorLife]] = {}

    def add(self, t: TensorLife, offset: int) -> None:
        self.offsets[t.name] = offset
        for step in range(t.start, t.end + 1):
            self._at.setdefault(step, []).append(t)

    def taken(self, t: TensorLife) -> list[tuple[int, int]]:
        """Byte ranges of placed buffers live at some step of ``t``'s lifetime, by offset."""
        seen: dict[str, tuple[int, int]] = {}
        for step in range(t.start, t.end + 1):
            for other in self._at.get(step, ()):
                if other.name not in seen:
                    offset = self.offsets[other.name]
                    seen[other.name] = (offset, offset + align(other.size))
        return sorted(seen.values())


def plan_greedy_by_size(lifetimes: Lifetimes) -> MemoryPlan:
    placed = _Placed()
    for t in sorted(lifetimes.tensors, key=lambda t: (-t.size, t.start, t.name)):
        taken = placed.taken(t)
        offset = 0
        for lo, hi in taken:  # first fit: the lowest gap the buffer fits in
            if offset + align(t.size) <= lo:
                break
            offset = max(offset, hi)
        placed.add(t, offset)
    return _plan("greedy_by_size", lifetimes, placed.offsets)


def plan_greedy_by_breadth(lifetimes: Lifetimes) -> MemoryPlan:
    by_step: dict[int, list[TensorLife]] = {}
    for t in lifetimes.tensors:
        for step in range(t.start, t.end + 1):
            by_step.setdefault(step, []).append(t)
    breadth = {step: sum(t.size for t in live) for step, live in by_step.items()}
    placed = _Placed()
    for step in sorted(by_step, key=lambda s: (-breadth[s], s)):
        for t in sorted(by_step[step], key=lambda t: (-t.size, t.start, t.name)):
            if t.name in placed.offsets:
                continue
            need = align(t.size)
            taken = placed.taken(t)
            best: tuple[int, int] | None = None  # (gap size, offset)
            cursor = 0
            for lo, hi in taken:
                if lo - cursor >= need and (best is None or lo - cursor < best[0]):
                    best = (lo - cursor, cursor)
                cursor = max(cursor, hi)
            placed.add(t, best[1] if best is not None else cursor)
    return _plan("greedy_by_breadth", lifetimes, placed.offsets)


PLANNERS: dict[str, Callable[[Lifetimes], MemoryPlan]] = {
    "naive": plan_naive,
    "greedy_by_size": plan_greedy_by_size,
    "greedy_by_breadth": plan_greedy_by_breadth,
}


def all_plans(lifetimes: Lifetimes) -> dict[str, MemoryPlan]:
    """Every planner's plan, each checked."""
    plans = {name: planner(lifetimes) for name, planner in PLANNERS.items()}
    for plan in plans.values():
        check_plan(lifetimes, plan)
    return plans


def best_plan(lifetimes: Lifetimes, plans: Iterable[MemoryPlan] | None = None) -> MemoryPlan:
    """The checked plan with the smallest arena (ties go to the earlier planner)."""
    candidates = list(plans) if plans is not None else list(all_plans(lifetimes).values())
    for plan in candidates:
        check_plan(lifetimes, plan)
    return min(candidates, key=lambda p: p.arena_bytes)


def check_plan(lifetimes: Lifetimes, plan: MemoryPlan) -> None:
    """Raise PlanInvariantError unless every buffer has an aligned offset, fits in the arena, and shares no byte
    with a buffer live at the same step."""
    missing = [t.name for t in lifetimes.tensors if t.name not in plan.offsets]
    if missing:
        raise PlanInvariantError(f"{plan.algorithm}: no offset for {missing[0]!r} ({len(missing)} missing)")
    for t in lifetimes.tensors:
        offset = plan.offsets[t.name]
        if offset < 0 or offset % ALIGNMENT:
            raise PlanInvariantError(f"{plan.algorithm}: {t.name!r} at offset {offset} is not {ALIGNMENT}-aligned")
        if offset + t.size > plan.arena_bytes:
            raise PlanInvariantError(f"{plan.algorithm}: {t.name!r} ends at {offset + t.size}, "
                                     f"past the arena of {plan.arena_bytes}")
    # Sweep the steps: at each step the live buffers, sorted by offset, must not overlap their successor.
    starts: dict[int, list[TensorLife]] = {}
    for t in lifetimes.tensors:
        if t.size:
            starts.setdefault(t.start, []).append(t)
    live: list[TensorLife] = []
    for step in range(lifetimes.num_steps):
        live = [t for t in live if t.end >= step] + starts.get(step, [])
        if step not in starts:
            continue  # nothing new: the live set is a subset of the previous one, already checked
        ranked = sorted(live, key=lambda t: plan.offsets[t.name])
        for a, b in zip(ranked, ranked[1:]):
            if plan.offsets[a.name] + a.size > plan.offsets[b.name]:
                raise PlanInvariantError(f"{plan.algorithm}: {a.name!r} and {b.name!r} are both live at step "
                                         f"{step} and share bytes")


def _plan(algorithm: str, lifetimes: Lifetimes, offsets: dict[str, int]) -> MemoryPlan:
    arena = max((offsets[t.name] + align(t.size) for t in lifetimes.tensors), default=0)
    return MemoryPlan(algorithm=algorithm, order=lifetimes.order, offsets=offsets, arena_bytes=arena)
