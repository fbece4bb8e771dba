"""Which node of an exported torch program a later node came from: through torch's decompositions and passes (the
``from_node`` provenance torch records) and through the ONNX exporter (the fx node it writes into each ONNX node's
metadata). Lets a prediction made on the ONNX model be checked against what a torch backend did with the program."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch

FX_NODE_KEY = "pkg.torch.onnx.fx_node"  # the ONNX exporter's record of the fx node an ONNX node translates


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a backend put what one node of an exported program became (its nodes after the backend's lowering)."""

    origin: str  # the node's name in the exported program
    target: str  # its op (aten.conv2d.default, ...)
    delegated: int  # how many of its lowered nodes run inside the backend's delegate
    left: tuple[str, ...]  # the ops of its lowered nodes left outside it (to the runtime's own CPU kernels)

    @property
    def where(self) -> str:
        """"delegated" (all of it), "cpu" (none), "split" (some) or "removed" (no lowered node left)."""
        if not self.left:
            return "delegated" if self.delegated else "removed"
        return "split" if self.delegated else "cpu"


def placements(exported: torch.export.ExportedProgram, delegated: Mapping[str, int],
               left: Mapping[str, Sequence[str]]) -> dict[str, Placement]:
    """A Placement for each call node of ``exported``, from what a backend's lowering counted per origin: its nodes
    inside the delegate (``delegated``) and the ops of those left outside (``left``)."""
    return {n.name: Placement(origin=n.name, target=str(n.target), delegated=delegated.get(n.name, 0),
                              left=tuple(left.get(n.name, ())))
            for n in exported.graph.nodes if n.op == "call_function"}


def origin(node: torch.fx.Node) -> str:
    """The name of the node of the first exported program ``node`` descends from, or its own name when torch
    recorded no provenance."""
    sources = node.meta.get("from_node")
    if not sources:
        return node.name
    source = sources[-1]
    while source.from_node:
        source = source.from_node[-1]
    return source.name


def onnx_nodes_by_origin(program: Any) -> dict[str, list[str]]:
    """The node of the exported program -> the names of the ONNX nodes it became (Constant nodes left out), for a
    ``torch.onnx.ONNXProgram`` made by the dynamo exporter from an ExportedProgram (``program.exported_program`` is
    the one it decomposed). An ONNX node without the exporter's record is left out; a torch node the optimizer
    folded into another's ONNX node (a conv into its BatchNorm's) has none."""
    decomposed = {n.name: origin(n) for n in program.exported_program.graph.nodes}
    nodes: dict[str, list[str]] = collections.defaultdict(list)
    for node in program.model_proto.graph.node:
        record = next((p.value for p in node.metadata_props if p.key == FX_NODE_KEY), "")
        name = record.split(" ", 1)[0].lstrip("%")
        if name in decomposed and node.op_type != "Constant":
            nodes[decomposed[name]].append(node.name)
    return dict(nodes)
