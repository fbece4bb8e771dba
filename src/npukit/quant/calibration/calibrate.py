"""Calibration: run the float model on ORT CPU one sample at a time and observe every activation to be quantized.

The activations (graph inputs and float node outputs) are exposed as extra graph outputs of a copy of the model;
each sample's values go through one observer per tensor and are dropped, so memory does not grow with the number of
samples. Samples are validated against the model's inputs (names, dtype, static dims, finite values).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.quant import memo
from npukit.quant.calibration.observers import OBSERVERS, RANGE_METHODS, MultiObserver, Observer
from npukit.quant.config import QuantConfig
from npukit.runtime.ort import make_session

Sample = Mapping[str, np.ndarray]
Progress = Callable[[int], None]


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
    """``ranges``: tensor name -> (rmin, rmax); ``samples``: how many samples were observed. With method "auto",
    ``candidates`` maps each method of ``RANGE_METHODS`` to its ranges (all from the same histograms) and ``ranges``
    are the min-max ones until ``with_method`` picks one."""

    ranges: dict[str, tuple[float, float]]
    samples: int
    method: str
    candidates: dict[str, dict[str, tuple[float, float]]] = dataclasses.field(default_factory=dict)

    def with_method(self, method: str) -> CalibrationResult:
        """The candidate ranges of ``method`` as a plain result (method "auto" only)."""
        return CalibrationResult(ranges=self.candidates[method], samples=self.samples, method=method)

    def copy(self) -> CalibrationResult:
        """The same result in dicts of its own (a caller may change what it got)."""
        return CalibrationResult(ranges=dict(self.ranges), samples=self.samples, method=self.method,
                                 candidates={m: dict(r) for m, r in self.candidates.items()})


@dataclasses.dataclass(frozen=True)
class ChannelStats:
    """Per-channel (axis 1) statistics of one activation over the calibration samples."""

    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray


def make_observer(config: QuantConfig, *, bits: int = 8) -> Observer:
    """The observer ``config.calibration.method`` names (a ``MultiObserver`` for "auto"), for ``bits``-wide
    activations of the configured signedness."""
    kind = MultiObserver if config.calibration.method == "auto" else OBSERVERS[config.calibration.method]
    return kind.create(bits=bits, signed=config.scheme.activation_signed, symmetric=config.scheme.symmetric_activations,
                       num_bins=config.calibration.num_bins, percentile=config.calibration.percentile)


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def float_activations(model: onnx.ModelProto, *, digest: str = "") -> list[str]:
    """Graph inputs and node outputs of type float32, in graph order: the tensors activation quantization sees.
    ``digest``: the model's (``memo.model_digest``), where the caller has it: the names of a model seen before are
    not inferred again (ONNX shape inference, a tenth of a second on MobileNetV2)."""
    kept = _ACTIVATIONS.get(digest) if digest else None
    if kept is not None:
        return list(kept)
    names = _float_activations(model)
    if digest:
        _ACTIVATIONS.put(digest, tuple(names), 64 * len(names))
    return names


def _float_activations(model: onnx.ModelProto) -> list[str]:
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type
             for v in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    names = [i.name for i in _graph_inputs(model)]
    names += [o for n in model.graph.node for o in n.output if o]
    return [n for n in names if types.get(n) == TensorProto.FLOAT]


def with_outputs(model: onnx.ModelProto, names: Iterable[str]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph also outputs ``names`` (float32 tensors)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
            present.add(name)
    return out


def _check_sample(sample: object, inputs: list[onnx.ValueInfoProto], index: int) -> dict[str, np.ndarray]:
    if isinstance(sample, np.ndarray) and len(inputs) == 1:
        sample = {inputs[0].name: sample}
    if not isinstance(sample, Mapping):
        raise InputError(f"calibration sample {index} is a {type(sample).__name__}, not a mapping of input names "
                         "to arrays", hint="yield dicts like {'input': array}")
    expected = [i.name for i in inputs]
    if sorted(sample) != sorted(expected):
        raise InputError(f"calibration sample {index} has inputs {sorted(sample)}, the model takes {expected}",
                         hint="name each array after a model input")
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        value = np.asarray(sample[info.name])
        want = helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        if value.dtype != want:
            raise InputError(f"calibration sample {index}, input {info.name!r}: dtype {value.dtype}, the model "
                             f"expects {np.dtype(want)}", hint=f"convert the data with .astype(np.{np.dtype(want)})")
        # a dimension without a value, or with -1 (how some exporters write a dynamic one), takes any size
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None
                for d in info.type.tensor_type.shape.dim]
        if len(dims) != value.ndim or any(d is not None and d != s for d, s in zip(dims, value.shape)):
            shown = ["?" if d is None else d for d in dims]
            raise InputError(f"calibration sample {index}, input {info.name!r}: shape {list(value.shape)}, the "
                             f"model expects {shown}", hint="resize or batch the data to the model's input shape")
        if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
            raise InputError(f"calibration sample {index}, input {info.name!r} contains NaN or Inf values",
                             hint="clean the calibration data")
        feeds[info.name] = value
    return feeds


def iter_samples(model: onnx.ModelProto, samples: Iterable[object], *, limit: int | None = None
                 ) -> Iterator[dict[str, np.ndarray]]:
    """Validated feeds from ``samples``; at most ``limit`` of them, and an error when fewer (or none) exist."""
    inputs = _graph_inputs(model)
    count = 0
    for count, sample in enumerate(samples, start=1):
        yield _check_sample(sample, inputs, count - 1)
        if limit is not None and count >= limit:
            return
    if count == 0:
        raise InputError("the calibration set is empty", hint="give at least one sample (a few hundred is typical)")
    if limit is not None and count < limit:
        raise InputError(f"{limit} calibration samples were asked for but only {count} were given",
                         hint="give more samples, or ask for fewer (--calib-samples; calib_samples in the API)")


def observe(model: onnx.ModelProto, names: list[str], samples: Iterable[object], *, limit: int | None = None,
            progress: Progress | None = None, start: int = 0,
            each: Callable[[dict[str, np.ndarray]], None] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Run the float model per sample and yield {name: value} for ``names`` (validated samples, bounded memory);
    samples before ``start`` are validated but not run. ``each`` sees the feeds of every sample run, before it
    runs."""
    session = make_session(with_outputs(model, names), optimization="basic")
    outputs = [o.name for o in session.get_outputs()]
    wanted = set(names)
    for i, feeds in enumerate(iter_samples(model, samples, limit=limit), start=1):
        if i <= start:
            continue
        if each is not None:
            each(feeds)
        values = session.run(None, feeds)
        yield {n: v for n, v in zip(outputs, values) if n in wanted}
        if progress is not None:
            progress(i)


def sixteen_bit_tensors(model: onnx.ModelProto, config: QuantConfig) -> set[str]:
    """Activations quantized to 16 bits: those read or written by ``config.scheme.int16_nodes``, and
    ``config.scheme.int16_tensors``."""
    chosen = set(config.scheme.int16_nodes)
    missing = chosen - {n.name for n in model.graph.node}
    if missing:
        raise InputError(f"int16 nodes {sorted(missing)} are not in the model", hint="use node names from the graph")
    produced = {t for n in model.graph.node for t in n.output} | {i.name for i in model.graph.input}
    unknown = set(config.scheme.int16_tensors) - produced
    if unknown:
        raise InputError(f"int16 tensors {sorted(unknown)} are not activations of the model",
                         hint="use tensor names that a node writes (or a graph input)")
    return {t for n in model.graph.node if n.name in chosen for t in [*n.input, *n.output] if t} \
        | set(config.scheme.int16_tensors)


def calibrate(model: onnx.ModelProto, samples: Iterable[object], *, config: QuantConfig,
              progress: Progress | None = None) -> CalibrationResult:
    """Quantization ranges of every float activation of ``model``, observed with ``config.calibration.method`` in one
    pass over ``samples``; with "auto", every method's ranges (``candidates``) from one histogram per tensor."""
    return Calibration(model, config).feed(samples, stop=config.calibration.samples, progress=progress).result()


# What calibrations gathered, for a later one of the same model on the same samples (``npukit.quant.memo``): the
# observers' statistics after a run of samples [0, k), keyed by the model's digest and the run's (``memo.chained``),
# and the ranges read from them, keyed by the observers' layout too. An entry of MobileNetV2 (about 80 histograms of
# 4096 bins): 2.6 MB.
_GATHERED = memo.memo("calibration statistics", entries=48, max_bytes=128 << 20)
_RANGES = memo.memo("calibration ranges", entries=64, max_bytes=16 << 20)
_ACTIVATIONS = memo.memo("float activations", entries=32, max_bytes=16 << 20)


class Calibration:
    """One observer per float activation of ``model`` (``config.calibration.method``'s; a ``MultiObserver`` for
    "auto"), fed samples in order: ``feed`` samples [0, k) and later [k, n) and the observers hold what one pass over
    [0, n) would (each update is sequential and deterministic), so the ranges of a first part can be read and the
    rest added without observing the first part again. ``result()`` at any point.

    For the same reason a calibration of a model on samples an earlier one of the same model (by its bytes, read at
    creation) already observed in this process starts from what that one gathered (``_GATHERED``) instead of running
    the model again: the statistics of a run of samples do not depend on the method that reads a range from them (a
    min-max or an MSE calibration takes them from an "auto" one's histograms), and the ranges are read from them as
    they would be."""

    def __init__(self, model: onnx.ModelProto, config: QuantConfig) -> None:
        self.model, self.config = model, config
        self.digest = memo.model_digest(model)  # "": nothing kept, nothing recalled
        self.names = float_activations(model, digest=self.digest)
        wide = sixteen_bit_tensors(model, config)
        # The model's own inputs and outputs keep their full range whatever the method: clipping the input throws
        # real data away, and clipping the outputs (logits) distorts exactly what a user compares against the float
        # model.
        edges = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
        minmax = config.with_calibration(method="minmax")
        self.observers = {n: make_observer(minmax if n in edges else config, bits=16 if n in wide else 8)
                          for n in self.names}
        self.samples = 0
        self.fed = ""  # the key of the samples observed so far (``memo.chained``)

    def feed(self, samples: Iterable[object], *, start: int = 0, stop: int | None = None,
             progress: Progress | None = None) -> Calibration:
        """Observe samples [start, stop) of ``samples`` (validated; ``stop`` None: to the end), in order after
        those fed before (which must have been [0, start))."""
        if start != self.samples:
            raise ValueError(f"samples [0, {self.samples}) were observed; the next must start at {self.samples}")
        if self.digest and iter(samples) is not samples and self._seen_model():  # a one-shot iterator is read once
            if self._recall(samples, stop, progress):
                return self
        digests: list[str] = []
        each = (lambda feeds: digests.append(memo.feeds_digest(feeds))) if self.digest else None
        for values in observe(self.model, self.names, samples, limit=stop, progress=progress, start=self.samples,
                              each=each):
            for name, value in values.items():
                if not np.all(np.isfinite(value)):  # ORT's quantizer failed on the range: "AssertionError: scale issue"
                    what = "NaN" if np.isnan(value).any() else "inf"
                    raise InputError(f"the float model computes {what} in tensor {name!r} on calibration sample "
                                     f"{self.samples}: no 8-bit grid holds it",
                                     hint="give inputs the model is made for (its preprocessing, its value range), "
                                          "or fix the model where it divides, takes a log or a square root")
                self.observers[name].update(value)
            self.samples += 1
            if self.digest:
                self.fed = memo.chained(self.fed, digests.pop())
        if self.digest:
            self._keep()
        return self

    def _seen_model(self) -> bool:
        """Whether a calibration of this model was kept (only then are the samples read ahead to look for it)."""
        return any(key[0] == self.digest for key in _GATHERED.keys())

    def _recall(self, samples: Iterable[object], stop: int | None, progress: Progress | None) -> bool:
        """The statistics of the longest run of samples [0, k) (k <= stop) kept for this model, into the observers,
        as feeding samples [self.samples, k) would have gathered them (``progress`` told of each). The samples are
        validated as ``observe`` validates them (the same errors). True when that reached ``stop``."""
        feeds = itertools.islice(iter_samples(self.model, samples, limit=stop), self.samples, None)
        runs = list(itertools.accumulate((memo.feeds_digest(f) for f in feeds), memo.chained, initial=self.fed))[1:]
        for k in range(len(runs), 0, -1):
            kept = _GATHERED.get((self.digest, runs[k - 1]))
            if kept is not None and all(kept[n].serves(o) for n, o in self.observers.items()):
                break
        else:
            return not runs
        for name, observer in self.observers.items():
            observer.resume(kept[name])
        for i in range(self.samples + 1, self.samples + k + 1):
            if progress is not None:
                progress(i)
        self.samples, self.fed = self.samples + k, runs[k - 1]
        return k == len(runs)

    def _keep(self) -> None:
        """What the observers gathered, for a later calibration of this model on these samples (a kept histogram
        stays where these observers keep none: a min-max calibration after an "auto" one)."""
        gathered = {n: o.gathered() for n, o in self.observers.items()}
        kept = _GATHERED.get((self.digest, self.fed))
        if kept is not None:
            gathered = {n: kept[n] if g.counts is None and kept[n].counts is not None else g
                        for n, g in gathered.items()}
        _GATHERED.put((self.digest, self.fed), gathered, sum(g.nbytes for g in gathered.values()))

    def _layout(self) -> tuple:
        """What ``result`` reads besides the statistics: the method, and each observer's kind and settings."""
        return (self.config.calibration.method,
                tuple((n, type(o).__name__, o.bits, o.signed, o.symmetric, getattr(o, "half", None),
                       getattr(o, "percentile", None)) for n, o in self.observers.items()))

    def result(self) -> CalibrationResult:
        """The ranges (and with "auto" every method's) read from the observers: the entropy and MSE searches take a
        second on MobileNetV2, so the ranges read from the same statistics in the same layout are kept too."""
        key = (self.digest, self.fed, self._layout()) if self.digest else None
        kept = _RANGES.get(key) if key is not None else None
        if kept is not None:
            return kept.copy()
        result = self._result()
        if key is not None:
            _RANGES.put(key, result.copy(), 256 * len(result.ranges) * (1 + len(result.candidates)))
        return result

    def _result(self) -> CalibrationResult:
        ranges = {}
        candidates: dict[str, dict[str, tuple[float, float]]] = {m: {} for m in RANGE_METHODS} \
            if self.config.calibration.method == "auto" else {}
        sensitive = saturating_inputs(self.model)
        returned = saturating_inputs(self.model, returned=True)
        for name, obs in self.observers.items():
            if obs.min <= obs.max:
                limit, whole = sensitive.get(name), returned.get(name)

                def kept(lo: float, hi: float, obs=obs, limit=limit, whole=whole) -> tuple[float, float]:
                    if limit is None:
                        return float(lo), float(hi)
                    if whole is not None:  # returned by the model: a side never observed past the midpoint spans
                        hi = max(hi, whole) if obs.max < 0 else hi  # to the limit (see SATURATION)
                        lo = min(lo, -whole) if obs.min > 0 else lo
                    return (float(min(lo, max(obs.min, -limit))), float(max(hi, min(obs.max, limit))))

                lo, hi = obs.range()
                ranges[name] = kept(lo, hi)
                if candidates:
                    each = obs.ranges() if isinstance(obs, MultiObserver) else dict.fromkeys(RANGE_METHODS, (lo, hi))
                    for method, (mlo, mhi) in each.items():
                        candidates[method][name] = kept(mlo, mhi)
        return CalibrationResult(ranges=ranges, samples=self.samples, method=self.config.calibration.method,
                                 candidates=candidates)


# Where a bounded activation stops responding to its input: a clipping observer may cut the tail beyond it, never
# inside it. A detector's class logits are mostly very negative (background everywhere), so percentile, entropy and
# MSE observers put the top of the grid near 0, where the sigmoid is 0.5: found on a YOLOv8 detector, whose
# confident class scores (0.83, 0.81, 0.69) all came out 0.499 (MSE had chosen the logits' range). Softmax has no
# such point (it reads differences between logits): its input keeps the observed range. Where the model returns the
# activation's output (through ``PASSTHROUGH`` ops: a detector's scores) and calibration never saw its input past
# the midpoint (0) on a side, that side reaches the limit: calibration images with no object in them never push a
# class logit above 0, and a grid that stops there caps every confident score at 0.5 (found on YOLOv8n with 8
# calibration photos: 0.475-0.498 where the float model said 0.69-0.83). A side that was observed past the midpoint
# keeps what was seen (CenterFace's heatmap, widened to +-6 whatever was seen, lost 4.4 dB); inside the model (a
# SiLU's or a squeeze-excite gate's sigmoid, whose input other nodes read too) the observed range is kept.
SATURATION = {"Sigmoid": 6.0, "HardSigmoid": 3.0, "Tanh": 3.0, "Softmax": float("inf")}


# Ops that move values without changing them: a bounded activation reached through them reads the same values.
PASSTHROUGH = frozenset({"Concat", "Split", "Reshape", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Flatten",
                         "Gather", "Identity", "Expand", "Tile"})


def saturating_inputs(model: onnx.ModelProto, *, returned: bool = False) -> dict[str, float]:
    """Tensors that reach a bounded activation (``SATURATION``) directly or through ``PASSTHROUGH`` ops (a
    detector's per-level class logits concatenated, reshaped and split before the sigmoid) -> how far (+-) their
    range must reach where observed; ``returned``: only those of the activations (with a finite limit) whose output
    the model returns, directly or through ``PASSTHROUGH`` ops."""
    index = GraphIndex(model.graph)
    starts = [n for n in model.graph.node if n.op_type in SATURATION and n.input]
    if returned:
        starts = [n for n in starts if math.isfinite(SATURATION[n.op_type]) and _returned(index, n.output[0])]
    found: dict[str, float] = {}
    frontier = [(n.input[0], SATURATION[n.op_type]) for n in starts]
    while frontier:
        tensor, limit = frontier.pop()
        if found.get(tensor, -1.0) >= limit:
            continue
        found[tensor] = limit
        node = index.producer_node(tensor)
        if node is not None and node.op_type in PASSTHROUGH:
            data = node.input if node.op_type == "Concat" else node.input[:1]
            frontier.extend((t, limit) for t in data if t)
    return found


def _returned(index: GraphIndex, tensor: str) -> bool:
    """Whether ``tensor`` is a graph output or reaches one through ``PASSTHROUGH`` ops."""
    outputs, seen, frontier = set(index.outputs), set(), [tensor]
    while frontier:
        name = frontier.pop()
        if name in outputs:
            return True
        if name in seen:
            continue
        seen.add(name)
        frontier.extend(t for n in index.consumer_nodes(name) if n.op_type in PASSTHROUGH for t in n.output if t)
    return False


def channel_statistics(model: onnx.ModelProto, names: list[str], samples: Iterable[object], *,
                       limit: int | None = None) -> dict[str, ChannelStats]:
    """Per-channel mean, std, min and max (over batch and spatial axes) of each named activation."""
    acc: dict[str, list[np.ndarray]] = {}
    for values in observe(model, names, samples, limit=limit):
        for name, value in values.items():
            v = np.asarray(value, dtype=np.float64)
            if v.ndim < 2:
                continue
            flat = np.moveaxis(v, 1, 0).reshape(v.shape[1], -1)
            parts = [np.full(flat.shape[0], flat.shape[1], dtype=np.float64), flat.sum(1), (flat ** 2).sum(1),
                     flat.min(1), flat.max(1)]
            if name not in acc:
                acc[name] = parts
            else:
                a = acc[name]
                acc[name] = [a[0] + parts[0], a[1] + parts[1], a[2] + parts[2],
                             np.minimum(a[3], parts[3]), np.maximum(a[4], parts[4])]
    stats = {}
    for name, (n, s, s2, lo, hi) in acc.items():
        mean = s / n
        std = np.sqrt(np.maximum(s2 / n - mean ** 2, 0.0))
        stats[name] = ChannelStats(mean=mean, std=std, min=lo, max=hi)
    return stats
