"""Input-size buckets: a model with symbolic sizes served at a few fixed sizes, each a static model with a runtime
of its own (as an NPU needs, and as ORT runs fastest with fixed shapes), requests padded to the nearest bucket.

``BucketedRuntime(model, buckets=[(1, 3, 320, 320), (1, 3, 480, 480), ...])`` fixes the model's one input to each
shape (``frontend.shapes.fix_input_shape``) and starts a ``Runtime`` per bucket. A request goes to the smallest
bucket (fewest elements) that holds it on every axis; with ``fit="pad"`` a smaller request is zero-padded at the
end of each axis (bottom and right of an image: box coordinates stay those of the original frame), with
``fit="exact"`` only a request of a bucket's own shape is taken. The padding each request cost (padded elements over
the bucket's) is recorded. A request no bucket holds fails on its own future.

A padded request's outputs come back at the request's size where they are maps over the input's last two (spatial)
axes: an output whose last two sizes are the bucket's divided by one integer stride (a segmentation or text map at
the input's resolution, a feature map at 1/8 of it) is cropped to the request's sizes divided by that stride,
rounded up. Other outputs (boxes in the frame's coordinates, class scores) come back as the bucket's model gives
them, and so does every output written into ``out`` buffers (bucket-sized). Near the request's bottom and right
edges a cropped map may differ from a session run at the request's own size: the model sees the zeros beyond them,
and strided layers align differently (``measure.serving.measure_buckets`` measures how much).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import onnx

from npukit.errors import InputError
from npukit.runtime.engine import Runtime, RuntimeConfig, ordered_map

FITS = ("pad", "exact")


class BucketedRuntime:
    """See the module docstring. ``config`` / ``overrides`` configure every bucket's ``Runtime``."""

    def __init__(self, model: onnx.ModelProto | str | os.PathLike[str], buckets: Sequence[Sequence[int]],
                 config: RuntimeConfig | None = None, *, fit: str = "pad", **overrides: Any) -> None:
        from npukit.frontend.onnx_io import graph_inputs, load_onnx
        from npukit.frontend.shapes import fix_input_shape

        if fit not in FITS:
            raise InputError(f"unknown fit {fit!r}", hint="use pad or exact")
        if not buckets:
            raise InputError("no buckets given", hint="give at least one input shape, e.g. (1, 3, 320, 320)")
        proto = model if isinstance(model, onnx.ModelProto) else load_onnx(model)
        inputs = graph_inputs(proto)
        if len(inputs) != 1:
            raise InputError(f"buckets take a model with one input, this one has {len(inputs)}",
                             hint="serve it with Runtime at one fixed shape")
        self.input = inputs[0].name
        self.fit = fit
        shapes = sorted({tuple(int(d) for d in b) for b in buckets}, key=lambda s: (math.prod(s), s))
        self.runtimes: dict[tuple[int, ...], Runtime] = {}
        try:
            for shape in shapes:
                self.runtimes[shape] = Runtime(fix_input_shape(proto, shape, dynamic_batch=False), config,
                                               **overrides)
        except BaseException:
            self.close()
            raise
        self.padding: list[float] = []  # per request: padded elements / the bucket's elements

    def bucket_for(self, shape: Sequence[int]) -> tuple[int, ...] | None:
        """The smallest bucket that takes a request of ``shape`` (see the module docstring), or None."""
        shape = tuple(shape)
        for bucket in self.runtimes:
            if len(bucket) != len(shape):
                continue
            if bucket == shape or (self.fit == "pad" and all(s <= b for s, b in zip(shape, bucket))):
                return bucket
        return None

    def submit(self, feeds: Mapping[str, np.ndarray], *, out: Sequence[np.ndarray] | None = None) -> Future:
        array = feeds.get(self.input) if isinstance(feeds, Mapping) else None
        bucket = self.bucket_for(np.shape(array)) if isinstance(array, np.ndarray) and len(feeds) == 1 else None
        if bucket is None:
            future: Future = Future()
            what = f"shape {list(np.shape(array))}" if isinstance(array, np.ndarray) else f"inputs {sorted(feeds)}"
            future.set_exception(InputError(
                f"no bucket takes a request with {what} (buckets: {', '.join(str(list(b)) for b in self.runtimes)}, "
                f"fit {self.fit})", hint=f"send one {self.input!r} array no larger than the largest bucket"))
            return future
        if array.shape == bucket:
            self.padding.append(0.0)
            return self.runtimes[bucket].submit({self.input: array}, out=out)
        padded = np.zeros(bucket, dtype=array.dtype)
        padded[tuple(slice(0, n) for n in array.shape)] = array
        self.padding.append(1.0 - array.size / padded.size)
        future = self.runtimes[bucket].submit({self.input: padded}, out=out)
        if out is not None or len(bucket) < 3 or array.shape[:-2] != bucket[:-2]:
            return future
        return _cropped(future, array.shape[-2:], bucket[-2:])

    def run(self, feeds: Mapping[str, np.ndarray], *, out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        return self.submit(feeds, out=out).result()

    def map(self, requests: Iterable[Mapping[str, np.ndarray]], *, in_flight: int = 8) -> Iterator[list[np.ndarray]]:
        return ordered_map(self.submit, requests, in_flight)

    def close(self, *, drain: bool = True) -> None:
        for runtime in self.runtimes.values():
            runtime.close(drain=drain)

    def __enter__(self) -> BucketedRuntime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def describe(self) -> dict:
        pads = np.asarray(self.padding or [0.0])
        return {"fit": self.fit, "buckets": {str(list(b)): rt.describe() for b, rt in self.runtimes.items()},
                "requests": len(self.padding), "padded_share_mean": float(pads.mean()),
                "padded_requests": int(np.count_nonzero(pads))}


def crop_maps(outputs: Sequence[np.ndarray], request: Sequence[int], bucket: Sequence[int]) -> list[np.ndarray]:
    """``outputs`` of a request of spatial sizes ``request`` (H, W) padded to ``bucket``'s: each output whose last
    two sizes are the bucket's divided by one integer stride cropped to the request's divided by it (rounded up);
    the others as they are."""
    out = []
    for o in outputs:
        o = np.asarray(o)
        sizes = list(zip(bucket, o.shape[-2:])) if o.ndim >= 3 and all(o.shape[-2:]) else []
        if sizes and all(b % n == 0 for b, n in sizes) and len({b // n for b, n in sizes}) == 1:
            stride = sizes[0][0] // sizes[0][1]
            keep = tuple(-(-r // stride) for r in request)
            o = np.ascontiguousarray(o[..., :keep[0], :keep[1]])
        out.append(o)
    return out


def _cropped(future: Future, request: Sequence[int], bucket: Sequence[int]) -> Future:
    """A future of ``future``'s outputs cropped back to the request's sizes (``crop_maps``)."""
    result: Future = Future()

    def done(f: Future) -> None:
        if f.cancelled():
            result.cancel()
        elif f.exception() is not None:
            result.set_exception(f.exception())
        else:
            result.set_result(crop_maps(f.result(), request, bucket))

    future.add_done_callback(done)
    return result

