"""Buffers bound once: an ONNX Runtime session's inputs and outputs for one batch size, allocated up front and
reused by every call (ORT's IOBinding over OrtValues that wrap our own numpy arrays).

A plain ``session.run(None, feeds)`` allocates every output tensor anew on each call (and Python objects around
them); a ``BoundBuffers`` allocates nothing per call: the request's inputs are copied into the bound input arrays,
ORT writes into the bound output arrays, and the caller reads them (``views``: valid until the next call on the same
buffers) or takes copies. Output shapes are found once by running the model on the bound inputs; a model whose output
shape depends on the input values (NMS, nonzero) cannot be bound and says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from npukit.errors import InputError
from npukit.runtime.ort import input_dtype


@dataclasses.dataclass(frozen=True)
class InputSignature:
    """One model input: its name, dtype and shape with ``None`` where the model leaves a dimension symbolic."""

    name: str
    dtype: np.dtype
    shape: tuple[int | None, ...]

    @property
    def batched(self) -> bool:
        """Whether axis 0 is symbolic (requests can be stacked along it)."""
        return bool(self.shape) and self.shape[0] is None


def signatures(session: ort.InferenceSession) -> list[InputSignature]:
    return [InputSignature(i.name, input_dtype(i.type),
                           tuple(d if isinstance(d, int) and d > 0 else None for d in i.shape))
            for i in session.get_inputs()]


class BoundBuffers:
    """Inputs and outputs of ``session`` bound to arrays of ``shapes`` (input name -> full shape), allocated once."""

    def __init__(self, session: ort.InferenceSession, shapes: Mapping[str, Sequence[int]]) -> None:
        self.session = session
        self.inputs: dict[str, np.ndarray] = {}
        self._binding = session.io_binding()
        self._values = []  # the OrtValues must outlive the binding
        for sig in signatures(session):
            array = np.zeros(tuple(int(d) for d in shapes[sig.name]), dtype=sig.dtype)
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_input(sig.name, value)
            self.inputs[sig.name] = array
            self._values.append(value)
        self.output_names = [o.name for o in session.get_outputs()]
        probe = session.run(self.output_names, self.inputs)  # output shapes for these input shapes
        self.outputs: list[np.ndarray] = []
        for name, sample in zip(self.output_names, probe):
            array = np.empty_like(np.asarray(sample))
            value = ort.OrtValue.ortvalue_from_numpy(array)
            self._binding.bind_ortvalue_output(name, value)
            self.outputs.append(array)
            self._values.append(value)

    def run(self, feeds: Mapping[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Copy ``feeds`` (when given) into the bound inputs, run, and return the bound output arrays (views that the
        next call overwrites)."""
        if feeds is not None:
            for name, array in self.inputs.items():
                np.copyto(array, feeds[name], casting="no")
        try:
            self.session.run_with_iobinding(self._binding)
        except Exception as exc:  # ORT raises its own types; a bound output of the wrong shape is the usual cause
            raise InputError(f"the bound run failed: {str(exc).strip().splitlines()[0] if str(exc).strip() else exc}",
                             hint="an output whose shape depends on the input values cannot be bound: serve the "
                                  "model with pool=False") from exc
        return self.outputs
