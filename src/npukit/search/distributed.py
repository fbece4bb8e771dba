"""The search's trials on Ray Tune: one Tune trial per recipe, one CPU each, on a local Ray instance that npukit
starts for the search and stops after it, or on an existing Ray cluster given by address. One Tune experiment runs
the whole search; its searcher (``BatchSearcher``) hands Tune the study's batches (``study.StudyLoop``) and tells
the study a batch's figures once all of it is back, so Tune's workers live for the whole search (each imports npukit
and receives the samples once).

Only the building and checking of a recipe runs in the workers (``TrialBuilder.build``: quantize on the calibration
samples, the task metric and every output's SQNR on the held-out ones, the integer-kernel report); the figures and
models come back in the batch's order, and the driver times them one at a time (``TrialRunner.finish``), so that no
timing shares the CPU with a build. The study proposes a whole batch before it sees any of its figures
(``study.run_study``), so a search on Ray proposes the recipes the serial search with the same batch size does.

The builder (float model, calibration and held-out samples) goes into Ray's object store once; each trial hands its
``Built`` (model included) to a small actor of the driver's, not to Tune's result logs, and the driver takes it from
there. The local instance, Tune's results and Ray's session files live in one temporary folder, removed at the end.

On several machines: install the same npukit (and data paths, if the data are folders) on each, start Ray there
(``ray start --head --port 6379`` on one, ``ray start --address HEAD:6379`` on the others), then run
``npukit optimize ... --workers N --ray-address HEAD:6379`` on the head node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from ray.tune.search import Searcher

from npukit.errors import InputError
from npukit.search.space import Recipe
from npukit.search.study import StudyLoop, Batch
from npukit.search.trial import Built, Measured, TrialBuilder


def _trial(config: dict[str, Any], builder: TrialBuilder, keeper: Any) -> dict[str, Any]:
    """One Tune trial: build and check the recipe ``config`` names, on one thread, and hand the result to ``keeper``
    under ``config["key"]``."""
    import ray

    from npukit._threads import torch_threads

    with torch_threads(1):
        built = builder.build(Recipe(**config["recipe"]))
    ray.get(keeper.put.remote(config["key"], built))
    return {"seconds": built.seconds, "error": built.error}


class RayTrials:
    """Runs a study's batches on Ray Tune with ``workers`` trials at a time (see the module docstring). Use as a
    context manager: Ray is started (or joined, with ``address``) on entry and shut down on exit; ``drive`` runs a
    study's loop."""

    def __init__(self, builder: TrialBuilder, *, workers: int, address: str | None = None) -> None:
        if workers < 2:
            raise InputError(f"workers {workers} must be at least 2 to run trials on Ray", hint="or leave it at 1")
        self.builder, self.workers, self.address = builder, workers, address
        self._tmp: str | None = None
        self._keeper: Any = None
        self.startup_s = 0.0

    def __enter__(self) -> RayTrials:
        import ray

        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's console tables off (verbose=0 is then silent)
        os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")  # Ctrl-C interrupts the verb, as everywhere
        if self.address:
            reachable(self.address)
        self._tmp = tempfile.mkdtemp(prefix="npukit-ray-")
        start = time.perf_counter()
        try:
            with _quiet():
                if self.address:
                    ray.init(address=self.address, log_to_driver=False, configure_logging=False,
                             logging_level="ERROR")
                else:
                    ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False,
                             _temp_dir=self._tmp, configure_logging=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            self._cleanup()
            where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
            raise InputError(f"could not start {where}: {' '.join(str(exc).split())[:200]}",
                             hint="check the address (ray status on the head node), or leave out --ray-address") \
                from exc
        self._keeper = ray.remote(num_cpus=0)(_Keeper).remote()
        self.startup_s = time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        import ray

        with _quiet():
            ray.shutdown()
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def drive(self, loop: StudyLoop, finish: Callable[[Built], Measured],
              announce: Callable[[list[Recipe]], None] | None = None) -> None:
        """Run ``loop`` to its end in one Tune experiment: each batch's recipes built in Tune trials, ``workers`` at a
        time, then each finished here (``finish``: timed, one at a time) and told in the batch's order.
        ``announce`` is told each batch before it starts."""
        import ray
        from ray import tune

        assert self._tmp is not None and self._keeper is not None, "use RayTrials as a context manager"
        searcher = BatchSearcher(loop, finish, lambda key: ray.get(self._keeper.take.remote(key)), announce)
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_trial, builder=self.builder, keeper=self._keeper), {"cpu": 1}),
            tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=self.workers,
                                        reuse_actors=True),
            run_config=tune.RunConfig(storage_path=os.path.join(self._tmp, "tune"), name="search", verbose=0))
        with _quiet():
            tuner.fit()
        if searcher.failure is not None:
            raise searcher.failure


class BatchSearcher(Searcher):
    """Tune's searcher for a ``StudyLoop``: suggests the current batch's recipes, waits (suggests nothing) until all
    of them are back, then finishes and tells them and moves to the next batch; ends with the loop. A failure inside
    is kept and raised after the experiment (Tune would only log it)."""

    def __init__(self, loop: StudyLoop, finish: Callable[[Built], Measured], take: Callable[[str], Any],
                 announce: Callable[[list[Recipe]], None] | None) -> None:
        super().__init__()
        self.loop, self.finish, self.take, self.announce = loop, finish, take, announce
        self.batch: Batch | None = None
        self.queue: list[int] = []
        self.back: dict[int, Built] = {}
        self.index: dict[str, int] = {}
        self.failure: BaseException | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its searcher for a restore npukit never asks of it (the study's storage resumes a search);
        the loop and the driver's callbacks stay out: a sampler may hold a lock (Optuna's NSGA-II does)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("loop", "finish", "take", "announce")}

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self.failure is not None:
            return Searcher.FINISHED
        try:
            if self.batch is None and not self._next():
                return Searcher.FINISHED
        except BaseException as exc:  # noqa: BLE001 - kept, raised after the experiment
            self.failure = exc
            return Searcher.FINISHED
        if not self.queue:
            return None  # the batch is out: wait until all of it is back
        assert self.batch is not None
        i = self.queue.pop(0)
        self.index[trial_id] = i
        return {"key": trial_id, "recipe": self.batch.to_measure[i].as_dict()}

    def _next(self) -> bool:
        """The next batch with something to measure (a batch of repeats alone is told at once); False at the end."""
        while (batch := self.loop.next_batch()) is not None:
            if batch.to_measure:
                self.batch, self.queue, self.back = batch, list(range(len(batch.to_measure))), {}
                if self.announce is not None:
                    self.announce(batch.to_measure)
                return True
            self.loop.tell(batch, [])
        return False

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if self.batch is None or trial_id not in self.index or self.failure is not None:
            return
        i = self.index.pop(trial_id)
        built = self.take(trial_id)
        if built is None:  # the worker died (e.g. out of memory) before it handed anything back
            built = Built(self.batch.to_measure[i], None, error="the Ray trial failed before it returned (see Ray's "
                                                                "logs); the recipe is left out")
        self.back[i] = built
        if len(self.back) < len(self.batch.to_measure):
            return
        try:
            measured = [self.finish(self.back[j]) for j in range(len(self.batch.to_measure))]
            self.loop.tell(self.batch, measured)
        except BaseException as exc:  # noqa: BLE001 - kept, raised after the experiment
            self.failure = exc
        self.batch = None


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds where nothing listens at ``address`` (HOST:PORT or ray://HOST:PORT; "auto" is Ray's to find):
    Ray itself retries a wrong address for many minutes."""
    import socket

    text = address.removeprefix("ray://")
    host, _, port = text.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise InputError(f"nothing answers at the Ray address {address} ({exc.strerror or exc})",
                         hint="start the cluster's head first (ray start --head --port 6379) and give HEAD:6379, or "
                              "leave out --ray-address for a local instance") from exc


class _Keeper:
    """Holds what the trials hand back until the driver takes it (a Ray actor of the driver's)."""

    def __init__(self) -> None:
        self._items: dict[int, Any] = {}

    def put(self, key: int, value: Any) -> None:
        self._items[key] = value

    def take(self, key: int) -> Any:
        return self._items.pop(key, None)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Ray's and Tune's console output (a token-authentication notice, Tune's result locations) off the terminal:
    their warnings reach the report through the verb's log capture."""
    from npukit.report.capture import capture_native_output

    with capture_native_output():
        yield
