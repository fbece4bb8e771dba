"""Joins of tensors on very different scales: the join and everything after it stay in float.

A detector's head often ends in a Concat of box coordinates (0..640 pixels) and sigmoid class scores (0..1). ONNX
Runtime's quantizer gives the joined tensor one 8-bit grid over the whole range, a step of 640 / 255 = 2.5 there,
and every score rounds to 0 (found on a YOLOv8-style detector: all class scores of the INT8 model were 0, while the
output's SQNR, dominated by the coordinates, read 29 dB). Each input keeps its own grid when the join is left in
float: the scores on a 0..1 grid, the coordinates on theirs; the float Concat costs almost nothing. The nodes after
the join read the mixed tensor, so they stay in float too (each would quantize it on one grid again).

A join is mixed when the largest input magnitude is at least ``JOIN_RATIO`` times the smallest (ranges from a
calibration probe; constant inputs and all-zero inputs are left out): the small input then has at most 255 / 16 =
16 levels of the joined grid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import onnx

from npukit.frontend.graph_index import GraphIndex

JOIN_RATIO = 16.0
JOIN_OPS = frozenset({"Concat"})


@dataclasses.dataclass(frozen=True)
class MixedJoin:
    node: str
    magnitudes: dict[str, float]  # input tensor -> largest |value| in the probe
    ratio: float
    after: tuple[str, ...]  # the nodes downstream of the join, left in float with it

    def summary(self) -> dict:
        return {"node": self.node, "ratio": round(self.ratio, 1),
                "input_magnitudes": {k: round(v, 6) for k, v in self.magnitudes.items()}, "after": list(self.after)}


def _downstream(index: GraphIndex, start: onnx.NodeProto) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    frontier = list(start.output)
    while frontier:
        tensor = frontier.pop()
        for node in index.consumer_nodes(tensor):
            if node.name not in seen and node.name != start.name:
                seen[node.name] = None
                frontier.extend(node.output)
    return tuple(seen)


def mixed_scale_joins(model: onnx.ModelProto, ranges: Mapping[str, tuple[float, float]], *,
                      ratio: float = JOIN_RATIO) -> list[MixedJoin]:
    """The joins of ``model`` whose inputs' ranges (``ranges``: tensor -> (min, max)) differ by ``ratio`` or more."""
    index = GraphIndex(model.graph)
    found = []
    for node in index.nodes:
        if node.op_type not in JOIN_OPS:
            continue
        magnitudes = {t: max(abs(float(ranges[t][0])), abs(float(ranges[t][1]))) for t in node.input
                      if t and t not in index.constants and t in ranges}
        nonzero = [m for m in magnitudes.values() if m > 0]
        if len(nonzero) < 2:
            continue
        spread = max(nonzero) / min(nonzero)
        if spread >= ratio:
            found.append(MixedJoin(node.name, magnitudes, spread, _downstream(index, node)))
    return found
