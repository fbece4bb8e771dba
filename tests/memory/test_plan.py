from __future__ import annotations

import onnx
import pytest

from npukit.errors import InputError
from npukit.memory.plan import plan_memory
from npukit.report.memory import memory_report

from .tiny import conv_relu_add, sliced_branches, two_branches


def test_plan_memory_report_has_planners_layers_and_a_timeline(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(conv_relu_add(), str(path))
    result = plan_memory(path, target="cpu", runtime_graph=False)  # the rule-based view
    report = memory_report(result)
    assert result.runtime_peak is None
    assert result.lower_bound == 352 and result.unfused_lower_bound == 416
    assert result.best.arena_bytes >= result.lower_bound
    assert result.naive_bytes == 128 + 128 + 64 + 64  # x, r, m (32 B, 64-aligned), idx
    titles = [t.title for t in report.tables]
    assert titles[0].startswith("Memory plans (cpu")
    layers = next(t for t in report.tables if t.title == "Live bytes per layer")
    assert [row[3] for row in layers.rows] == [256, 352, 288, 160]
    (figure,) = report.figures
    assert figure.kind == "timeline"
    assert {item["label"] for item in figure.data["items"]} == {"x", "r", "m", "idx"}
    assert figure.data["peak"] == result.best.arena_bytes
    assert report.to_dict()["results"]["memory"]["best_arena_bytes"] == result.best.arena_bytes


def test_plan_memory_keeps_a_better_order(tmp_path):
    path = tmp_path / "branches.onnx"
    onnx.save(two_branches(), str(path))
    searched = plan_memory(path, target="unfused")
    plain = plan_memory(path, target="unfused", order_search=False)
    assert plain.order is None and plain.lower_bound == 8448
    assert searched.lower_bound == 4608 and searched.lifetimes.order == searched.order.order


def test_bad_target_and_unresolved_shapes(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(conv_relu_add(input_dims=("N", 2, "H", "W")), str(path))
    with pytest.raises(InputError, match="unknown execution view 'gpu'"):
        plan_memory(path, target="gpu")
    with pytest.raises(InputError) as info:
        plan_memory(path)
    assert "--input-shape" in info.value.hint
    result = plan_memory(path, input_shape="1,2,4,4", runtime_graph=False)
    assert result.lower_bound == 352
    result = plan_memory(path, input_shape="1,2,4,4")  # ORT's graph, with the shape given
    assert result.runtime_peak is not None and result.runtime_peak > 0


def test_plan_memory_on_the_graph_ort_runs_states_ort_peak(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(conv_relu_add(), str(path))
    result = plan_memory(path, target="cpu")
    report = memory_report(result)
    ops = {step.op for step in result.lifetimes.steps}
    assert "Reshape" in ops and "MaxPool" in ops or "nchwc:MaxPool" in ops
    assert result.runtime_peak >= result.best.arena_bytes - 128  # ORT's own placement is never better (input aside)
    # compared on its own basis: the bound less the graph inputs, which ORT's peak leaves out too
    assert result.runtime_lower_bound < result.lower_bound and result.runtime_peak >= result.runtime_lower_bound
    row = next(r for r in report.to_dict()["tables"][0]["rows"] if r[0] == result.runtime_allocator)
    bound = result.runtime_lower_bound
    assert row[2].endswith(f"of the bound in ORT's order without the inputs (that bound: {bound:,} B)")
    data = report.to_dict()["results"]
    assert data["device_peak_bytes"] == result.runtime_peak
    assert data["memory"]["runtime_allocator"].startswith("ORT CPU's allocation planner")


def test_ort_peak_is_compared_with_the_bound_of_the_order_ort_runs(tmp_path):
    """The bound ORT's replayed peak was shown against was taken in the searched order, which lets the input die
    early at the cost of more other bytes: less the input it exceeded what ORT, running its own order, needs (a
    tiled MobileNetV2 replayed at 0.864x of it). A plan below a lower bound: the bound is now that of ORT's order."""
    from npukit.memory.lifetimes import lifetimes_of
    from npukit.memory.ort_cpu import ort_executed_graph, without_graph_inputs

    path = tmp_path / "sliced.onnx"
    onnx.save(sliced_branches(), str(path))
    result = plan_memory(path)
    executed = ort_executed_graph(path).graph
    assert result.order.improved and result.lifetimes.order != tuple(n.name for n in executed.nodes)
    assert result.runtime_lower_bound == without_graph_inputs(lifetimes_of(executed)).peak_bytes
    assert result.runtime_peak >= result.runtime_lower_bound
    row = next(r for r in memory_report(result).to_dict()["tables"][0]["rows"] if r[0] == result.runtime_allocator)
    assert not row[2].startswith("0.")  # never below its bound


def test_sizes_known_only_once_constants_are_folded_are_planned(tmp_path, monkeypatch):
    from npukit.memory import graph
    from tests.targets._models import shape_computed_flatten

    path = tmp_path / "paddle.onnx"
    onnx.save(shape_computed_flatten(opset=11), str(path))
    result = plan_memory(path, runtime_graph=False)
    assert result.lower_bound > 0
    monkeypatch.setattr(graph, "_constants_folded", lambda model: model)  # without folding: the size stays open
    with pytest.raises(InputError) as info:
        plan_memory(path, runtime_graph=False)
    assert "'y'" in str(info.value) and "--input-shape" not in info.value.hint  # the shape was already static


def test_a_size_only_a_foreign_op_knows_is_said_so(tmp_path):
    """ddddocr's DynamicQuantizeLSTM (com.microsoft): ONNX shape inference cannot size its output, and the message
    said the size depended on values."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mystery", ["r"], ["m"], domain="my.ops"),
             helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "k"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.ops", 1)])
    path = tmp_path / "foreign.onnx"
    onnx.save(model, str(path))
    with pytest.raises(InputError) as info:
        plan_memory(path, runtime_graph=False)
    assert "Mystery of domain 'my.ops'" in info.value.hint
