"""In-process memos of the work one quantization repeats on the same bytes.

The optimize search builds one float model under many recipes in one process, and much of each build is work an
earlier trial did on the same bytes: the recipes that leave the weights alone (no CLE, no activation equalization)
calibrate the same graph on the same samples again, ORT's quantizer computes the same weights' grids and integers
again in every emit, and ORT's pre-processing runs again on the same model. Profiled on MobileNetV2 (6 trials on 2
cores): calibration 26 s, the weights' grids in ORT's quantizer 12 s, of 115 s.

Each memo is keyed on content (digests of the model's bytes, of the samples' bytes, and every setting the work reads),
never on object identity, so a hit returns what the work would compute again (byte for byte: the work is
deterministic, and a memo holds its own copy of what it computed) and a changed weight or sample misses. Each memo is
bounded in entries and bytes (the least recently used goes first): a long search keeps a few calibrations of its
model, not one per trial. ``clear`` empties them all (tests start from empty memos); ``disabled`` turns them off for
a block (the cold computation, for comparing against a hit).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Hashable, Iterator, Mapping
from typing import Any

import numpy as np
import onnx

_LOCK = threading.RLock()
_ENABLED = [True]


@dataclasses.dataclass
class Memo:
    """A bounded map, least recently used out first: at most ``entries`` values and ``max_bytes`` bytes (as the
    caller counts a value's size; a value larger than that is not kept)."""

    name: str
    entries: int
    max_bytes: int
    _values: collections.OrderedDict[Hashable, tuple[Any, int]] = dataclasses.field(
        default_factory=collections.OrderedDict, repr=False)
    _bytes: int = 0
    hits: int = 0
    misses: int = 0

    def get(self, key: Hashable) -> Any | None:
        """The value kept under ``key`` (None: none, or memos are off)."""
        if not _ENABLED[0]:
            return None
        with _LOCK:
            found = self._values.get(key)
            if found is None:
                self.misses += 1
                return None
            self._values.move_to_end(key)
            self.hits += 1
            return found[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> None:
        """Keep ``value`` (``nbytes`` large) under ``key``, dropping the least recently used beyond the bounds."""
        if not _ENABLED[0] or nbytes > self.max_bytes:
            return
        with _LOCK:
            old = self._values.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._values[key] = (value, nbytes)
            self._bytes += nbytes
            while len(self._values) > self.entries or self._bytes > self.max_bytes:
                _, (_, size) = self._values.popitem(last=False)
                self._bytes -= size

    def keys(self) -> list[Hashable]:
        with _LOCK:
            return list(self._values)

    def clear(self) -> None:
        with _LOCK:
            self._values.clear()
            self._bytes = 0
            self.hits = self.misses = 0


_MEMOS: list[Memo] = []


def memo(name: str, *, entries: int, max_bytes: int) -> Memo:
    """A new memo, emptied by ``clear`` and turned off by ``disabled`` with the others."""
    made = Memo(name, entries, max_bytes)
    _MEMOS.append(made)
    return made


def clear() -> None:
    """Empty every memo."""
    for each in _MEMOS:
        each.clear()


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the block with every memo off: nothing read, nothing kept (what the code computes without them)."""
    with _LOCK:
        before = _ENABLED[0]
        _ENABLED[0] = False
    try:
        yield
    finally:
        with _LOCK:
            _ENABLED[0] = before


def enabled() -> bool:
    return _ENABLED[0]


# Models past this size are not remembered (protobuf serializes at most 2 GB, and a copy of one is a lot to keep)
MAX_MODEL_BYTES = 1 << 30


def model_digest(model: onnx.ModelProto) -> str:
    """sha256 of the model's serialized bytes: equal digests, equal models (two models that serialize differently
    but compute alike only miss). "" where memos are off or the model is over ``MAX_MODEL_BYTES``: not remembered."""
    if not enabled() or model.ByteSize() > MAX_MODEL_BYTES:
        return ""
    return hashlib.sha256(model.SerializeToString()).hexdigest()


def array_key(array: np.ndarray) -> tuple[str, tuple[int, ...], str]:
    """An array's dtype, shape and a digest of its bytes."""
    array = np.asarray(array)
    data = np.ascontiguousarray(array)  # (a 0-d array comes back 1-d: the shape is the array's own)
    return array.dtype.str, array.shape, hashlib.blake2b(data.data, digest_size=16).hexdigest()


def feeds_digest(feeds: Mapping[str, np.ndarray]) -> str:
    """sha256 of one sample's feeds (names, dtypes, shapes, bytes), in name order."""
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.asarray(feeds[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(np.ascontiguousarray(array).data)
    return digest.hexdigest()


def chained(before: str, digest: str) -> str:
    """The key of a sequence of samples one sample longer: ``before`` (the key of the samples so far; "" for none)
    followed by the sample of ``digest``."""
    return hashlib.sha256(f"{before}|{digest}".encode()).hexdigest()
