"""Per-layer SQNR: how far each activation of the quantized model has drifted from the float model's.

Every float node output that exists under the same name in both models is exposed as a graph output of each; both
run on the same samples, and SQNR = 10 log10(sum ref^2 / sum (ref - quant)^2) is accumulated per tensor. In a QDQ
model, where a tensor goes through QuantizeLinear -> DequantizeLinear, the dequantized value is compared (ORT may
have folded a Relu/Clip into that quantization), so the figure is the error up to and including the layer's own
output quantization.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import onnx

from npukit.frontend.graph_index import GraphIndex
from npukit.quant.calibration.calibrate import float_activations, iter_samples, with_outputs
from npukit.runtime.ort import make_session


def sqnr_db(signal_energy: float, noise_energy: float) -> float:
    if noise_energy == 0.0:
        return math.inf
    if signal_energy == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal_energy / noise_energy)


def noise_ratio(db: float) -> float:
    """The noise-to-signal power ratio of an SQNR in dB (``sqnr_db``'s inverse)."""
    return 10.0 ** (-db / 10.0)


def _dequantized_names(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor -> the output of the DequantizeLinear that follows its QuantizeLinear."""
    q_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "QuantizeLinear"}
    dq_of = {n.input[0]: n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    return {t: dq_of[q] for t, q in q_of.items() if q in dq_of}


def layer_sqnr(float_model: onnx.ModelProto, quant_model: onnx.ModelProto, samples: Iterable[object], *,
               limit: int = 8) -> list[dict]:
    """One row per shared activation, in float-graph order: {"tensor", "node", "op_type", "sqnr_db"}."""
    index, in_quant = GraphIndex(float_model.graph), GraphIndex(quant_model.graph).producer
    names = [t for t in float_activations(float_model) if t in index.producer and t in in_quant]
    quant_name = _dequantized_names(quant_model)
    ref_session = make_session(with_outputs(float_model, names), optimization="basic")
    q_session = make_session(with_outputs(quant_model, [quant_name.get(n, n) for n in names]),
                             optimization="basic")
    ref_out = [o.name for o in ref_session.get_outputs()]
    q_out = [o.name for o in q_session.get_outputs()]
    signal = dict.fromkeys(names, 0.0)
    noise = dict.fromkeys(names, 0.0)
    for feeds in iter_samples(float_model, samples, limit=None):
        ref = dict(zip(ref_out, ref_session.run(None, feeds)))
        got = dict(zip(q_out, q_session.run(None, feeds)))
        for name in names:
            r = np.asarray(ref[name], dtype=np.float64)
            signal[name] += float(np.sum(r * r))
            q = np.asarray(got[quant_name.get(name, name)], dtype=np.float64)
            noise[name] += float(np.sum((r - q) ** 2))
        limit -= 1
        if limit <= 0:
            break
    return [{"tensor": n, "node": index.producer_node(n).name, "op_type": index.producer_op(n),
             "sqnr_db": sqnr_db(signal[n], noise[n])} for n in names]
