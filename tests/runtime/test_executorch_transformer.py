"""npukit's edge passes for transformers on ExecuTorch's XNNPACK delegate (``runtime.executorch_views``,
``executorch_layer_norm``, ``executorch_scalar``, ``executorch_softmax``): each computes what the edge program did
(bit-identical for the views, the scalar mul and the dropped safe-softmax guard; the layer norm to float rounding),
and the op it rewrites runs inside the one XNNPACK delegate call; a transformer encoder block goes from several
delegate calls to one."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("executorch", reason="the executorch extra is not installed (scripts/setup.sh installs it)")

from executorch.exir import EdgeCompileConfig, to_edge  # noqa: E402

from npukit.runtime import executorch as et  # noqa: E402
from npukit.runtime import executorch_layer_norm, executorch_softmax, executorch_views  # noqa: E402
from npukit.runtime.executorch_layer_norm import LayerNormPass  # noqa: E402
from npukit.runtime.executorch_passes import transform_passes  # noqa: E402
from npukit.runtime.executorch_scalar import ScalarMulPass  # noqa: E402
from npukit.runtime.executorch_softmax import SafeSoftmaxPass  # noqa: E402
from npukit.runtime.executorch_views import StaticViewsPass  # noqa: E402

TOKENS = (1, 10, 32)
LAYER_NORM_ATOL = 1e-5  # measured: 7.2e-7 on these blocks (outputs up to 3.6), 5.7e-6 on (1, 197, 768) (up to 13)


class _InProjection(torch.nn.Module):
    """torch.nn.MultiheadAttention's packed in-projection (unflatten, unsqueeze(0), transpose, squeeze(-2), [i]), a
    class token's x[:, 0] and a no-op expand, between two linears."""

    def __init__(self) -> None:
        super().__init__()
        self.proj, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.proj(x).unflatten(-1, (3, 32)).unsqueeze(0).transpose(0, -2).squeeze(-2)
        q, k, v = p[0], p[1], p[2]
        y = (q * k + v).expand(1, 10, 32)
        return self.out(y + y[:, 0].unsqueeze(1))


class _Norms(torch.nn.Module):
    """Layer norms over the last dim (affine, without affine, another eps), between linears."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.fc2 = torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)
        self.a, self.b = torch.nn.LayerNorm(32), torch.nn.LayerNorm(32, eps=1e-3, elementwise_affine=False)
        torch.nn.init.normal_(self.a.weight), torch.nn.init.normal_(self.a.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.b(self.fc(self.a(x * 3.0 + 1.0))))


class _Attention(torch.nn.Module):
    """scaled_dot_product_attention of 4 heads (its scaled q and k, rank-4 matmuls, safe softmax), with a mask or
    without."""

    def __init__(self, masked: bool = False) -> None:
        super().__init__()
        self.masked = masked
        self.qkv, self.out = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (4, 8)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        mask = torch.ones(10, 10, dtype=torch.bool).tril() if self.masked else None
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).flatten(2))


def _blocks() -> dict[str, torch.nn.Module]:
    from torchvision.models.vision_transformer import EncoderBlock

    torch.manual_seed(0)
    return {"torch_encoder_layer": torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
            "torchvision_vit_block": EncoderBlock(4, 32, 64, 0.0, 0.0)}


def _example() -> tuple[torch.Tensor]:
    return (torch.from_numpy(np.random.default_rng(0).normal(size=TOKENS).astype(np.float32)),)


def _targets(program) -> collections.Counter:
    return collections.Counter(getattr(n.target, "__name__", str(n.target)) for n in program.graph.nodes
                               if n.op == "call_function")


def _edge_before_after(module: torch.nn.Module, passes, example=None) -> tuple[torch.Tensor, torch.Tensor, object]:
    """``module``'s edge program's output before and after ``passes`` on ``example`` (default ``_example()``), and
    the program after (the edge dialect's op check off: the layer norm pass writes aten.linear, which
    to_edge_transform_and_lower keeps for XNNPACK and plain to_edge would decompose)."""
    example = example or _example()
    edge = to_edge(torch.export.export(module, example),
                   compile_config=EdgeCompileConfig(_check_ir_validity=False))
    before = edge.exported_program().module()(*example)
    after = edge.transform(passes).exported_program()
    return before, after.module()(*example), after


def _pte(lowered: et.Lowered, tmp_path: Path) -> np.ndarray:
    path = tmp_path / "net.pte"
    lowered.write(path)
    return et.Runner(path)({"x": _example()[0].numpy()})[0]


def test_the_in_projection_selects_squeezes_and_expands_are_views_of_the_same_values():
    torch.manual_seed(0)
    before, after, program = _edge_before_after(_InProjection(), [StaticViewsPass()])
    assert torch.equal(before, after)
    targets = _targets(program)
    assert not {"aten.squeeze_copy.dims", "aten.unsqueeze_copy.default", "aten.select_copy.int",
                "aten.expand_copy.default"} & set(targets), targets
    slices = sorted(n.args[1:] for n in program.graph.nodes if "slice_copy" in str(n.target))
    assert slices == [(0, 0, 1, 1), (0, 1, 2, 1), (0, 2, 3, 1), (1, 0, 1, 1)]  # p[0..2], y[:, 0]


def test_what_the_views_pass_cannot_rewrite_is_left_as_it_is():
    class Broadcast(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, :1].expand(1, 10, 32)

    _, _, program = _edge_before_after(Broadcast(), [StaticViewsPass()])
    (expand,) = [n for n in program.graph.nodes if "expand_copy" in str(n.target)]
    assert executorch_views.why_not(expand) == "a broadcasting expand ([1, 1, 32] -> [1, 10, 32])"


def test_a_layer_norm_is_linear_means_and_element_wise_ops_to_float_rounding():
    torch.manual_seed(0)
    before, after, program = _edge_before_after(_Norms(), [LayerNormPass()])
    assert (before - after).abs().max() <= LAYER_NORM_ATOL
    targets = _targets(program)
    assert "aten.native_layer_norm.default" not in targets and targets["aten.rsqrt.default"] == 2
    assert targets["aten.linear.default"] == 2 * 2  # mean, variance (to_edge writes the nn.Linears as addmm)
    eps = sorted(float(getattr(program.graph_module, n.args[1].target)) for n in program.graph.nodes
                 if "add.Tensor" in str(n.target) and "linear" in str(n.args[0].target))
    assert eps == pytest.approx([1e-5, 1e-3])  # each layer norm's own


def test_a_layer_norm_the_pass_does_not_handle_is_left_as_it_is():
    class Others(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.two = torch.nn.LayerNorm([10, 32])

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            out, mean, rstd = torch.ops.aten.native_layer_norm(x, [32], None, None, 1e-5)
            return self.two(x), out + mean * rstd

    _, _, program = _edge_before_after(Others(), [LayerNormPass()])
    norms = [n for n in program.graph.nodes if "native_layer_norm" in str(n.target)]
    assert {executorch_layer_norm.why_not(n) for n in norms} == {"normalized over [10, 32], not the last dim alone",
                                                                 "its mean or rstd is read"}


def test_a_mul_by_a_number_is_a_mul_by_a_constant_of_the_same_values():
    class Scaled(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.mul.Scalar(x, 0.5946035575013605) + torch.ops.aten.mul.Scalar(x, 3)

    before, after, program = _edge_before_after(Scaled(), [ScalarMulPass()])
    assert torch.equal(before, after)
    assert _targets(program)["aten.mul.Tensor"] == 2 and "aten.mul.Scalar" not in _targets(program)


@pytest.mark.parametrize("masked", [False, True])
def test_the_safe_softmax_guard_goes_on_unmasked_scores_only(masked):
    torch.manual_seed(0)
    before, after, program = _edge_before_after(_Attention(masked), [SafeSoftmaxPass()])
    assert torch.equal(before, after)
    guards = [n for n in program.graph.nodes if executorch_softmax.guarded_softmax(n) is not None]
    assert len(guards) == masked  # the mask's -inf added to the scores: kept


@pytest.mark.parametrize("net", [_InProjection, _Norms, _Attention])
def test_fp32_the_ops_run_in_the_one_delegate_call_and_the_pte_computes_the_module(net, tmp_path):
    torch.manual_seed(0)
    module = net().eval()
    lowered = et.lower(module, _example())
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    want = module(*_example()).detach().numpy()
    np.testing.assert_allclose(_pte(lowered, tmp_path), want, rtol=0, atol=LAYER_NORM_ATOL)


def _calls_with(module: torch.nn.Module, passes, example=None) -> tuple[int, dict[str, int]]:
    """Delegate calls and portable ops of ``module`` lowered as npukit does, with ``passes`` only."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    edge = to_edge_transform_and_lower(torch.export.export(module, example or _example()), transform_passes=passes,
                                       partitioner=[XnnpackPartitioner()]).exported_program()
    left = _targets(edge)
    return left.pop("executorch_call_delegate", 0), {k: v for k, v in left.items() if k != "getitem"}


@pytest.mark.parametrize("name", ["torch_encoder_layer", "torchvision_vit_block"])
def test_a_transformer_block_is_one_delegate_call(name, tmp_path):
    """Before these passes (PReLU, mean and split only) the block made 7 delegate calls, its layer norms, in-projection,
    scaled q and k, expands and safe-softmax guard on the portable kernels; after, one, and the .pte computes it."""
    module = _blocks()[name].eval()
    calls, left = _calls_with(module, transform_passes()[:3])
    assert calls == 7 and {"aten.native_layer_norm.default", "aten.select_copy.int", "aten.expand_copy.default",
                           "aten.mul.Scalar", "aten.where.self"} <= set(left), left
    lowered = et.lower(module, _example())
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    want = module(*_example()).detach().numpy()
    np.testing.assert_allclose(_pte(lowered, tmp_path), want, rtol=0, atol=LAYER_NORM_ATOL)


@pytest.mark.parametrize("name", ["torch_encoder_layer", "torchvision_vit_block"])
def test_the_target_profile_predicts_the_block_whole(name):
    """executorch-xnnpack's rules (LayerNormalization, Squeeze, Unsqueeze, Gather of one index, rank-4 MatMul of
    activations) say taken, node for node as the real partitioner does."""
    from tests.targets.test_mobile_xnnpack_profiles import _compare_with_the_real_partitioner

    compared = _compare_with_the_real_partitioner("executorch-xnnpack", et.node_placement, _blocks()[name],
                                                  _example())
    assert compared and all(predicted and actual for predicted, actual in compared.values()), compared


class _TinyVit(torch.nn.Module):
    """A 16x16 image as 16 patches and a class token through one torchvision ViT block, then its head: what
    npukit's int8 plan carries (the tests' 16x16 image nets)."""

    def __init__(self) -> None:
        from torchvision.models.vision_transformer import EncoderBlock

        super().__init__()
        self.patch, self.block = torch.nn.Conv2d(3, 32, 4, stride=4), EncoderBlock(4, 32, 64, 0.0, 0.0)
        self.cls, self.head = torch.nn.Parameter(torch.randn(1, 1, 32)), torch.nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.cat([self.cls.expand(1, -1, -1), self.patch(x).flatten(2).transpose(1, 2)], 1)
        return self.head(self.block(t)[:, 0])


class _Views16(torch.nn.Module):
    """A conv's output through an unsqueeze, a transpose, a squeeze, a select and a no-op expand, then a conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        a = y.unsqueeze(0).transpose(0, 2).squeeze(2)[0].unsqueeze(0)
        return self.conv2(y.expand(1, 8, 16, 16) * a)


@pytest.mark.parametrize("net, calls", [(_TinyVit, 9), (_Views16, 3)])
def test_int8_one_delegate_call_integer_ops_kept_and_the_pte_computes_the_quantized_program(net, calls, tmp_path,
                                                                                           xnn_graphs):
    """npukit's plan carried: before these passes ``calls`` delegate calls; after, one, nothing on the portable
    kernels; what was int8 stays int8 (the block's linears, the patch conv), the layer norms (float in the plan) are
    fp32 ops between converts, and the .pte computes what the quantized torch program does, to one output step."""
    from tests.quant.test_emit_pt2e import _carried_16x16

    torch.manual_seed(0)
    _, carried, _, example = _carried_16x16(tmp_path, net, et.CARRY)
    if net is _Views16:
        before, after, _ = _edge_before_after(carried.program, transform_passes(), example)
        assert torch.equal(before, after)
    assert _calls_with(carried.program, transform_passes()[:3], example)[0] == calls
    lowered = et.lower(carried.program, example)
    assert lowered.portable_ops == {} and lowered.delegate_calls == 1
    kinds = collections.Counter(xnn_graphs[-1])
    if net is _TinyVit:
        assert kinds[("FullyConnected", "qint8")] == 5 and kinds[("Conv2d", "qint8")] == 1, kinds
        assert kinds[("FullyConnected", "fp32")] == 2 * 2  # the two layer norms' means and variances
    step = float([n for n in carried.program.graph.nodes if "quantize_per_tensor" in str(n.target)][-1].args[1])
    path = tmp_path / "net.pte"
    lowered.write(path)
    got = et.Runner(path)({"x": example[0].numpy()})[0]
    assert np.abs(got - carried.program(*example).detach().numpy()).max() <= step * 1.001
