"""Squares that a root, a logarithm or a division reads back: the chain between them stays in float.

A spectrogram's magnitude is sqrt(re^2 + im^2); a LayerNorm written out as operators divides by
sqrt(mean((x - mean)^2) + eps); a log-power feature takes log(sum(x^2)). A square doubles a tensor's dynamic range in
decibels: on one 8-bit grid set by its largest values the small ones round to zero, and the root, logarithm or
reciprocal that reads them back magnifies exactly their error. The output SQNR does not see it on the square itself
(its energy is in the large values), so calibration cannot: found on Silero VAD (its STFT magnitude is Pow, Pow, Add,
Sqrt), whose speech probability came out at 11.1 dB SQNR (8.9 dB with min/max ranges, on which the squares' own grid
SQNR reads 34-36 dB) and at 37.7 dB, its worst output at 25.3 dB, with those four nodes in float and everything around
them in int8 (0.80x the float model's latency on ORT, AMD EPYC AVX2).

A chain starts at a square (``Pow`` with a constant exponent of 2 or more, ``Mul`` of a tensor by itself,
``ReduceSumSquare``), runs through nodes that carry the power forward (sums, means, scaling, linear maps with constant
weights such as a mel filter bank, and ops that only move values), and ends at a node that reads it back (``Sqrt``,
``Log``, ``Reciprocal``, ``Pow`` with an exponent below 1, or a ``Div`` whose divisor it is). Every node on such a
path, the square and the reader included, stays in float; the tensors before and after keep their 8-bit grids. A
square no reader reaches within ``MAX_DEPTH`` nodes is left alone.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.frontend.graph_index import GraphIndex

MAX_DEPTH = 6  # nodes from the square to the reader, the reader included (LayerNorm: Pow, ReduceMean, Add, Sqrt: 3)

CARRIERS = frozenset({"Add", "Sub", "Sum", "Mul", "ReduceSum", "ReduceMean", "GlobalAveragePool", "AveragePool",
                      "MatMul", "Gemm", "Relu", "Clip", "Max",
                      "Concat", "Split", "Reshape", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Gather",
                      "Identity", "Expand", "Tile"})
ROOTS = frozenset({"Sqrt", "Log", "Reciprocal"})


@dataclasses.dataclass(frozen=True)
class SquareChain:
    square: str  # the node that squares
    reader: str  # the root, logarithm or division that reads the power back
    nodes: tuple[str, ...]  # square, carriers, reader: the nodes left in float, in graph order

    def summary(self) -> dict:
        return {"square": self.square, "reader": self.reader, "nodes": list(self.nodes)}


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {name: numpy_helper.to_array(t) for name, t in GraphIndex(model.graph).constant_tensors.items()}


def _exponent(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> float | None:
    value = constants.get(node.input[1]) if len(node.input) > 1 else None
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def _is_square(node: onnx.NodeProto, constants: dict[str, np.ndarray]) -> bool:
    if node.op_type == "Pow":
        exponent = _exponent(node, constants)
        return exponent is not None and exponent >= 2
    if node.op_type == "Mul":
        return len(node.input) == 2 and node.input[0] == node.input[1]
    return node.op_type == "ReduceSumSquare"


def _reads_back(node: onnx.NodeProto, tensor: str, constants: dict[str, np.ndarray]) -> bool:
    """Whether ``node`` takes a root, logarithm or reciprocal of ``tensor``."""
    if node.op_type in ROOTS:
        return True
    if node.op_type == "Pow" and node.input[0] == tensor:
        exponent = _exponent(node, constants)
        return exponent is not None and exponent < 1
    return node.op_type == "Div" and len(node.input) > 1 and node.input[1] == tensor


def _carries(node: onnx.NodeProto, tensor: str, constants: dict[str, np.ndarray]) -> bool:
    """Whether ``node`` passes the power in ``tensor`` on: a sum, mean, scaling or move, or a linear map whose
    weights are constant (not a product of two computed tensors other than by a constant)."""
    if node.op_type == "Div":
        return node.input[0] == tensor and len(node.input) > 1 and node.input[1] in constants
    if node.op_type in ("Mul", "MatMul", "Gemm"):
        return all(t == tensor or t in constants for t in node.input if t)
    return node.op_type in CARRIERS


def square_chains(model: onnx.ModelProto, *, max_depth: int = MAX_DEPTH) -> list[SquareChain]:
    """Each square of ``model`` that a root, logarithm or division reads back within ``max_depth`` nodes, with
    the nodes between."""
    index = GraphIndex(model.graph)
    constants = _constants(model)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    chains = []
    for square in model.graph.node:
        if not _is_square(square, constants):
            continue
        on_path: dict[str, None] = {}
        found: list[str] = []

        def walk(node: onnx.NodeProto, path: tuple[str, ...]) -> None:
            if len(path) > max_depth:
                return
            for tensor in node.output:
                for reader in index.consumer_nodes(tensor):
                    if reader.name in path:
                        continue
                    if _reads_back(reader, tensor, constants):
                        on_path.update(dict.fromkeys((*path, reader.name)))
                        found.append(reader.name)
                    elif _carries(reader, tensor, constants):
                        walk(reader, (*path, reader.name))

        walk(square, (square.name,))
        if found:
            nodes = tuple(sorted(on_path, key=order.__getitem__))
            chains.append(SquareChain(square.name, found[0], nodes))
    return chains
