"""Recurrent models checked as they run: each model fed its own state back.

A model such as Silero VAD takes its recurrent state as an input (``state`` [2, 1, 128]) and gives the next one as
an output (``stateN``); its user feeds ``stateN`` back as the next call's ``state``. A check whose every sample
carries a state the float model computed measures one step: a quantized Silero passed at 24 dB per step and was
at 18-19 dB on its speech probability, 11 decisions at 0.5 flipped over a 504-chunk clip, once it ran on its own
state. ``roll`` runs the reference and the candidate over the check samples in order, each on the state it gave
on the sample before (the first sample's state is the data's), so that the error the state carries builds up as
it does in use.

The samples rolled over are the data's, in its order, from its first (``ROLL_SAMPLES`` at most): consecutive
chunks of a stream, as the user's data gives them; a check's own samples spread over the data skipped 7 chunks of 8
between steps (Silero on the HTP: 28.9 dB fed back over every 8th chunk, 16.3 dB over all 64 in order).

State pairs are found from the first sample (``state_pairs``): an input and an output of the same shape and dtype
whose names are one name with a state suffix and name a state (``state``/``stateN``, ``h0``/``hn``, ``c0``/``cn``,
``hidden_in``/``hidden_out``, ``cache``/``cache_out``) or a key-value cache (``past_key_values.0.key`` /
``present.0.key``), in a model with more than one input. Names that merely both mention a state are not a pair (a
transformer layer's ``hidden_states`` -> ``last_hidden_state`` was run on its own output 16 times), nor a name with
a suffix that names no state (a denoiser's ``image`` -> ``image_out``)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from npukit.measure.fidelity import sqnr_from_sums
from npukit.measure.task_fidelity import Runner, feeds_and_labels
from npukit.tasks import TaskResult

STATE_WORDS = ("state", "hidden", "cache", "memory", "carry")
SHORT_STATES = ("h", "c", "hx", "cx", "s")  # an LSTM's / GRU's h0 / hn, c0 / cn
ROLL_SAMPLES = 128  # the data's first samples rolled over, in order
_SUFFIX = re.compile(r"(?:[_.\-:]?(?:in|out|new|next|prev|init|n|\d+))+$")
_KV = re.compile(r"^(?:past_key_values|past)(?P<rest>[._].*)$|^present(?P<rest2>[._].*)$")


@dataclasses.dataclass(frozen=True)
class RolledOutput:
    """One output over the rolled sequence: SQNR pooled over every step, the largest error and reference value."""

    name: str
    sqnr_db: float
    max_abs_error: float
    reference_max_abs: float
    state: bool  # an output fed back as the next step's state


@dataclasses.dataclass(frozen=True)
class RolledCheck:
    """The reference and the candidate each run over ``steps`` samples in order, fed their own states (``pairs``:
    input -> the output fed back to it)."""

    pairs: tuple[tuple[str, str], ...]
    steps: int
    outputs: tuple[RolledOutput, ...]

    def failures(self, floor_db: float, held: Iterable[str]) -> list[str]:
        """One failure per output in ``held`` (the outputs the one-step check holds to the SQNR floor) below
        ``floor_db`` over the rolled sequence, worst first."""
        names = set(held)
        low = [o for o in self.outputs if o.name in names and not o.sqnr_db >= floor_db]
        return [f"output {o.name!r} SQNR {o.sqnr_db:.3f} dB < {floor_db:g} dB with each model fed its own "
                f"state over {self.steps} samples" for o in sorted(low, key=lambda o: _order(o.sqnr_db))]

    def summary(self, held: Iterable[str]) -> str:
        """"state fed back over N samples: worst output 'x' SQNR d dB" for the verdict: the worst of the outputs
        ``held`` to the SQNR floor (a decoded one's SQNR is not what judged it)."""
        names = set(held)
        shown = [o for o in self.outputs if o.name in names]
        head = f"state ({', '.join(i for i, _ in self.pairs)}) fed back over {self.steps} samples in order"
        if not shown:
            return f"{head}: its outputs are judged by the task metric, one step"
        worst = min(shown, key=lambda o: _order(o.sqnr_db))
        return f"{head}: worst output {worst.name!r} SQNR {worst.sqnr_db:.3f} dB"

    def as_dict(self) -> dict[str, Any]:
        return {"pairs": [list(p) for p in self.pairs], "steps": self.steps,
                "outputs": [dataclasses.asdict(o) for o in self.outputs]}


def _order(value: float) -> float:
    return -math.inf if math.isnan(value) else value


def _stem(name: str) -> str:
    return _SUFFIX.sub("", name.lower())


def _related(input_name: str, output_name: str) -> bool:
    a, b = _stem(input_name), _stem(output_name)
    if a and a == b and input_name != output_name:
        return a in SHORT_STATES or any(w in input_name.lower() for w in STATE_WORDS)
    past, present = _KV.match(input_name.lower()), _KV.match(output_name.lower())
    return bool(past and present and past.group("rest") and present.group("rest2")
                and past.group("rest") == present.group("rest2"))


def state_pairs(feeds: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray],
                names: Sequence[str]) -> dict[str, str]:
    """{input: output} for the recurrent states of a model that gave ``outputs`` (named ``names``) on ``feeds``
    (see the module docstring); {} for a model with one input, or none found. An input with several candidate
    outputs is paired with the one whose name is its own with a suffix, else with none."""
    if len(feeds) < 2:
        return {}
    pairs: dict[str, str] = {}
    for input_name, value in feeds.items():
        value = np.asarray(value)
        found = [name for name, out in zip(names, outputs)
                 if name not in pairs.values() and name != input_name and np.shape(out) == value.shape
                 and np.asarray(out).dtype == value.dtype and _related(input_name, name)]
        if len(found) > 1:
            found = [name for name in found if _stem(name) == _stem(input_name)]
        if len(found) == 1:
            pairs[input_name] = found[0]
    return pairs


def in_order(data: Any, limit: int = ROLL_SAMPLES) -> list[Any]:
    """The first ``limit`` samples of ``data`` (a dataset with ``batches``, or a sequence of samples), one per item,
    in the data's order: what ``roll`` feeds."""
    if hasattr(data, "batches"):
        return list(data.batches(1, limit=limit))
    return list(data)[:limit]


def fed_back(reference: Runner, candidate: Runner, data: Any, names: Sequence[str], result: TaskResult,
             floor_db: float) -> tuple[RolledCheck | None, list[str]]:
    """(``roll`` over the first samples of ``data`` in order, the floors it misses: one failure per output
    ``result`` holds to the SQNR floor that falls below ``floor_db`` fed back). What task_check, floor_check and a
    search's trials each judge a recurrent model by; (None, []) for a model with no state fed back."""
    rolled = roll(reference, candidate, in_order(data), names)
    return rolled, rolled.failures(floor_db, result.held_to_floor()) if rolled is not None else []


def roll(reference: Runner, candidate: Runner, samples: Iterable[Any], names: Sequence[str]) -> RolledCheck | None:
    """Each model run over ``samples`` in order on the states it gave on the sample before (the first sample's are
    the data's); None where the model has no state pairs, or fewer than two samples."""
    items = [feeds for feeds, _ in feeds_and_labels(samples)]
    if len(items) < 2 or len(items[0]) < 2:  # one input: nothing to feed back (not run again)
        return None
    pairs: dict[str, str] = {}
    states: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] = ({}, {})
    sums: dict[str, list[float]] = {}  # name -> [signal, noise, max error, max |ref|]
    index = {name: i for i, name in enumerate(names)}
    for step, feeds in enumerate(items):
        ref = [np.asarray(o) for o in reference({**feeds, **states[0]})]
        cand = [np.asarray(o) for o in candidate({**feeds, **states[1]})]
        if step == 0:
            pairs = state_pairs(feeds, ref, names)
            if not pairs:
                return None
        for name, r, c in zip(names, ref, cand):
            r64, c64 = r.astype(np.float64), c.astype(np.float64)
            total = sums.setdefault(name, [0.0, 0.0, 0.0, 0.0])
            total[0] += float(np.sum(r64 * r64))
            total[1] += float(np.sum((r64 - c64) ** 2))
            total[2] = max(total[2], float(np.max(np.abs(r64 - c64), initial=0.0)))
            total[3] = max(total[3], float(np.max(np.abs(r64), initial=0.0)))
        states = ({i: ref[index[o]].astype(np.asarray(feeds[i]).dtype) for i, o in pairs.items()},
                  {i: cand[index[o]].astype(np.asarray(feeds[i]).dtype) for i, o in pairs.items()})
    fed = set(pairs.values())
    return RolledCheck(tuple(pairs.items()), len(items),
                       tuple(RolledOutput(name, sqnr_from_sums(s, n), err, top, name in fed)
                             for name, (s, n, err, top) in sums.items()))
