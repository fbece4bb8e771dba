from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, quantize

from npukit.runtime.ort import make_session, run
from npukit.runtime.qnn import HTP_QDQ_RULES, make_qnn_session, qdq_reference_session, qnn_quant_config
from tests.runtime.conftest import requires_qnn

pytestmark = requires_qnn


def _float_conv() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], name="relu")], "f",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


class _Reader(CalibrationDataReader):
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self._it = iter([{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(8)])

    def get_next(self):
        return next(self._it, None)


def test_htp_rules_quantize_uint16_activations_int8_symmetric_weights(tmp_path):
    src, out = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_float_conv(), src)
    quantize(str(src), str(out), qnn_quant_config(src, _Reader()))
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    ops = [n.op_type for n in model.graph.node]
    assert "Conv" in ops and ops.count("QuantizeLinear") >= 2
    weight_dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None
                     and inits[n.input[0]].dtype == np.int8)
    assert inits[weight_dq.input[1]].shape == (8,)  # per output channel
    assert not inits[weight_dq.input[2]].any()  # symmetric: zero points 0
    act_q = next(n for n in model.graph.node if n.op_type == "QuantizeLinear")
    assert inits[act_q.input[2]].dtype == np.uint16 == np.dtype(HTP_QDQ_RULES.activation_type)
    x = {"x": np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)}
    ref = run(make_session(_float_conv()), x)[0]
    sim = run(qdq_reference_session(model), x)[0]
    htp = run(make_qnn_session(model), x)[0]
    scale = float(np.abs(ref).max())
    assert np.abs(sim - ref).max() <= 1e-2 * scale  # int8 weights dominate the error
    assert np.abs(htp - sim).max() <= 1e-3 * scale  # the HTP agrees with the QDQ graph to 16-bit steps
