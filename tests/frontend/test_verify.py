from __future__ import annotations

import numpy as np
import torch

from npukit.frontend.verify import float64_twin, verify_against_torch


class CastsToFloat32(torch.nn.Module):
    """A forward that pins float32 itself: its float64 copy fails, so the check falls back to float32."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.to(torch.float32))


def _onnx_bytes(module: torch.nn.Module) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.randn(2, 8),), buffer, dynamo=False, opset_version=17)
    return buffer.getvalue()


def test_the_reference_runs_in_float64_and_leaves_the_module_as_it_was() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    twin = float64_twin(module, np.zeros((2, 8), np.float32))
    assert twin is not None and next(twin.parameters()).dtype == torch.float64
    assert next(module.parameters()).dtype == torch.float32  # a copy: the user's module is untouched
    errors = verify_against_torch(module, _onnx_bytes(module), shape=(2, 8), samples=2, seed=0)
    assert errors.max_rel < 1e-5


def test_a_module_that_cannot_run_in_float64_is_checked_in_float32() -> None:
    torch.manual_seed(0)
    module = CastsToFloat32().eval()
    assert float64_twin(module, np.zeros((2, 8), np.float32)) is None
    errors = verify_against_torch(module, _onnx_bytes(module), shape=(2, 8), samples=2, seed=0)
    assert errors.max_rel < 1e-5


def test_modules_over_the_size_limit_are_checked_in_float32(monkeypatch) -> None:
    import npukit.frontend.verify as verify

    module = torch.nn.Linear(8, 4)
    monkeypatch.setattr(verify, "FLOAT64_MAX_WEIGHT_BYTES", 16)
    assert verify.float64_twin(module, np.zeros((2, 8), np.float32)) is None
