"""The light nodes a float region reaches (a float conv's activation, a node between float nodes) stay in float
with it: no Q/DQ inside the region, the first tensor quantized is the one the int8 part reads."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npukit.measure.fidelity import sqnr_db
from npukit.quant import qdq
from npukit.quant.config import Precision, QuantConfig, Scheme
from npukit.quant.precision.float_neighbours import AFTER, BETWEEN, float_neighbours
from npukit.quant.qdq import quantize
from tests.quant.conftest import make_samples, outputs, tiny_cnn


def _graph(nodes: list[onnx.NodeProto], outputs_: tuple[str, ...] = ("y",)) -> onnx.ModelProto:
    inits = [numpy_helper.from_array(np.ones((4, 4, 1, 1), np.float32), f"w{i}") for i in range(6)]
    inits.append(numpy_helper.from_array(np.full((4, 1, 1), 0.1, np.float32), "slope"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 4, 4])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs_], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _conv(name: str, src: str, dst: str, w: int) -> onnx.NodeProto:
    return helper.make_node("Conv", [src, f"w{w}"], [dst], name=name)


def test_activations_of_float_nodes_and_nodes_between_them_join_the_region() -> None:
    model = _graph([
        _conv("a", "x", "ca", 0),
        helper.make_node("LeakyRelu", ["ca"], ["la"], name="act_a", alpha=0.1),      # after float a
        _conv("b", "la", "cb", 1),
        helper.make_node("PRelu", ["cb"], ["pb"], name="act_b"),                    # slope: a constant input
        helper.make_node("MaxPool", ["pb"], ["mb"], name="pool_b", kernel_shape=[1, 1]),  # read by int8 c: quantized
        _conv("c", "mb", "cc", 2),
        helper.make_node("Relu", ["cc"], ["rc"], name="act_c"),                     # after int8 c: quantized
        helper.make_node("Add", ["rc", "pb"], ["s"], name="add"),                   # one input from int8 c
        _conv("d", "s", "cd", 3),
        _conv("e", "x", "ce", 4),
        helper.make_node("Concat", ["cd", "ce"], ["de"], name="join", axis=1),    # float d, e -> float f
        helper.make_node("Reshape", ["de", "shape"], ["r"], name="reshape"),     # an output from float only
        _conv("f", "de", "y", 5),
        _conv("g", "x", "cg", 0),
        helper.make_node("Sigmoid", ["cg"], ["sg"], name="sigmoid"),             # a SiLU after float g: one float
        helper.make_node("Mul", ["cg", "sg"], ["silu"], name="silu"),            # multiply, quantized once after it
        _conv("h", "silu", "y2", 1),
    ], ("y", "r", "y2"))
    model.graph.node[1].input[:] = ["ca"]
    model.graph.node[3].input[:] = ["cb", "slope"]
    model.graph.initializer.append(numpy_helper.from_array(np.array([1, -1], np.int64), "shape"))
    found = float_neighbours(model, {"a", "b", "d", "e", "f", "g"})
    assert found == {"act_a": AFTER, "act_b": AFTER, "join": BETWEEN, "reshape": BETWEEN, "sigmoid": AFTER,
                     "silu": AFTER}
    # a node the plan quantizes by name (a 16-bit node) stays quantized, and nothing past it joins through it
    assert float_neighbours(model, {"a", "b", "d", "e", "f", "g"}, keep={"act_a", "sigmoid"}) == {
        "act_b": AFTER, "join": BETWEEN, "reshape": BETWEEN}
    # heavy compute between float nodes is the precision steps' to decide
    assert "c" not in float_neighbours(model, {"b", "d"})
    assert float_neighbours(model, ()) == {}


def test_a_graph_output_written_from_float_nodes_only_stays_float() -> None:
    model = _graph([_conv("a", "x", "ca", 0), _conv("b", "x", "cb", 1),
                    helper.make_node("Concat", ["ca", "cb"], ["y"], name="both", axis=1),
                    helper.make_node("Add", ["ca", "cb"], ["y2"], name="sum")], ("y", "y2"))
    assert float_neighbours(model, {"a", "b"}) == {"both": BETWEEN, "sum": AFTER}
    assert float_neighbours(model, {"a"}) == {}  # b is int8: what reads its output stays int8 too
    # a chain of light nodes between two float convs joins as a whole
    chain = _graph([_conv("a", "x", "ca", 0),
                    helper.make_node("Transpose", ["ca"], ["t1"], name="t1", perm=[0, 1, 3, 2]),
                    helper.make_node("Transpose", ["t1"], ["t2"], name="t2", perm=[0, 1, 3, 2]),
                    _conv("b", "t2", "cb", 1), _conv("c", "cb", "y", 2)])
    assert float_neighbours(chain, {"a", "b"}) == {"t1": BETWEEN, "t2": BETWEEN}
    assert float_neighbours(chain, {"a", "c"}) == {}


def _hidden_imbalance(seed: int = 0) -> onnx.ModelProto:
    """tiny_cnn with LeakyRelus where conv1's output channels are scaled by 10**U(-1.5, 1.5) and the depthwise conv's
    by the inverse: the same function (LeakyRelu is positively homogeneous), but a1's small channels are multiplied
    back up by the depthwise conv, as a folded BatchNorm does in RetinaFace's MobileNet-0.25."""
    model = tiny_cnn(seed=seed, activation="LeakyRelu", spread=0.0)
    scale = 10.0 ** np.random.default_rng(seed + 7).uniform(-1.5, 1.5, 8)
    inits = {i.name: i for i in model.graph.initializer}
    for name, factor in (("w1", scale[:, None, None, None]), ("b1", scale), ("w2", 1.0 / scale[:, None, None, None])):
        inits[name].CopyFrom(numpy_helper.from_array((numpy_helper.to_array(inits[name]) * factor)
                                                     .astype(np.float32), name))
    return model


def test_quantizing_between_float_convs_would_cost_accuracy_the_region_keeps(monkeypatch) -> None:
    model = _hidden_imbalance()
    calib, held_out = make_samples(16, seed=1), make_samples(16, seed=2)
    config = QuantConfig(scheme=Scheme(exclude=("conv1", "dw")), precision=Precision(float_head=None))
    reference = outputs(model, held_out)

    def quantized_tensors(result) -> set[str]:
        return {n.input[0] for n in result.model.graph.node if n.op_type == "QuantizeLinear"}

    with_region = quantize(model, calib, config=config)
    assert set(with_region.plan.float_nodes) == {"conv1", "act1", "dw", "act2"}
    assert not quantized_tensors(with_region) & {"c1", "a1", "c2"}  # nothing quantized inside the region
    assert "a2" in quantized_tensors(with_region)  # the first tensor the int8 part reads
    monkeypatch.setattr(qdq, "float_neighbours", lambda *a, **k: {})
    without = quantize(model, calib, config=config)
    assert {"a1", "c2"} <= quantized_tensors(without)
    gained = sqnr_db(reference, outputs(with_region.model, held_out))
    lost = sqnr_db(reference, outputs(without.model, held_out))
    print(f"held-out output SQNR: {gained:.1f} dB with the region, {lost:.1f} dB quantized inside it")
    assert gained > lost + 3.0, (gained, lost)
