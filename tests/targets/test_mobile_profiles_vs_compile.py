"""The litert-xnnpack and executorch-xnnpack profiles against what compile's runtimes really delegate, node for node,
on small torch modules made of the forms a new user's pass found mispredicted: a clamp to [0, 1] (RELU_0_TO_1), a
nearest upsample, powers, a hard sigmoid written both ways, and attention written out with rank-4 matmuls."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.targets.test_mobile_xnnpack_profiles import _compare_with_the_real_partitioner


class _LiteRTForms(torch.nn.Module):
    """Each op's delegation by LiteRT's XNNPACK delegate after litert-torch's conversion (ai-edge-litert 2.3)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 8, 2, stride=2)  # its own bias only: taken
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        y = y * torch.clamp(y * 0.2 + 0.5, 0.0, 1.0)                # RELU_0_TO_1: left
        y = y * (F.relu6(1.2 * y + 3.0) / 6.0)                      # the same slope through RELU6: taken
        y = y * F.hardsigmoid(y)                                    # torch's hardsigmoid: taken
        y = y + torch.clamp(y, -1.0, 1.0) + torch.clamp(y, 0.0, 2.0)  # RELU_N1_TO_1, MINIMUM/MAXIMUM: taken
        y = y.pow(2) + y.abs().pow(0.5) + y.pow(3)                  # MUL and SQRT taken, POW left
        y = F.interpolate(y, scale_factor=2.0, mode="nearest")      # RESIZE_NEAREST_NEIGHBOR: left
        y = F.interpolate(y, scale_factor=0.5, mode="bilinear")     # RESIZE_BILINEAR: taken
        return self.head(torch.relu(self.up(y)))


class _Attention(torch.nn.Module):
    """Multi-head self-attention written out (SVTR, ViT ports): rank-4 q @ k^T and a @ v."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]                            # select_copy: a slice and a view (npukit's pass)
        a = ((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5).softmax(-1)  # bmm; its no-op expand_copy gone
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, d))


def _placement(runtime: str, extra: str):
    pytest.importorskip(extra, reason=f"the {runtime} extra is not installed (scripts/setup.sh installs it)")
    return importlib.import_module(f"npukit.runtime.{runtime}").node_placement


def test_litert_profile_matches_the_delegate_on_clamps_powers_and_upsamples():
    compared = _compare_with_the_real_partitioner("litert-xnnpack", _placement("litert", "litert_torch"),
                                                  _LiteRTForms(), (torch.randn(1, 3, 16, 16),))
    wrong = {o: pa for o, pa in compared.items() if pa[0] != pa[1]}
    assert not wrong, f"(predicted, actual) delegated differ: {wrong}"
    # each form was compared (not removed on either side), and landed where its comment says
    left = {o for o, (_, actual) in compared.items() if not actual}
    assert left == {"clamp", "pow_3", "upsample_nearest2d"}, compared
    assert {"relu6", "hardsigmoid", "clamp_1", "clamp_2", "pow_1", "pow_2", "upsample_bilinear2d",
            "conv_transpose2d"} <= set(compared), compared


def test_executorch_profile_places_a_rank4_matmul_whole():
    """The rank-4 matmuls' operands have no broadcasting batch dims: their expand_copy (to the same shape) goes
    (npukit's edge pass, runtime.executorch_views), the bmm and its views run in XNNPACK: delegated whole, as the
    profile predicts; the three selects of q, k, v (a one-wide slice and a view each) are taken too. (Before the
    pass the expand_copy of each operand ran on the portable kernels: split.)"""
    from npukit.runtime.executorch import require

    node_placement = _placement("executorch", "executorch")
    require()
    torch.manual_seed(0)
    module, example = _Attention().eval(), (torch.randn(1, 16, 32),)
    placement = node_placement(module, example)
    matmuls = [p for p in placement.values() if p.target == "aten.matmul.default"]
    assert len(matmuls) == 2 and all(p.where == "delegated" for p in matmuls), matmuls
    compared = _compare_with_the_real_partitioner("executorch-xnnpack", node_placement, module, example)
    wrong = {o: pa for o, pa in compared.items() if pa[0] != pa[1]}
    assert not wrong, f"(predicted, actual) delegated differ: {wrong}"
    assert {"select", "select_1", "select_2", "matmul", "matmul_1"} <= set(compared), compared
    assert all(actual for _, actual in compared.values()), compared
