"""GPTQ (Frantar et al. 2022) on a fixed grid, and the layer-input rows its Hessian is measured on: shared by the HTP
recipe (``npukit.runtime.htp_quant``: int8 / int4 weights of an ORT QDQ model) and QAT's bit lowering
(``npukit.quant.qat.lower``: weights of the training twin lowered to 4 or 6 bits).

A layer's weight (G groups, R rows, K inputs per row) is rounded one input column at a time; each column's rounding
error is spread over the columns not yet rounded through the Cholesky factor of the inverse Hessian H = X^T X / n
of the layer's input rows X, which minimises the layer's output error on those inputs (not the weight error). The
scales do not change, only the integers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DAMP = 0.01  # added to the Hessian's diagonal, as a fraction of its mean
POSITIONS = 4096  # input rows (output positions) kept per calibration sample and layer for the Hessian
ROW_BUDGET = 4_000_000  # input values kept per sample and layer (grouped convs keep fewer positions)
MIN_ROWS_PER_WEIGHT = 2  # fewer input rows than this per weight of an output channel: nearest rounding kept


def row_limit(groups: int, k: int, positions: int = POSITIONS) -> int:
    """How many input rows (positions) of one sample a layer of ``groups`` groups and ``k`` inputs per row keeps."""
    return max(64, min(positions, ROW_BUDGET // (groups * k)))


def input_rows(x: np.ndarray, *, kernel: Sequence[int], pads: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int], groups: int, rng: np.random.Generator, limit: int) -> np.ndarray:
    """A 2-D convolution's input ``x`` (N, C, H, W) as (groups, positions, K) float32 rows: the im2col columns, at most
    ``limit`` positions drawn at random, K in the weight's flattened (C/groups, kh, kw) order. ``pads`` in ONNX order
    (top, left, bottom, right)."""
    import torch
    import torch.nn.functional as F

    t = F.pad(torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32)), (pads[1], pads[3], pads[0], pads[2]))
    cols = F.unfold(t, list(kernel), dilation=list(dilations), stride=list(strides))  # (N, C*kh*kw, L)
    cols = cols.permute(0, 2, 1).reshape(-1, cols.shape[1])  # (N*L, C*kh*kw)
    if cols.shape[0] > limit:
        cols = cols[torch.from_numpy(np.sort(rng.choice(cols.shape[0], limit, replace=False)))]
    k = cols.shape[1] // groups
    return cols.reshape(cols.shape[0], groups, k).permute(1, 0, 2).numpy()


def gptq_integers(weight: np.ndarray, hessian: np.ndarray, scale: np.ndarray, qmin: int, qmax: int,
                  damp: float = DAMP) -> np.ndarray:
    """Integers (G, R, K) for weights (G, R, K) on the symmetric grid of ``scale`` (G, R) within [qmin, qmax], given
    per-group Hessians (G, K, K) of the layer's input (see the module docstring); with one group, columns go in order
    of decreasing Hessian diagonal (the inputs with the most energy first)."""
    import torch

    groups, _rows, k = weight.shape
    w = torch.from_numpy(np.array(weight, np.float64))
    h = torch.from_numpy(np.array(hessian, np.float64))
    diag = torch.diagonal(h, dim1=1, dim2=2)
    diag[diag <= 0] = 1.0  # an input never seen: its column rounds to nearest and passes no error on
    diag += damp * diag.mean(dim=1, keepdim=True)
    order = None
    if groups == 1:
        order = torch.argsort(torch.diagonal(h[0]), descending=True)
        w, h = w[:, :, order], h[:, order][:, :, order]
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)  # (G, K, K)
    s = torch.from_numpy(np.array(scale, np.float64))
    q = torch.zeros_like(w)
    for i in range(k):
        col = w[:, :, i]
        qi = torch.clamp(torch.round(col / s), qmin, qmax)
        q[:, :, i] = qi
        err = (col - qi * s) / u[:, i, i].unsqueeze(1)
        if i + 1 < k:
            w[:, :, i + 1:] -= err.unsqueeze(2) * u[:, i, i + 1:].unsqueeze(1)
    if order is not None:
        q = q[:, :, torch.argsort(order)]
    return q.numpy()


def reround(weight: np.ndarray, hessian_sum: np.ndarray, rows: int, scale: np.ndarray, qmin: int, qmax: int
            ) -> tuple[np.ndarray, float] | None:
    """GPTQ's integers for ``weight`` (G, R, K) on ``scale`` (G, R) and the output error they remove against nearest
    rounding (dB), given the sum of x^T x over ``rows`` input rows; None where the rows are too few
    (``MIN_ROWS_PER_WEIGHT``) or GPTQ does not reconstruct the layer's output better than nearest rounding."""
    if rows <= 0 or rows < MIN_ROWS_PER_WEIGHT * weight.shape[2]:
        return None
    h = hessian_sum / rows
    ints = gptq_integers(weight, h, scale, qmin, qmax)
    nearest = np.clip(np.rint(weight / scale[:, :, None]), qmin, qmax)
    before, after = output_error(nearest, weight, scale, h), output_error(ints, weight, scale, h)
    if not after < before:
        return None
    return ints, 10.0 * float(np.log10(before / max(after, 1e-300)))


def output_error(integers: np.ndarray, weight: np.ndarray, scale: np.ndarray, hessian: np.ndarray) -> float:
    """The layer's squared output error sum_g e_g H_g e_g^T for integers on ``scale`` against ``weight``."""
    e = integers * scale[:, :, None] - weight
    return float(np.einsum("grk,gkj,grj->", e, hessian, e))
