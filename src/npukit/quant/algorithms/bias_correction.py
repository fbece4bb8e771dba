"""Empirical bias correction: subtract from each Conv/Gemm bias the mean output shift quantization causes.

For a node y = W x + b whose weights will be quantized to Q(W), the shift E[Q(W) x] - E[W x] is measured per output
channel on calibration data (twin nodes without bias run beside the original, fed by the same float activations)
and subtracted from b; a zero bias is added where there is none. The step reads the quantization plan
(``npukit.quant.plan``): where it gives a node's input an 8-bit grid, the twin also sees its input as the quantized
model will, x_q = DQ(Q(x)), and the shift removed is E[Q(W) x_q] - E[W x]: the mean error of the layer's weight and
input quantization (rounding and clipping), one layer at a time, so corrections do not compound. Q is the weight's
grid in the plan: its fixed scales where a step set them (pair-bounded, AdaRound's), else ONNX Runtime's int8 weight
quantization on the scheme's levels (symmetric: [-127, 127]; asymmetric: [-128, 127]; reduced range: [-64, 64]);
the input's grid is ORT's 8-bit activation scale / zero point for the plan's range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.calibration.calibrate import observe
from npukit.quant.grids import fake_quantize, spec_qparams, weight_axis
from npukit.quant.nodes import node_attr
from npukit.quant.plan import QuantPlan


def quantize_node_weight(node: onnx.NodeProto, w: np.ndarray, plan: QuantPlan) -> np.ndarray:
    """Q(w) for ``node``'s weight on the grid ``plan`` gives it (``QuantPlan.weight_spec``: the plan's fixed scales
    where a step set them, a pair-bounded or AdaRound grid, else the scheme's levels)."""
    return fake_quantize(w, plan.weight_spec(node.input[1], weight_axis(node, per_channel=True)))


@dataclasses.dataclass(frozen=True)
class BiasCorrectionResult:
    model: onnx.ModelProto
    shifts: dict[str, np.ndarray]  # node name -> per-output-channel mean shift that was removed
    samples: int


def correct_bias(model: onnx.ModelProto, samples: Iterable[object], *, plan: QuantPlan, limit: int | None = None,
                 reference_weights: Mapping[str, np.ndarray] | None = None) -> BiasCorrectionResult:
    """A copy of ``model`` with each Conv/Gemm bias that ``plan`` quantizes corrected for its measured quantization
    shift, over the first ``limit`` samples (all when None).

    Each weight is rounded on the grid the plan gives it (``quantize_node_weight``); a node's input is quantized
    where the plan gives it an 8-bit grid with a range (16-bit inputs are left in float), so a plan without ranges
    (``QuantPlan()`` or a scheme's empty plan) accounts for weight rounding only.
    ``reference_weights`` (weight name -> float weight) are the weights the shift is measured against when
    ``model``'s own are already rounded (after AdaRound, whose rounding already compensates part of the input
    quantization's mean error): the shift removed is then E[Q(W~) x_q] - E[W x], the layer's whole remaining mean
    error, and nothing is corrected twice.
    """
    return correct_bias_each(model, samples, plans={"": plan}, limit=limit, reference_weights=reference_weights)[""]


def correct_bias_each(model: onnx.ModelProto, samples: Iterable[object], *, plans: Mapping[str, QuantPlan],
                      limit: int | None = None, reference_weights: Mapping[str, np.ndarray] | None = None
                      ) -> dict[str, BiasCorrectionResult]:
    """``correct_bias`` under each of several ``plans`` (key -> plan) that differ in their activation ranges only
    (the same float nodes and weight grids), measured in one pass over ``samples``: the float twins, and a quantized
    twin whose input grid two plans share, run once. Each result is the one ``correct_bias`` gives with that plan
    alone."""
    first = next(iter(plans.values()))
    if any(set(p.float_nodes) != set(first.float_nodes) for p in plans.values()):
        raise ValueError("correct_bias_each: the plans must leave the same nodes in float")
    inits = GraphIndex(model.graph).initializers
    targets = [n for n in model.graph.node
               if n.op_type in ("Conv", "Gemm") and n.name not in first.float_nodes and len(n.input) > 1
               and n.input[1] in inits]
    if not targets:
        return {key: BiasCorrectionResult(model=model, shifts={}, samples=0) for key in plans}
    probe, shift_names = _shift_probe(model, targets, plans, reference_weights)
    wanted = list(dict.fromkeys(t for names in shift_names.values() for t in names.values()))
    sums: dict[str, np.ndarray] = {}
    count = 0
    for values in observe(probe, wanted, samples, limit=limit):
        count += 1
        for name, value in values.items():
            v = np.moveaxis(np.asarray(value, dtype=np.float64), 1, 0)
            mean = v.reshape(v.shape[0], -1).mean(axis=1)
            sums[name] = sums.get(name, 0.0) + mean
    results = {}
    for key, names in shift_names.items():
        shifts = {node.name: sums[names[node.name]] / count for node in targets}
        results[key] = BiasCorrectionResult(model=_with_biases_corrected(model, targets, shifts), shifts=shifts,
                                            samples=count)
    return results


def _shift_probe(model: onnx.ModelProto, targets: list[onnx.NodeProto], plans: Mapping[str, QuantPlan],
                 reference_weights: Mapping[str, np.ndarray] | None
                 ) -> tuple[onnx.ModelProto, dict[str, dict[str, str]]]:
    """A copy of ``model`` that also computes, per target node and per plan, its output shift: a twin of the node
    with the quantized weights (on the quantized input, where the plan gives it an 8-bit grid) minus one with the
    float weights on the float input; key -> node name -> the tensor holding its shift. Twins that two plans would
    build alike (the float one, a quantized one on the same input grid) are built once."""
    grids = {key: plan.activation_grids(bits=8) for key, plan in plans.items()}
    first = next(iter(plans.values()))
    inits = GraphIndex(model.graph).initializers
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    shift_names: dict[str, dict[str, str]] = {key: {} for key in plans}

    def twin(node: onnx.NodeProto, source: str, weight: np.ndarray, name: str) -> str:
        probe.graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), f"{name}_w"))
        made = helper.make_node(node.op_type, [source, f"{name}_w"], [name])
        made.attribute.extend(a for a in node.attribute if a.name != "beta")
        probe.graph.node.append(made)
        return name

    for k, node in enumerate(targets):
        own = numpy_helper.to_array(inits[node.input[1]])
        wq = quantize_node_weight(node, own, first)
        w = own
        if reference_weights is not None and node.input[1] in reference_weights:
            w = np.asarray(reference_weights[node.input[1]], dtype=np.float32)
        x = node.input[0]
        float_twin: str | None = None
        by_grid: dict[tuple[bytes, bytes] | None, str] = {}
        for key, key_grids in grids.items():
            if x in key_grids:
                scale, zero = spec_qparams(key_grids[x])
                grid: tuple[bytes, bytes] | None = (np.asarray(scale).tobytes(), np.asarray(zero).tobytes())
            else:
                grid = None
            if grid not in by_grid:
                j = len(by_grid)
                if grid is None:
                    by_grid[grid] = twin(node, x, wq - w, f"npukit_bc_d_{k}_{j}")
                else:
                    qargs = [f"npukit_bc_scale_{k}_{j}", f"npukit_bc_zero_{k}_{j}"]
                    probe.graph.initializer.extend([numpy_helper.from_array(scale, qargs[0]),
                                                    numpy_helper.from_array(zero, qargs[1])])
                    probe.graph.node.extend([
                        helper.make_node("QuantizeLinear", [x, *qargs], [f"npukit_bc_xq_{k}_{j}"]),
                        helper.make_node("DequantizeLinear", [f"npukit_bc_xq_{k}_{j}", *qargs],
                                         [f"npukit_bc_x_{k}_{j}"]),
                    ])
                    quantized = twin(node, f"npukit_bc_x_{k}_{j}", wq, f"npukit_bc_q_{k}_{j}")
                    if float_twin is None:
                        float_twin = twin(node, x, w, f"npukit_bc_f_{k}")
                    probe.graph.node.append(helper.make_node("Sub", [quantized, float_twin],
                                                             [f"npukit_bc_out_{k}_{j}"]))
                    by_grid[grid] = f"npukit_bc_out_{k}_{j}"
            shift_names[key][node.name] = by_grid[grid]
    return probe, shift_names


def _with_biases_corrected(model: onnx.ModelProto, targets: list[onnx.NodeProto],
                           shifts: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose target nodes' biases have their mean shift taken off (a bias added where there is
    none; a replaced bias initializer dropped when nothing else reads it)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out_index = GraphIndex(out.graph)  # read for the original biases and nodes only
    out_inits = out_index.initializers
    by_name = {n.name: n for n in out_index.nodes}
    replaced: set[str] = set()
    for k, node in enumerate(targets):
        shift = shifts[node.name]
        target = by_name[node.name]
        beta = node_attr(target, "beta", 1.0) if target.op_type == "Gemm" else 1.0
        if len(target.input) > 2 and target.input[2]:
            replaced.add(target.input[2])
            bias = numpy_helper.to_array(out_inits[target.input[2]]).astype(np.float64)
            bias = np.broadcast_to(bias, shift.shape) if bias.size == 1 else bias
        else:
            bias = np.zeros_like(shift)
        name = f"{node.name or 'node'}_bias_corrected_{k}"
        out.graph.initializer.append(numpy_helper.from_array((bias - shift / beta).astype(np.float32), name))
        if len(target.input) > 2:
            target.input[2] = name
        else:
            target.input.append(name)
    used = {t for n in out.graph.node for t in n.input}
    graph_inputs = {i.name for i in out.graph.input}
    for init in [i for i in out.graph.initializer if i.name in replaced and i.name not in used | graph_inputs]:
        out.graph.initializer.remove(init)
    return out
