"""GPTQ: 4-bit codes chosen column by column, each column's rounding error compensated on
the columns not yet quantized, weighted by the inverse Hessian of the layer's inputs.

Group scales are static (RTN parameters of the original weight, per group), so the result
lies exactly on the RTN grid and is stored in the same layout. Optional act-order
quantizes columns by decreasing Hessian diagonal. Reference: Frantar et al., 2022.
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization import primitives as prim

DAMP = 0.01
BLOCK = 128


def gptq_int4(w: np.ndarray, hessian: np.ndarray, group: int, zero_point: bool,
              act_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """w: (N, K) fp32, hessian: (K, K) = sum x^T x. Returns codes (N, K) uint8, scale,
    offset (N, K // group)."""
    import torch

    scale, offset = prim.int4_group_params(w, group, zero_point)
    W = torch.from_numpy(np.array(w, dtype=np.float32))
    H = torch.from_numpy(np.array(hessian, dtype=np.float64))
    k = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += DAMP * torch.diag(H).mean() * torch.eye(k, dtype=H.dtype)
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(k)
    W, H = W[:, perm], H[perm][:, perm]
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True).float()
    sc = torch.from_numpy(scale)[:, perm // group]  # per (original) column: (N, K)
    off = torch.from_numpy(offset)[:, perm // group]
    Q = torch.zeros_like(W)
    for i1 in range(0, k, BLOCK):
        i2 = min(i1 + BLOCK, k)
        W1, E1, h1 = W[:, i1:i2].clone(), torch.zeros(W.shape[0], i2 - i1), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = W1[:, i]
            s, o = sc[:, i1 + i], off[:, i1 + i]
            q = torch.clamp(torch.round((col - o) / s), 0, prim.INT4_LEVELS - 1) * s + o
            Q[:, i1 + i] = q
            err = (col - q) / h1[i, i]
            W1[:, i:] -= err[:, None] * h1[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ hinv[i1:i2, i2:]
    Q = Q[:, torch.argsort(perm)].numpy()
    return prim.quantize_int4(Q, scale, offset, group), scale, offset
