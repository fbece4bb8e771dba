"""Float (non-QDQ) models on the HTP: fp16 precision and a soc_model by default, as the QNN EP requires."""

from __future__ import annotations

import numpy as np

from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import FLOAT_HTP_SOC, QNN_EP, float_htp_options, make_qnn_session, qnn_node_assignment
from npukit.targets.qnn_htp import SOCS
from tests.runtime.conftest import requires_qnn
from tests.runtime.tiny_qdq import float_conv_model, qdq_conv_model

FP16_DEFAULTS = {"enable_htp_fp16_precision": "1", "soc_model": str(SOCS[FLOAT_HTP_SOC].soc_model),
                 "htp_arch": str(SOCS[FLOAT_HTP_SOC].htp_arch)}


def test_float_model_gets_fp16_and_soc_defaults():
    assert float_htp_options(float_conv_model(), None) == FP16_DEFAULTS


def test_caller_options_win_over_the_float_defaults():
    assert float_htp_options(float_conv_model(), {"soc_model": "43", "htp_arch": 73}) == {
        "enable_htp_fp16_precision": "1", "soc_model": "43", "htp_arch": "73"}
    assert float_htp_options(float_conv_model(), {"htp_arch": "73"})["soc_model"] == str(SOCS["SM8550"].soc_model)
    assert float_htp_options(float_conv_model(), {"enable_htp_fp16_precision": "0"}) == {
        "enable_htp_fp16_precision": "0"}


def test_qdq_model_and_other_backends_are_left_alone():
    assert float_htp_options(qdq_conv_model(), {"htp_arch": "75"}) == {"htp_arch": "75"}
    assert float_htp_options(float_conv_model(), None, backend="cpu") == {}


@requires_qnn
def test_tiny_float_conv_runs_on_htp_in_fp16_and_matches_cpu():
    model = float_conv_model()
    feeds = {"x": np.random.default_rng(1).uniform(-1.5, 1.5, (1, 3, 8, 8)).astype(np.float32)}
    session = make_qnn_session(model)
    assert session.get_providers()[0] == QNN_EP
    htp = run(session, feeds)[0]
    cpu = run(make_session(model), feeds)[0]
    assert htp.shape == cpu.shape == (1, 4, 8, 8)
    # fp16 carries 11 significant bits: a 27-term dot product in fp16 stays within ~1e-2 relative of fp32.
    np.testing.assert_allclose(htp, cpu, rtol=1e-2, atol=1e-2 * float(np.abs(cpu).max()))
    assignment = qnn_node_assignment(model)
    assert [n.provider for n in assignment.nodes] == [QNN_EP, QNN_EP]
