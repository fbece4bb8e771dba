from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npukit.errors import InputError
from npukit.memory.graph import OpNode, TensorGraph
from npukit.memory.lifetimes import lifetimes_of
from npukit.memory.measure import measure_ort_peak
from npukit.memory.ort_cpu import OrtExecutedGraph, ort_allocation, ort_executed_graph, without_graph_inputs
from npukit.memory.planners import best_plan, check_plan

from .tiny import _model, conv_relu_add, stacked_convs, two_branches


def _executed(nodes, shapes, inputs=("x",), outputs=("y",)) -> OrtExecutedGraph:
    sizes = {name: int(np.prod(shape)) * 4 for name, shape in shapes.items()}
    graph = TensorGraph(nodes=tuple(nodes), sizes=sizes, inputs=tuple(inputs), outputs=tuple(outputs))
    return OrtExecutedGraph(graph=graph, shapes=shapes, itemsizes=dict.fromkeys(shapes, 4), optimization="all",
                            layout_ops=0)


def test_replay_reuses_the_latest_freed_buffer_of_the_same_shape_and_holds_it_in_between():
    # a (16 ch) dies at step 1; b (32 ch) is big; c (16 ch) takes a's buffer, which therefore stays allocated while
    # b lives: ORT's peak is a + b + (nothing new for c) = 3 units, where freeing a at once and placing c anywhere
    # would need the same 3 units at step 1 but only 2 later; the replay must keep a's buffer through steps 1..3.
    small, big = (1, 16, 8, 8), (1, 32, 8, 8)
    nodes = [OpNode("n0", "Conv", ("x",), ("a",)), OpNode("n1", "Conv", ("a",), ("b",)),
             OpNode("n2", "Conv", ("b",), ("c",)), OpNode("n3", "Relu", ("c",), ("r",), inplace_inputs=("c",)),
             OpNode("n4", "Reshape", ("r",), ("v",), alias=True), OpNode("n5", "Conv", ("v",), ("y",))]
    shapes = {"x": small, "a": small, "b": big, "c": small, "r": small, "v": (1, 1024), "y": small}
    buffers = {t.name: t for t in ort_allocation(_executed(nodes, shapes)).tensors}
    assert set(buffers) == {"a", "b", "y"}  # c reuses a (freelist), r is c in place, v a view of r, y a graph output
    assert buffers["a"].tensors == ("a", "c", "r", "v") and (buffers["a"].start, buffers["a"].end) == (0, 5)
    assert (buffers["b"].start, buffers["b"].end) == (1, 2)
    lifetimes = ort_allocation(_executed(nodes, shapes))
    assert lifetimes.peak_bytes == 4096 + 8192  # a's buffer and b at steps 1-2; y and a's buffer at step 5


def test_replay_never_reuses_across_shapes_or_into_graph_outputs():
    nodes = [OpNode("n0", "Conv", ("x",), ("a",)), OpNode("n1", "Conv", ("a",), ("b",)),
             OpNode("n2", "Conv", ("b",), ("c",)), OpNode("n3", "Relu", ("c",), ("y",), inplace_inputs=("c",))]
    shapes = {"x": (1, 4, 4, 4), "a": (1, 4, 4, 4), "b": (1, 4, 16, 1), "c": (1, 4, 4, 4), "y": (1, 4, 4, 4)}
    buffers = {t.name: t for t in ort_allocation(_executed(nodes, shapes)).tensors}
    # b has a's byte size but not its shape: a new buffer; c reuses a; y is a graph output: never in place.
    assert set(buffers) == {"a", "b", "y"} and buffers["a"].tensors == ("a", "c")


def test_executed_graph_is_read_from_ort_with_every_shape(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(conv_relu_add(), str(path))
    executed = ort_executed_graph(path)
    graph = executed.graph
    produced = [o for node in graph.nodes for o in node.outputs]
    assert {"s", "m"} <= set(produced) and set(graph.outputs) == {"s", "m"}
    assert all(name in executed.shapes for name in produced)
    assert executed.shapes["s"] == (1, 32) and executed.shapes["m"] == (1, 2, 2, 2)
    lifetimes = ort_allocation(executed)
    tensor_lifetimes = lifetimes_of(graph)
    check_plan(tensor_lifetimes, best_plan(tensor_lifetimes))
    assert without_graph_inputs(lifetimes).peak_bytes > 0
    with pytest.raises(InputError, match="does not exist"):
        ort_executed_graph(tmp_path / "missing.onnx")
    with pytest.raises(InputError, match="optimization level"):
        ort_executed_graph(path, optimization="max")


def test_executed_graph_has_the_same_order_and_names_every_time(tmp_path):
    """ORT creates its ReorderOutput nodes in the order of a hash map keyed by pointers: the Concat's inputs, hence the
    order of the six branches (and the peak of a tiled model), changed from one session to the next, as did their
    names. They are renumbered stably: as if created in the order of the NCHWc nodes that feed them."""
    path = tmp_path / "stacked.onnx"
    onnx.save(stacked_convs(6), str(path))
    seen = {tuple((node.name, node.op, node.outputs) for node in ort_executed_graph(path).graph.nodes)
            for _ in range(5)}
    assert len(seen) == 1
    (nodes,) = seen
    convs = [outputs[0] for _, op, outputs in nodes if op == "nchwc:ReorderOutput"]
    if convs:  # NCHWc: x86 only
        assert convs == [f"c{k}" for k in range(6)]  # the last NCHWc node made (conv0's) runs first


def test_execution_order_replays_orts_own_where_nothing_is_left_to_chance(tmp_path):
    from npukit.memory.ort_cpu import _ort_node_indices, ort_execution_order
    from npukit.runtime.ort import make_session

    for make in (conv_relu_add, two_branches, _dense_block):  # at most one ReorderOutput per model here
        path = tmp_path / f"{make.__name__}.onnx"
        onnx.save(make(), str(path))
        make_session(path, optimized_model_path=str(tmp_path / "optimized.onnx"))
        saved = list(onnx.load(str(tmp_path / "optimized.onnx")).graph.node)
        indices = _ort_node_indices(path, "all", tmp_path / "optimized.ort")
        assert indices is not None
        assert [n.name for n in ort_execution_order(saved, indices)] == [n.name for n in saved]


def test_reorder_outputs_take_their_indices_in_the_order_of_their_producers():
    from npukit.memory.ort_cpu import NCHWC, _stable_reorder_outputs

    nodes = [(0, NCHWC, "Conv", ["x"], "n0"), (1, NCHWC, "Conv", ["x"], "n1"), (2, "", "Concat", ["a", "b"], "y"),
             (3, NCHWC, "ReorderOutput", ["n1"], "b"), (4, NCHWC, "ReorderOutput", ["n0"], "a")]
    assert _stable_reorder_outputs(nodes) == {"n0": 0, "n1": 1, "y": 2, "a": 3, "b": 4}


def _dense_block() -> onnx.ModelProto:
    """A DenseNet-like block at 1x32x64x64 (512 KiB per 32 channels): every layer reads the concatenation of all
    earlier maps, so many same-shape buffers die and are reused while bigger ones live."""
    rng = np.random.default_rng(0)
    inits, nodes, features = [], [], ["x"]
    channels = 32
    for layer in range(4):
        cat = f"cat{layer}"
        nodes.append(helper.make_node("Concat", features, [cat], axis=1) if len(features) > 1
                     else helper.make_node("Identity", features, [cat]))
        inits.append(numpy_helper.from_array(rng.standard_normal((64, channels, 1, 1)).astype(np.float32) * 0.1,
                                             f"w{layer}a"))
        inits.append(numpy_helper.from_array(rng.standard_normal((32, 64, 3, 3)).astype(np.float32) * 0.1,
                                             f"w{layer}b"))
        nodes += [helper.make_node("Conv", [cat, f"w{layer}a"], [f"h{layer}"]),
                  helper.make_node("Relu", [f"h{layer}"], [f"r{layer}"]),
                  helper.make_node("Conv", [f"r{layer}", f"w{layer}b"], [f"f{layer}"], pads=[1, 1, 1, 1])]
        features.append(f"f{layer}")
        channels += 32
    nodes.append(helper.make_node("Concat", features, ["y"], axis=1))
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64, 64])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 64, 64])], inits)


@pytest.mark.slow
def test_replayed_peak_predicts_the_measured_one(tmp_path):
    path = tmp_path / "dense.onnx"
    onnx.save(_dense_block(), str(path))
    predicted = without_graph_inputs(ort_allocation(ort_executed_graph(path))).peak_bytes
    measured = measure_ort_peak(path, arena=False).peak_bytes
    assert abs(predicted - measured) <= 0.1 * measured, (predicted, measured)
