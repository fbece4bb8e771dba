"""npukit's edge passes for ExecuTorch's XNNPACK delegate (``runtime.executorch_mean``, ``runtime.executorch_split``):
each rewrite computes exactly what the edge program did, and the op it rewrites runs inside the one XNNPACK delegate
call, fp32 and int8 (as XNNPACK's integer op, not a float op between converts)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

from executorch.exir import to_edge  # noqa: E402

from npukit.runtime import executorch as et  # noqa: E402
from npukit.runtime.executorch_mean import KeepMeanDimsPass, why_not  # noqa: E402
from npukit.runtime.executorch_passes import transform_passes  # noqa: E402
from npukit.runtime.executorch_split import SliceSplitPass  # noqa: E402
from tests.quant.test_emit_pt2e import _carried_16x16  # noqa: E402

INPUT = (1, 3, 16, 16)


class _MeanHead(torch.nn.Module):
    """conv -> relu -> mean over H and W without keepdim -> linear: a classifier's head (MnasNet's, ShuffleNetV2's)."""

    def __init__(self, dims: tuple[int, int] = (2, 3)) -> None:
        super().__init__()
        self.dims = list(dims)
        self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean(self.dims))


class _SplitBlock(torch.nn.Module):
    """ShuffleNetV2's channel split (``chunk``), then a ``torch.split`` into unequal pieces, one of them unread."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.branch = torch.nn.Conv2d(4, 4, 1)
        self.head = torch.nn.Conv2d(6, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left, right = torch.relu(self.conv(x)).chunk(2, dim=1)
        y = torch.cat([left, torch.relu(self.branch(right))], 1)
        a, b, _ = torch.split(y, [2, 4, 2], dim=-3)
        return self.head(torch.cat([b, a], 1))


def _example() -> tuple[torch.Tensor]:
    return (torch.from_numpy(np.random.default_rng(0).normal(size=INPUT).astype(np.float32)),)


def _targets(program: torch.fx.GraphModule) -> collections.Counter:
    return collections.Counter(getattr(n.target, "__name__", str(n.target)) for n in program.graph.nodes
                               if n.op == "call_function")


def _edge_before_after(module: torch.nn.Module, example, passes) -> tuple[torch.Tensor, torch.Tensor, object]:
    """``module``'s edge program's output before and after ``passes``, on ``example``, and the program after."""
    edge = to_edge(torch.export.export(module, example))
    before = edge.exported_program().module()(*example)
    after = edge.transform(passes).exported_program()
    return before, after.module()(*example), after


@pytest.mark.parametrize("dims", [(2, 3), (-2, -1), (3, 2)])
def test_a_mean_without_keepdim_is_a_keepdim_mean_and_a_view_of_the_same_values(dims):
    torch.manual_seed(0)
    module, example = _MeanHead(dims).eval(), _example()
    before, after, program = _edge_before_after(module, example, [KeepMeanDimsPass()])
    assert torch.equal(before, after)
    (mean,) = [n for n in program.graph.nodes if "mean" in str(n.target)]
    assert mean.args[2] is True and list(mean.meta["val"].shape) == [1, 8, 1, 1]
    assert [u.target.__name__ for u in mean.users] == ["aten.view_copy.default"]
    assert why_not(mean) == "keepdim already (XNNPACK takes it as it is)"


def test_a_mean_xnnpack_takes_without_the_pass_or_cannot_take_is_left_as_it_is():
    class Others(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.mean([2, 3], keepdim=True), x.mean([1]), x.flatten(2).mean([2])

    _, _, program = _edge_before_after(Others(), _example(), [KeepMeanDimsPass()])
    means = [n for n in program.graph.nodes if "mean" in str(n.target)]
    assert [why_not(n) for n in means] == ["keepdim already (XNNPACK takes it as it is)",
                                           "over dims [1], not the last two (H and W)",
                                           "a mean of a rank-3 tensor, not 4-D"]
    assert _targets(program)["aten.view_copy.default"] == 1  # flatten's: none added


def test_a_split_is_one_slice_per_piece_read_of_the_same_values():
    torch.manual_seed(0)
    module, example = _SplitBlock().eval(), _example()
    before, after, program = _edge_before_after(module, example, [SliceSplitPass()])
    assert torch.equal(before, after)
    targets = _targets(program)
    assert "aten.split_with_sizes_copy.default" not in targets and "getitem" not in targets
    slices = [n.args[1:] for n in program.graph.nodes if "slice_copy" in str(n.target)]
    assert sorted(slices) == [(1, 0, 2, 1), (1, 0, 4, 1), (1, 2, 6, 1), (1, 4, 8, 1)]  # the unread piece: none


def _run(lowered: et.Lowered, example, tmp_path: Path) -> np.ndarray:
    path = tmp_path / "net.pte"
    lowered.write(path)
    return et.Runner(path)({"x": example[0].numpy()})[0]


@pytest.mark.parametrize("net, op", [(_MeanHead, "GlobalAvgPooling2d"), (_SplitBlock, "StaticSlice")])
def test_fp32_the_op_runs_in_the_one_delegate_call_and_the_pte_computes_the_module(net, op, tmp_path, xnn_graphs):
    torch.manual_seed(0)
    module, example = net().eval(), _example()
    lowered = et.lower(module, example)
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    assert (op, "fp32") in xnn_graphs[-1]
    want = module(*example).detach().numpy()
    np.testing.assert_allclose(_run(lowered, example, tmp_path), want, rtol=0, atol=1e-6 * np.abs(want).max())


@pytest.mark.parametrize("net, ops", [(_MeanHead, ("GlobalAvgPooling2d", "StaticReshape")),
                                      (_SplitBlock, ("StaticSlice",))])
def test_int8_the_op_runs_in_the_one_delegate_call_as_an_integer_op(net, ops, tmp_path, xnn_graphs):
    """npukit's plan carried (dq -> mean -> q, dq -> split -> q per piece, the piece a concatenation reads on that
    concatenation's grid): after the passes XNNPACK takes the mean, its view and the slices as int8 ops (a float op
    between converts would be 'fp32'), in one delegate call, and the .pte computes what the quantized torch program
    does, to one step of its output's grid."""
    _, carried, _, example = _carried_16x16(tmp_path, net, et.CARRY)
    before, after, program = _edge_before_after(carried.program, example, transform_passes())
    assert torch.equal(before, after)  # the q-dq pairs the passes add change no value
    requantized = [n for n in program.graph.nodes if "quantize_per_tensor" in str(n.target)
                   and "dequantize" not in str(n.target) and "dequantize" in str(n.args[0].target)]
    assert len(requantized) == (net is _SplitBlock)  # the chunk's piece the cat reads, on the cat's grid
    lowered = et.lower(carried.program, example)
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    (graph,) = xnn_graphs
    assert {kind: dtype for kind, dtype in graph if kind in ops} == {kind: "qint8" for kind in ops}, graph
    step = float([n for n in carried.program.graph.nodes if "quantize_per_tensor" in str(n.target)][-1].args[1])
    want = carried.program(*example).detach().numpy()
    assert np.abs(_run(lowered, example, tmp_path) - want).max() <= step * 1.001


@pytest.mark.parametrize("net, nodes", [(_MeanHead, {"mean"}), (_SplitBlock, {"chunk", "split_with_sizes"})])
def test_the_target_profile_predicts_what_the_partitioner_now_takes(net, nodes):
    """executorch-xnnpack's rules (ReduceMean without keepdims, Split) say taken, as the real partitioner does. The
    ONNX exporter records no torch node for a Split, so the chunk and the split are compared as ONNX op types."""
    from npukit.targets import analyze, get_target
    from tests.targets.test_mobile_xnnpack_profiles import _compare_with_the_real_partitioner

    torch.manual_seed(0)
    module, example = net().eval(), _example()
    compared = _compare_with_the_real_partitioner("executorch-xnnpack", et.node_placement, module, example)
    assert compared and all(predicted and actual for predicted, actual in compared.values()), compared
    placed = et.node_placement(module, example)
    assert {name: placed[name].where for name in nodes} == dict.fromkeys(nodes, "delegated")
    proto = torch.onnx.export(torch.export.export(module, example), dynamo=True, optimize=True, opset_version=18,
                              verbose=False).model_proto
    verdicts = [v for v in analyze(proto, get_target("executorch-xnnpack")).nodes
                if v.op_type in ("ReduceMean", "Split")]
    assert len(verdicts) == len(nodes) and all(v.supported for v in verdicts), verdicts


def test_the_passes_run_in_a_stated_order():
    assert [type(p).__name__ for p in transform_passes()] == ["PreluOn4dPass", "KeepMeanDimsPass", "SliceSplitPass",
                                                              "StaticViewsPass", "LayerNormPass", "ScalarMulPass",
                                                              "SafeSoftmaxPass"]
