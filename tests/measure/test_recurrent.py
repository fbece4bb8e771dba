"""A recurrent model checked with each model fed its own state (measure.recurrent), and the task check that holds
the state fed back to the SQNR floor: a quantized Silero VAD passed at 24 dB per step and was at 18-19 dB once it
ran on its own state."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.recurrent import roll, state_pairs
from npukit.measure.task_fidelity import session_runner
from npukit.report.core import Report
from npukit.runtime.ort import make_session
from npukit.tasks import QualityGate


def _leaky(decay: float) -> onnx.ModelProto:
    """y = decay * state + x, stateN = y: an error in ``decay`` is small per step and builds up fed back."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["state", "a"], ["m"]), helper.make_node("Add", ["m", "x"], ["stateN"]),
         helper.make_node("Tanh", ["stateN"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("state", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("stateN", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(np.array(decay, np.float32), "a")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _samples(count: int = 24) -> list[dict[str, np.ndarray]]:
    """Feeds whose state is the reference's own after the sample before (as the zoo's Silero feeds are)."""
    rng = np.random.default_rng(0)
    state, out = np.zeros((1, 8), np.float32), []
    for _ in range(count):
        x = rng.uniform(-0.2, 0.2, (1, 8)).astype(np.float32)
        out.append({"x": x, "state": state})
        state = (0.95 * state + x).astype(np.float32)
    return out


@pytest.mark.parametrize("inputs, outputs, expected", [
    (("input", "state", "sr"), ("output", "stateN"), {"state": "stateN"}),  # Silero VAD
    (("x", "h0", "c0"), ("y", "hn", "cn"), {"h0": "hn", "c0": "cn"}),  # an exported LSTM
    (("x", "hidden_in"), ("y", "hidden_out"), {"hidden_in": "hidden_out"}),
    (("x", "past_key_values.0.key"), ("y", "present.0.key"), {"past_key_values.0.key": "present.0.key"}),
    (("x", "mask"), ("y", "z"), {}),  # same shapes, nothing names a state
    # a transformer layer's hidden states are not its state (it was run on its own output 16 times), nor is a
    # denoiser's image: names that both mention a state, or one name with a suffix naming none, are no pair
    (("hidden_states", "attention_mask"), ("last_hidden_state", "pooled"), {}),
    (("image", "noise_level"), ("image_out", "noise_map"), {}),
])
def test_state_pairs_by_name_shape_and_dtype(inputs, outputs, expected):
    feeds = {name: np.zeros((1, 8), np.float32) for name in inputs}
    assert state_pairs(feeds, [np.zeros((1, 8), np.float32)] * len(outputs), outputs) == expected
    assert state_pairs(feeds, [np.zeros((1, 9), np.float32)] * len(outputs), outputs) == {}  # other shape
    assert state_pairs(feeds, [np.zeros((1, 8), np.float16)] * len(outputs), outputs) == {}  # other dtype


def test_an_image_to_image_model_is_not_recurrent():
    image = np.zeros((1, 3, 8, 8), np.float32)
    assert state_pairs({"state": image}, [image], ["stateN"]) == {}  # one input: its output is not fed back


def test_roll_builds_up_the_error_the_state_carries():
    reference, candidate = (session_runner(make_session(_leaky(d))) for d in (0.95, 0.97))
    rolled = roll(reference, candidate, _samples(), ["y", "stateN"])
    assert rolled is not None and rolled.pairs == (("state", "stateN"),) and rolled.steps == 24
    fed_back = {o.name: o.sqnr_db for o in rolled.outputs}
    one_step = {"y": [], "stateN": []}
    for feeds in _samples():  # the same samples, each with the reference's state (what a one-step check sees)
        for name, r, c in zip(["y", "stateN"], reference(feeds), candidate(feeds)):
            one_step[name].append((np.asarray(r), np.asarray(c)))
    from npukit.measure.fidelity import sqnr_db

    for name, pairs in one_step.items():
        single = sqnr_db(np.stack([r for r, _ in pairs]), np.stack([c for _, c in pairs]))
        assert fed_back[name] < single - 3, (name, fed_back[name], single)
    assert roll(reference, reference, _samples(), ["y", "stateN"]).outputs[0].sqnr_db == float("inf")
    assert roll(reference, candidate, _samples()[:1], ["y", "stateN"]) is None  # one sample: nothing fed back


def test_the_task_check_holds_the_state_fed_back_to_the_floor():
    from npukit.verbs.common import task_check

    samples = _samples()
    report = Report("bench", config={})
    _, result, verdict = task_check(report, _leaky(0.95), _leaky(0.953), samples, task="generic",
                                    gate=QualityGate(min_sqnr_db=40.0), what="bench", where="test samples")
    one_step = min(o.sqnr_db for o in result.outputs)
    assert one_step >= 40.0  # each step alone passes the floor
    assert not verdict.passed and "with each model fed its own state over 24 samples" in verdict.line, verdict.line
    assert report.sections["recurrent_check"]["pairs"] == [["state", "stateN"]]
    report = Report("bench", config={})
    _, _, verdict = task_check(report, _leaky(0.95), _leaky(0.95), samples, task="generic", gate=QualityGate(),
                               what="bench", where="test samples")
    assert verdict.passed and "state (state) fed back over 24 samples in order: worst output" in verdict.line, \
        verdict.line


def test_the_state_is_rolled_over_the_data_in_order_not_the_checks_spread_samples():
    """compile checked Silero on every 8th chunk of 64 and rolled its state across them (28.9 dB fed back); over
    all 64 in order the same artifact gave 16.3 dB. task_check rolls over ``sequence``, the data in its order."""
    from npukit.measure.recurrent import in_order
    from npukit.verbs.common import task_check

    samples = _samples(32)
    assert in_order(samples, 5) == samples[:5]
    report = Report("bench", config={})
    task_check(report, _leaky(0.95), _leaky(0.96), samples[::8], task="generic", gate=QualityGate(), what="bench",
               where="every 8th", sequence=samples)
    assert report.sections["recurrent_check"]["steps"] == 32  # the data's 32 in order, not the check's 4
