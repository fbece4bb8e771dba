"""npukit.runtime.htp_precision: per-layer int8 / 16-bit / float16 on the HTP emulator, on the tiny test CNN."""

from __future__ import annotations

import numpy as np
import onnx

from npukit.quant.precision.layer_plan import Check
from npukit.runtime.compile import soc_provider_options
from npukit.runtime.htp_precision import W8A8, layer_tensors, plan_htp_precision
from npukit.runtime.htp_quant import quantize_for_htp
from npukit.runtime.ort import make_session
from npukit.runtime.qnn import float_htp_options, float_layers, make_qnn_session
from tests.quant.conftest import make_samples, tiny_cnn
from tests.runtime.conftest import requires_qnn


def _sqnr_on_htp(model: onnx.ModelProto, reference: onnx.ModelProto, samples) -> float:
    htp = make_qnn_session(model, provider_options=soc_provider_options("SM8650"))
    ref = make_session(reference)
    signal = noise = 0.0
    for feeds in samples:
        want = np.asarray(ref.run(None, feeds)[0], np.float64)
        got = np.asarray(htp.run(None, feeds)[0], np.float64)
        signal, noise = signal + float((want**2).sum()), noise + float(((want - got) ** 2).sum())
    return 10.0 * np.log10(signal / noise)


def test_float16_layers_stay_float_and_turn_on_the_htps_fp16_mode() -> None:
    model, samples = tiny_cnn(spread=1.0), make_samples(4)
    built = quantize_for_htp(model, samples, rules=W8A8, float_nodes=("dw", "pw"))
    assert sorted(float_layers(built.model)) == ["dw", "pw"]
    assert float_htp_options(built.model, soc_provider_options("SM8650"))["enable_htp_fp16_precision"] == "1"
    plain = quantize_for_htp(model, samples, rules=W8A8)
    assert float_layers(plain.model) == [] and "enable_htp_fp16_precision" not in float_htp_options(
        plain.model, soc_provider_options("SM8650"))
    node = next(n for n in built.float_model.graph.node if n.name == "conv1")
    assert layer_tensors(built.float_model, node) == ("x", "c1", "a1")  # its input, output, the Relu after it


@requires_qnn
def test_the_plan_lifts_layers_until_the_htp_meets_the_floor() -> None:
    model, samples = tiny_cnn(spread=1.0), make_samples(8)
    base = _sqnr_on_htp(quantize_for_htp(model, samples, rules=W8A8).model, model, samples)
    floor = base + 1.0

    def accept(candidate: onnx.ModelProto) -> Check:
        value = _sqnr_on_htp(candidate, model, samples)  # loads whole on the HTP or raises
        return Check(value >= floor, f"{value:.2f} dB")

    plan = plan_htp_precision(model, samples, accept=accept)
    assert plan.tried[0]["lifted"] == 0 and not plan.tried[0]["passed"]
    assert plan.met and plan.assignment and set(plan.assignment.values()) <= {"int16", "float16"}
    assert _sqnr_on_htp(plan.result.model, model, samples) >= floor  # the model returned is the one that passed
    assert sorted(float_layers(plan.result.model)) == sorted(plan.float_nodes)
    summary = plan.summary()
    assert summary["energy_added_pj"] > 0 and set(summary["macs"]) == {"conv1", "dw", "pw", "fc"}
    easy = plan_htp_precision(model, samples, accept=lambda m: Check(True, "ok"))
    assert easy.met and easy.assignment == {} and easy.result.model is not None


def test_a_plan_the_htp_does_not_take_whole_fails_its_check_and_the_search_goes_on() -> None:
    from npukit.errors import InputError

    model, samples = tiny_cnn(spread=1.0), make_samples(4)
    calls = []

    def accept(candidate: onnx.ModelProto) -> Check:
        calls.append(candidate)
        if len(calls) > 1:  # every plan with a layer lifted
            raise InputError("the QNN htp backend does not take every node of the model (x: Failed to add node.)")
        return Check(False, "below the floor")

    plan = plan_htp_precision(model, samples, accept=accept)
    assert not plan.met and len(plan.tried) >= 2
    assert any(t["line"].startswith("not taken whole by the HTP") for t in plan.tried)


def test_an_htp_without_a_float_unit_is_offered_16_bit_activations_only() -> None:
    """compile --mixed-precision --soc SM8350 (v68, no float unit) offered float16 layers, which the HTP fails to
    finalize (QNN_COMMON_ERROR_MEM_ALLOC): the search ended with no plan where all-16-bit passed at 88.9 dB."""
    model, samples = tiny_cnn(spread=1.0), make_samples(4)
    plan = plan_htp_precision(model, samples, accept=lambda m: Check(False, "below"), float16=False)
    assert plan.options and {o.precision for o in plan.options} == {"int16"}
    assert set(plan.assignment.values()) <= {"int16"} and not plan.float_nodes


@requires_qnn
def test_a_float16_layer_next_to_a_16_bit_layer_keeps_the_tensor_between_them_8_bit() -> None:
    from npukit.runtime.htp_precision import _htp_lists

    model, samples = tiny_cnn(spread=1.0), make_samples(4)
    reference = quantize_for_htp(model, samples, rules=W8A8).float_model
    by_name = {n.name: n for n in reference.graph.node}
    floats, wide = _htp_lists(reference, by_name, {"dw": "float16", "pw": "int16", "conv1": "int16"})
    assert floats == ("dw",) and set(wide) == {"x", "c1", "c3"}  # a1 (dw's input) and a2 (its output) stay 8-bit
    built = quantize_for_htp(model, samples, rules=W8A8, uint16_tensors=wide, float_nodes=floats)
    make_qnn_session(built.model, provider_options=soc_provider_options("SM8650"))  # the HTP takes it whole
