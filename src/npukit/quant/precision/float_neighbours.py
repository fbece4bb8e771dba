"""The light nodes a float region reaches stay in float with it: its activations, and what lies between two of its
nodes.

A float region (a float stem and the convs after it, a float join and its tail, a user's ``--exclude``) ends at its
nodes, not at the activations ONNX Runtime fuses into them. Left alone, ORT's quantizer gives each light node a Q/DQ
pair on every side: a float Conv's LeakyRelu runs as float -> quantize -> QLinearLeakyRelu -> dequantize. That is
a rounding of the activation's input on a grid wide enough for its negative side, a second rounding after it, two
conversions, and the float Conv's fused activation lost. Two kinds of node join the region here:

- an elementwise node (``ELEMENTWISE``: an activation, arithmetic) whose every activation input the region writes:
  an activation runs fused into the float conv before it, a SiLU's x * Sigmoid(x) is one float multiply, and the
  tensor it writes is the first one quantized (once, where ORT would have quantized each input and the result);
- any other node but heavy compute (``HEAVY``, which the precision steps decide) that takes every activation from
  a float node or a graph input and whose every reader is float (or that is a graph output): quantizing it buys no
  integer kernel, only roundings between two float nodes.

Repeated until nothing more joins; a chain of light nodes between two float nodes joins as a whole.

Found on RetinaFace (MobileNet-0.25), whose float head's LeakyRelus were quantized between its float convs: 40 dB
of noise on the stem's activation leaves the box output at 7 dB, because the depthwise conv after it multiplies some
channels by up to 63 (a folded BatchNorm). With the region closed, its box output went from 7.9 to 12.0 dB SQNR
against the float model on held-out photos (mAP@0.5 0.90 -> 0.97) and its INT8 latency from 1.18x to 1.12x the
float model's (AMD EPYC, AVX2; the float head, timed with the region closed, also grew from two convs to four).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import onnx_ir as ir

HEAVY = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "ConvInteger", "MatMulInteger"})
# Computed value by value: the activations ORT fuses into a float conv, and arithmetic on the region's tensors (a
# SiLU written out as x * Sigmoid(x)).
ELEMENTWISE = frozenset({"Relu", "LeakyRelu", "PRelu", "Clip", "Elu", "Selu", "Celu", "Sigmoid", "HardSigmoid",
                         "HardSwish", "Tanh", "Softplus", "Softsign", "Mish", "Gelu", "ThresholdedRelu",
                         "Add", "Sub", "Mul", "Div", "Max", "Min", "Sum", "Mean", "Neg", "Abs", "Sqrt", "Exp"})
AFTER = "elementwise"  # the two kinds of node float_neighbours adds
BETWEEN = "between"


def float_neighbours(model: onnx.ModelProto, float_nodes: Iterable[str], *,
                     keep: Iterable[str] = ()) -> dict[str, str]:
    """The nodes of ``model`` that join the float region ``float_nodes`` (see the module docstring), in graph
    order, each with its kind (``AFTER`` or ``BETWEEN``); never a node of ``float_nodes`` or of ``keep`` (nodes the
    plan quantizes by name: 16-bit nodes)."""
    floats, kept = set(float_nodes), set(keep)
    if not floats:
        return {}
    graph = ir.serde.deserialize_model(model).graph
    added: dict[str, str] = {}
    light = [n for n in graph if n.name not in floats and n.name not in kept and n.op_type not in HEAVY
             and n.op_type != "Constant" and any(not _constant(v) for v in n.inputs if v is not None)]
    while True:
        grown = _between(light, floats) | _elementwise_after(light, floats)  # elementwise: that kind
        if not grown:
            break
        floats |= set(grown)
        added |= grown
    return {n.name: added[n.name] for n in graph if n.name in added}


def _from(value: ir.Value, nodes: set[str]) -> bool:
    if _constant(value):
        return True
    producer = value.producer()
    return producer.name in nodes if producer is not None else value.is_graph_input()


def _elementwise_after(light: list[ir.Node], floats: set[str]) -> dict[str, str]:
    """Elementwise nodes whose every activation input a float node (or one added here) writes."""
    found: dict[str, str] = {}
    for node in light:  # graph order: a chain of them joins in one walk
        if node.name not in floats and node.op_type in ELEMENTWISE \
                and all(_from(v, floats | set(found)) for v in node.inputs if v is not None):
            found[node.name] = AFTER
    return found


def _between(light: list[ir.Node], floats: set[str]) -> dict[str, str]:
    """The largest set of light nodes whose inputs come from float nodes, graph inputs or the set, and whose
    readers are float nodes or in the set (a chain of light nodes between two float nodes joins as a whole)."""
    members = {n.name: n for n in light if n.name not in floats}
    changed = True
    while changed:
        changed = False
        inside = floats | set(members)
        for name, node in list(members.items()):
            readers = [user for out in node.outputs for user, _ in out.uses()]
            ends = any(out.is_graph_output() for out in node.outputs)
            if not all(_from(v, inside) for v in node.inputs if v is not None) or not (readers or ends) \
                    or not all(user.name in inside for user in readers):
                del members[name]
                changed = True
    return dict.fromkeys(members, BETWEEN)


def _constant(value: ir.Value) -> bool:
    producer = value.producer()
    return value.is_initializer() or (producer is not None and producer.op_type == "Constant")
