from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npukit.memory.lifetimes import Lifetimes
from npukit.memory.planners import (
    ALIGNMENT, PLANNERS, PlanInvariantError, align, all_plans, best_plan, check_plan, lower_bound, plan_naive,
)

intervals = st.lists(
    st.tuples(st.integers(0, 5000), st.integers(0, 40), st.integers(0, 12)),
    min_size=0, max_size=40,
).map(lambda items: Lifetimes.from_intervals(
    (f"t{i}", size, start, start + length) for i, (size, start, length) in enumerate(items)))


def _brute_force_peak(lifetimes: Lifetimes) -> int:
    steps = range(lifetimes.num_steps)
    return max((sum(t.size for t in lifetimes.tensors if t.start <= s <= t.end) for s in steps), default=0)


@settings(max_examples=150, deadline=None)
@given(intervals)
def test_every_planner_keeps_the_invariant(lifetimes):
    plans = all_plans(lifetimes)  # checks each plan
    assert set(plans) == set(PLANNERS)
    bound = lower_bound(lifetimes)
    assert bound == _brute_force_peak(lifetimes)
    best = best_plan(lifetimes, plans.values())
    for plan in plans.values():
        assert best.arena_bytes <= plan.arena_bytes
        assert plan.arena_bytes >= bound
        assert all(offset % ALIGNMENT == 0 for offset in plan.offsets.values())
    assert plans["naive"].arena_bytes == sum(align(t.size) for t in lifetimes.tensors)


def test_check_plan_catches_shared_bytes_misalignment_and_a_short_arena():
    lifetimes = Lifetimes.from_intervals([("a", 100, 0, 2), ("b", 100, 1, 3), ("c", 100, 3, 4)])
    good = best_plan(lifetimes)
    assert good.arena_bytes == 2 * align(100)  # c reuses a's bytes
    assert good.offsets["a"] == good.offsets["c"]
    clash = dataclasses.replace(good, offsets={**good.offsets, "b": good.offsets["a"]})
    with pytest.raises(PlanInvariantError, match="share bytes"):
        check_plan(lifetimes, clash)
    with pytest.raises(PlanInvariantError, match="aligned"):
        check_plan(lifetimes, dataclasses.replace(good, offsets={**good.offsets, "c": 8}))
    with pytest.raises(PlanInvariantError, match="past the arena"):
        check_plan(lifetimes, dataclasses.replace(good, arena_bytes=100))
    with pytest.raises(PlanInvariantError, match="no offset"):
        check_plan(lifetimes, dataclasses.replace(plan_naive(lifetimes), offsets={"a": 0}))


def test_greedy_beats_naive_on_a_chain():
    lifetimes = Lifetimes.from_intervals([(f"t{i}", 1000, i, i + 1) for i in range(10)])
    plans = all_plans(lifetimes)
    assert plans["naive"].arena_bytes == 10 * align(1000)
    assert plans["greedy_by_size"].arena_bytes == plans["greedy_by_breadth"].arena_bytes == 2 * align(1000)
