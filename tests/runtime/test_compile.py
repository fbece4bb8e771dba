from __future__ import annotations

import numpy as np
import onnx
import pytest

from npukit.errors import InputError
from npukit.runtime.compile import compile_qnn_context, soc_info
from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import make_qnn_session
from tests.runtime.conftest import requires_qnn
from tests.runtime.tiny_qdq import qdq_conv_model

pytestmark = requires_qnn


@pytest.mark.parametrize("soc, arch", [("SM8350", 68), ("sm8650", 75)])
def test_compile_reload_and_match(tmp_path, soc, arch):
    model = qdq_conv_model()
    out = tmp_path / f"ctx_{soc}.onnx"
    result = compile_qnn_context(model, out, soc=soc)
    assert result.output == out and out.is_file()
    assert result.soc == soc.upper() and result.htp_arch == arch
    assert result.context_nodes == 1 and result.other_nodes == 0
    assert 0 < result.context_binary_bytes < result.model_bytes
    assert result.identical and result.max_abs_diff == 0.0
    assert result.qnn_ep_version and result.qnn_sdk_version and result.qnn_sdk_version in result.device_requirements
    assert f"v{arch}" in result.device_requirements
    compiled = onnx.load_model(str(out))
    assert [n.op_type for n in compiled.graph.node] == ["EPContext"]
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically, nothing left behind
    # The compiled model, run on its own, agrees with the float-simulated QDQ model on the CPU within one step.
    x = {"x": np.random.default_rng(3).uniform(-1.5, 1.5, (1, 3, 8, 8)).astype(np.float32)}
    htp = run(make_qnn_session(out, provider_options={"htp_arch": str(arch)}), x)[0]
    cpu = run(make_session(model, optimization="disable"), x)[0]  # exact QDQ semantics
    assert np.abs(htp - cpu).max() <= 6.0 / 255 + 1e-5


def test_context_binaries_differ_per_soc(tmp_path):
    blobs = []
    for soc in ("SM8350", "SM8650"):
        compile_qnn_context(qdq_conv_model(), tmp_path / f"{soc}.onnx", soc=soc)
        node = onnx.load_model(str(tmp_path / f"{soc}.onnx")).graph.node[0]
        blobs.append(next(a.s for a in node.attribute if a.name == "ep_cache_context"))
    assert blobs[0] != blobs[1]


def test_unknown_soc_lists_valid_ones(tmp_path):
    with pytest.raises(InputError, match="unknown Snapdragon SoC 'SM9999'") as info:
        compile_qnn_context(qdq_conv_model(), tmp_path / "x.onnx", soc="SM9999")
    assert "SM8350" in info.value.hint and "SM8650" in info.value.hint
    assert soc_info(" sm8550 ").htp_arch == 73
    assert not (tmp_path / "x.onnx").exists()


def test_float_model_is_rejected(tmp_path):
    float_model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "f",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(InputError, match="QDQ"):
        compile_qnn_context(float_model, tmp_path / "f.onnx", soc="SM8650")


def test_symbolic_shape_is_rejected(tmp_path):
    with pytest.raises(InputError, match="symbolic dimension"):
        compile_qnn_context(qdq_conv_model(batch="N"), tmp_path / "s.onnx", soc="SM8650")
