"""Mixed precision per layer for the QNN HTP: from the all-int8 model (int8 weights, uint8 activations: the HTP's
fastest), each Conv / ConvTranspose / Gemm stays int8, takes 16-bit activations (its input and output at uint16,
ORT inserting the conversions) or runs in float16 (left float in the QDQ model: the HTP runs it in fp16 with
``enable_htp_fp16_precision``), chosen until the model passes the caller's check (the task floors, on the HTP).

The HTP here is Qualcomm's emulator: it runs the real HTP arithmetic but its speed is not a device's, so the cost of
an option is an estimate, labelled so: the energy its MACs add at the option's type over int8
(``npukit.measure.energy.MAC_PJ``, Horowitz ISSCC 2014: int8 0.3 pJ, 16-bit 0.9 pJ, float16 1.5 pJ per MAC), the
one per-operator cost figure npukit has that covers float16. Support is measured: every checked model must load on
the HTP whole (no CPU fallback), or the check fails.

The steps (as ``npukit.quant.precision.layer_plan`` on the CPU, with the HTP's build and costs):

- the all-int8 model: ``quantize_for_htp`` with uint8 activations (GPTQ and bias correction as for 16 bits);
- gain of an option: the output noise-to-signal power ratio it removes on the QDQ graph's CPU reference
  (``qnn.qdq_reference_session``: Q/DQ in float, no fused kernels), estimated by surgery on the all-int8 model
  built without GPTQ and bias correction (their corrections of each layer include the error of the layers before
  it, so removing one layer's error alone there over-corrects the next: the tiny test CNN's gains all came out
  negative):
  float16 gives the layer its float weights and bias (the fp16 rounding is not modelled); int16 removes the rounding
  of its input and output activations (a Clip to the same grid keeps the saturation). Cheap, so every layer is
  scanned; the check on the HTP decides;
- options by gain per estimated picojoule, doubling then bisecting (``layer_plan.smallest_passing``) until a model
  built for real (``quantize_for_htp`` with ``float_nodes`` and ``uint16_tensors``) passes ``accept``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from npukit.errors import InputError
from npukit.frontend.graph_index import GraphIndex
from npukit.measure.energy import MAC_PJ
from npukit.quant.calibration.auto import output_sqnrs
from npukit.quant.layer_sqnr import noise_ratio, sqnr_db
from npukit.quant.precision.layer_plan import Check, LayerOption, assignment_of, search_order, smallest_passing
from npukit.quant.precision.tensor_precision import CHUNK, activation_pairs, without_rounding
from npukit.runtime.htp_quant import HtpQuantResult, quantize_for_htp
from npukit.runtime.qnn import HTP_QDQ_RULES, qdq_reference_session

HTP_OPTIONS = ("int16", "float16")
W8A8 = dataclasses.replace(HTP_QDQ_RULES, activation_type="uint8")  # the all-int8 start
_LAYERS = ("Conv", "ConvTranspose", "Gemm")


@dataclasses.dataclass(frozen=True)
class HtpLayerPlan:
    """``assignment``: node -> "int16" or "float16" (every other layer int8); ``float_nodes`` / ``uint16_tensors``:
    how ``quantize_for_htp`` builds it; ``result``: that build; ``met``: it passed ``accept``; ``options``: every
    layer's estimated gain and cost (``added_ms`` holds picojoules here, see ``cost_unit``); ``tried``: the models
    checked; ``macs``: per layer."""

    assignment: Mapping[str, str]
    float_nodes: tuple[str, ...]
    uint16_tensors: tuple[str, ...]
    result: HtpQuantResult
    met: bool
    options: tuple[LayerOption, ...]
    tried: tuple[dict, ...]
    macs: Mapping[str, int]
    base_sqnr_db: float
    samples: int
    cost_unit: str = "pJ (estimated: MACs x the type's energy over int8)"

    def summary(self) -> dict[str, Any]:
        added = sum(o.added_ms for o in self.options if self.assignment.get(o.node) == o.precision)
        return {"assignment": dict(self.assignment), "met": self.met, "samples": self.samples,
                "base_sqnr_db": self.base_sqnr_db, "tried": list(self.tried), "cost_unit": self.cost_unit,
                "energy_added_pj": added, "macs": dict(self.macs),
                "options": [dataclasses.asdict(o) for o in self.options]}


def layer_tensors(model: onnx.ModelProto, node: onnx.NodeProto) -> tuple[str, ...]:
    """The activations a 16-bit layer lifts: its data input and its output, and the output of a Relu / Clip that
    alone reads it (ORT folds that activation into the output's grid)."""
    out = node.output[0]
    tensors = [node.input[0], out]
    after = GraphIndex(model.graph).consumer_nodes(out)
    if len(after) == 1 and after[0].op_type in ("Relu", "Clip"):
        tensors.append(after[0].output[0])
    return tuple(tensors)


def _with_float_weights(qdq: onnx.ModelProto, float_model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``qdq`` with node ``name`` reading its float weight and bias (the float model's) instead of their
    DequantizeLinear outputs."""
    out = onnx.ModelProto()
    out.CopyFrom(qdq)
    f_node = next(n for n in float_model.graph.node if n.name == name)
    f_inits = GraphIndex(float_model.graph).initializers
    node = next(n for n in out.graph.node if n.name == name)
    for slot in range(1, min(len(node.input), len(f_node.input))):
        if f_node.input[slot] in f_inits:
            tensor = numpy_helper.from_array(numpy_helper.to_array(f_inits[f_node.input[slot]]), f"{name}_float_{slot}")
            out.graph.initializer.append(tensor)
            node.input[slot] = tensor.name
    return out


def _estimated_gains(base: HtpQuantResult, samples: Sequence[dict], n: int, layers: Sequence[onnx.NodeProto],
                     options: Sequence[str] = HTP_OPTIONS) -> tuple[float, dict[tuple[str, str], float]]:
    """Base output noise-to-signal ratio and each (layer, option)'s estimated reduction of it (module docstring)."""
    reference = base.float_model
    pairs = activation_pairs(base.model)

    def variant(node: onnx.NodeProto, option: str) -> onnx.ModelProto:
        if option == "float16":
            return _with_float_weights(base.model, reference, node.name)
        return without_rounding(base.model, [pairs[t] for t in layer_tensors(reference, node) if t in pairs])

    keys = [(node, option) for node in layers for option in options
            if option == "float16" or any(t in pairs for t in layer_tensors(reference, node))]
    scores = output_sqnrs(reference, {"": base.model}, samples, start=0, stop=n, session=qdq_reference_session)
    base_nsr = noise_ratio(scores[""])
    gains: dict[tuple[str, str], float] = {}
    for i in range(0, len(keys), CHUNK):  # variants built per chunk, as tensor_precision.scan_gains does
        chunk = {f"{node.name}:{option}": variant(node, option) for node, option in keys[i:i + CHUNK]}
        for key, db in output_sqnrs(reference, chunk, samples, start=0, stop=n,
                                    session=qdq_reference_session).items():
            node_name, option = key.rsplit(":", 1)
            gains[(node_name, option)] = base_nsr - noise_ratio(db)
    return base_nsr, gains


def _htp_lists(reference: onnx.ModelProto, by_name: Mapping[str, onnx.NodeProto], layers: Mapping[str, str]
               ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(float nodes, uint16 tensors) of an assignment. A tensor a float16 layer reads or writes (or the lone Relu /
    Clip after it) stays 8-bit: the HTP refuses a float16 layer next to a 16-bit tensor (measured on the tiny test
    CNN: its depthwise conv in float16 with the conv before or after it at 16 bits fails with "dw_bias_dq: Failed to
    add node"; each alone loads; MobileNetV2's search stopped on the same failure)."""
    floats = tuple(n for n, p in layers.items() if p == "float16")
    touched = {t for n in floats for t in layer_tensors(reference, by_name[n])}
    wide = tuple(dict.fromkeys(t for n, p in layers.items() if p == "int16"
                               for t in layer_tensors(reference, by_name[n]) if t not in touched))
    return floats, wide


def plan_htp_precision(model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]], *,
                       accept: Callable[[onnx.ModelProto], Check], scan_samples: int = 8,
                       float16: bool = True) -> HtpLayerPlan:
    """The fewest options, by estimated gain per picojoule, that make the HTP model pass ``accept`` (which should
    run it on the HTP); see the module docstring. ``met`` False: every option that helps was taken and the model
    still fails (the plan is that model). ``float16`` False: 16-bit activations only (an HTP without a float unit,
    v68, fails to finalize a graph with a float16 layer)."""
    from npukit.measure.summary import summarize

    samples = list(samples)
    n = min(scan_samples, len(samples))
    base = quantize_for_htp(model, samples, rules=W8A8)
    plain = quantize_for_htp(model, samples, rules=dataclasses.replace(W8A8, gptq=False, bias_correction=False))
    reference = base.float_model
    macs = {row.name: int(row.macs or 0) for row in summarize(reference).layers if row.op in _LAYERS}
    layers = [node for node in reference.graph.node if node.op_type in _LAYERS and node.name in macs]
    base_nsr, gains = _estimated_gains(plain, samples, n, layers, HTP_OPTIONS if float16 else ("int16",))
    options = [LayerOption(node, option, gain, gain / base_nsr if base_nsr > 0 else 0.0,
                           macs[node] * (MAC_PJ[option] - MAC_PJ["int8"]))
               for (node, option), gain in gains.items()]
    order = search_order(options, floor_ms=1.0)  # costs in pJ: at least 1
    by_name = {node.name: node for node in layers}
    tried: list[dict] = []
    built: dict[tuple, tuple[HtpQuantResult, Check]] = {}

    def build(layers_: Mapping[str, str]) -> HtpQuantResult:
        floats, wide = _htp_lists(reference, by_name, layers_)
        return quantize_for_htp(model, samples, rules=W8A8, uint16_tensors=wide, float_nodes=floats)

    def passes(layers_: dict[str, str]) -> bool:
        key = tuple(sorted(layers_.items()))
        if key not in built:
            result = base if not layers_ else build(layers_)
            try:
                check = accept(result.model)
            except InputError as exc:  # the HTP does not take the model whole: that plan fails, the search goes on
                first = str(exc).splitlines()[0]
                first = first if len(first) <= 200 else first[:200].rsplit(" ", 1)[0] + " ..."  # not mid-word
                check = Check(False, f"not taken whole by the HTP: {first}")
            built[key] = (result, check)
            tried.append({"lifted": len(layers_), "passed": built[key][1].passed, "line": built[key][1].line})
        return built[key][1].passed

    size = 0 if passes({}) else (smallest_passing(len(order), lambda k: passes(assignment_of(order[:k])))
                                  if order else None)
    met = size is not None
    chosen = assignment_of(order[:size if met else len(order)])
    passes(chosen)  # built and checked already, unless no plan passed
    result = built[tuple(sorted(chosen.items()))][0]
    floats, wide = _htp_lists(reference, by_name, chosen)
    return HtpLayerPlan(assignment=chosen, float_nodes=floats, uint16_tensors=wide,
                        result=result, met=met, options=tuple(options), tried=tuple(tried), macs=macs,
                        base_sqnr_db=float(sqnr_db(1.0, base_nsr)) if base_nsr > 0 else float("inf"), samples=n)
