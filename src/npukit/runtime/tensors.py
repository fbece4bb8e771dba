"""Arrays handed to the mobile runtimes' Python bindings."""

from __future__ import annotations

import numpy as np
import torch


def plain_tensor(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A float32 C-ordered copy with plain strides: a size-1 axis from numpy's x[None] has stride 0, and a Fortran-
    ordered array other strides, which ExecuTorch refuses (and a tensor sharing a caller's array would see in-place
    ops)."""
    array = x.detach().numpy() if isinstance(x, torch.Tensor) else x
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True, order="C"))
