"""The search on Ray Tune: with the same batch size, seed and figures it proposes and chooses what the serial search
does; the trials run in two worker processes; Ray is stopped and its files removed afterwards; a wrong cluster
address fails in seconds."""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from npukit.errors import InputError  # noqa: E402
from npukit.search.distributed import RayTrials, reachable  # noqa: E402
from npukit.search.study import SearchConfig, run_study  # noqa: E402
from npukit.search.trial import Built, TrialBuilder  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_study import SPACE, fake  # noqa: E402


class FakeBuilder(TrialBuilder):
    """Builds nothing: says which process it ran in (the figures come from ``fake`` in the driver)."""

    def build(self, recipe):
        return Built(recipe, None, metric_name=str(os.getpid()))


@pytest.mark.parametrize("sampler", ["tpe", "nsga2"])  # NSGA-II's sampler holds a lock (Tune pickles its searcher)
def test_ray_proposes_and_chooses_what_the_serial_search_does(sampler: str) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module
    config = SearchConfig(trials=8, seed=4, batch=2, sampler=sampler)
    serial = run_study(fake, SPACE, config, name="serial")
    before = set(os.listdir(tempfile.gettempdir()))
    pids = []

    def finish(built):
        pids.append(int(built.metric_name))
        return fake(built.recipe)

    with RayTrials(FakeBuilder(model=None, calib=[], evaluation=[], gate=None, base=None), workers=2) as pool:
        on_ray = run_study(None, SPACE, config, name="ray", drive=lambda loop: pool.drive(loop, finish))
    assert [m.recipe for m in on_ray.trials] == [m.recipe for m in serial.trials]
    assert on_ray.trials == serial.trials and on_ray.front == serial.front and on_ray.chosen == serial.chosen
    assert len(pids) == on_ray.measured_now == 8 and len(set(pids)) == 2 and os.getpid() not in pids
    assert not ray.is_initialized()
    assert not [n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("npukit-ray-")]


def test_a_batch_proposes_other_recipes_than_one_at_a_time_and_is_checked() -> None:
    one = run_study(fake, SPACE, SearchConfig(trials=8, seed=4), name="one")
    two = run_study(fake, SPACE, SearchConfig(trials=8, seed=4, batch=2), name="two")
    assert [m.recipe for m in one.trials][:4] == [m.recipe for m in two.trials][:4]  # the enqueued ones
    with pytest.raises(InputError):
        SearchConfig(batch=0)
    assert dataclasses.replace(SearchConfig(), batch=3).batch == 3


def test_a_wrong_cluster_address_fails_at_once() -> None:
    with pytest.raises(InputError, match="nothing answers at the Ray address"):
        reachable("127.0.0.1:1")
    reachable("auto")  # Ray's to find
