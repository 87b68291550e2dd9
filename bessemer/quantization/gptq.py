"""GPTQ: codes chosen column by column, each column's rounding error compensated on the
columns not yet quantized, weighted by the inverse Hessian of the layer's inputs.

The grid is fixed before the search (RTN parameters of the original weight: int4 group
scales/offsets, or E4M3 per-channel scales), so the result lies exactly on the grid that
round to nearest would use and is stored in the same layout. Optional act-order quantizes
columns by decreasing Hessian diagonal. Reference: Frantar et al., 2022.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bessemer.quantization import fp8
from bessemer.quantization import primitives as prim
from bessemer.quantization.native_threads import native_threads

DAMP = 0.01
BLOCK = 128


@dataclass(frozen=True)
class ColumnGrid:
    """The fixed grid each column is rounded to, for output row n of original column j:
      int4: clip(rint((w - offset) / divisor), 0, 15) * scale + offset, the (K // group, N)
            arrays read at row j // group (divisor: the scale, or 1 where a scale is 0);
      e4m3: e4m3(clip(w / scale, -448, 448)) * scale, scale (N,) per output row, rounded to
            nearest even (fp8.round_to_e4m3)."""
    kind: str  # "int4" | "e4m3"
    scale: np.ndarray  # float32
    offset: np.ndarray | None = None
    divisor: np.ndarray | None = None
    group: int = 0

    def round(self, col: np.ndarray, j: int) -> np.ndarray:
        """The grid value nearest each entry of column j (N,) float32: the NumPy statement."""
        if self.kind == "int4":  # np.rint: halves to even
            g = j // self.group
            return (np.clip(np.rint((col - self.offset[g]) / self.divisor[g]), 0, prim.INT4_LEVELS - 1)
                    * self.scale[g] + self.offset[g])
        return fp8.round_to_e4m3(np.clip(col / self.scale, -fp8.E4M3_MAX, fp8.E4M3_MAX)) * self.scale


def gptq_columns_reference(wt: np.ndarray, hinv: np.ndarray, i1: int, i2: int, order: np.ndarray, qt: np.ndarray,
                           grid: ColumnGrid) -> np.ndarray:
    """GPTQ's column loop over the block of columns i1..i2 (NumPy): each column of the
    transposed weight wt (K, N), updated in place, rounded to the grid into qt (K, N), its
    error spread over the block's later columns through the inverse-Hessian factor hinv
    (K, K) fp32; order (K,): each column's original index. Returns the scaled errors (N, B),
    the block update's left operand. gptq_block_columns (native) computes the same bits."""
    W1, h1 = wt[i1:i2], hinv[i1:i2, i1:i2]  # (B, N) view, updated in place; (B, B)
    E1 = np.empty((wt.shape[1], i2 - i1), np.float32)  # (N, B): the GEMM's layout
    for i in range(i2 - i1):
        col = W1[i]
        q = grid.round(col, int(order[i1 + i]))
        qt[i1 + i] = q
        err = (col - q) / h1[i, i]
        W1[i + 1:] -= h1[i, i + 1:, None] * err[None, :]
        E1[:, i] = err
    return E1


def gptq_block_columns(wt, hinv, i1, i2, order, qt, grid: ColumnGrid) -> np.ndarray:
    """gptq_columns_reference in native code (bessemer._C,
    targets/cpu/csrc/kernels/gptq_columns.cpp), bit-identical, on native_threads() threads."""
    from bessemer import _C

    return _C.gptq_block_columns(wt, hinv, i1, i2, order, qt, grid.kind, grid.scale, grid.offset, grid.divisor,
                                 grid.group, native_threads())


def gptq(w: np.ndarray, hessian: np.ndarray, grid: ColumnGrid, act_order: bool = False,
         columns: Callable = gptq_block_columns) -> np.ndarray:
    """w: (N, K) fp32, hessian: (K, K) = sum x^T x; grid: the values each column may take.
    Returns the chosen (N, K) fp32 weight, every entry on the grid. columns: the column loop
    (gptq_block_columns, or its reference)."""
    import torch

    W = torch.from_numpy(np.array(w, dtype=np.float32))
    H = torch.from_numpy(np.array(hessian, dtype=np.float64))
    k = W.shape[1]
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += DAMP * torch.diag(H).mean() * torch.eye(k, dtype=H.dtype)
    perm = torch.argsort(torch.diag(H), descending=True) if act_order else torch.arange(k)
    W, H = W[:, perm], H[perm][:, perm]
    hinv = inverse_cholesky_upper(H).float()
    # Columns are rows of the transposed weight, contiguous; the block update's GEMM stays in
    # torch, so the codes are those of the torch statement, bit for bit.
    Wt = W.T.contiguous().numpy()  # (K, N)
    hinv_np = hinv.numpy()  # (K, K)
    order = perm.numpy()
    Qt = np.empty_like(Wt)  # (K, N)
    for i1 in range(0, k, BLOCK):
        i2 = min(i1 + BLOCK, k)
        E1 = columns(Wt, hinv_np, i1, i2, order, Qt, grid)  # (N, B)
        Wt[i2:] -= (torch.from_numpy(E1) @ hinv[i1:i2, i2:]).numpy().T
    return np.ascontiguousarray(Qt[np.argsort(order)].T)


def inverse_cholesky_upper(h):
    """U, upper triangular with a positive diagonal, such that U^T U = h^-1: the factor GPTQ's
    column updates read, for a symmetric positive definite (K, K) float64 torch tensor h.
    With J the reversal of the order and J h J = M M^T (M lower), h^-1 = (J M^-1 J)^T (J M^-1 J)
    and J M^-1 J is upper triangular with a positive diagonal, so it is that Cholesky factor:
    one factorisation and one triangular inverse, where chol(inv(h)) takes two and an inverse
    (measured on 2 cores: K = 1536 0.25 s against 1.8-6.5 s, K = 4096 3 s against 4.7-8.9 s)."""
    import torch

    return lower_triangular_inverse(torch.linalg.cholesky(h.flip(0, 1))).flip(0, 1)


TRIANGULAR_LEAF = 128


def lower_triangular_inverse(m):
    """m^-1 of a lower-triangular (K, K) torch tensor with a nonzero diagonal, by halves:
    [[A, 0], [B, C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]], so that most of its K^3 / 3
    multiply-adds are matrix products; a triangular solve against the identity costs K^3
    (one thread: K = 1536 0.15 s against 0.31 s, K = 576 0.013 s against 0.024 s)."""
    import torch

    k = m.shape[0]
    if k <= TRIANGULAR_LEAF:
        return torch.linalg.solve_triangular(m, torch.eye(k, dtype=m.dtype), upper=False)
    h = k // 2
    a_inv, c_inv = lower_triangular_inverse(m[:h, :h]), lower_triangular_inverse(m[h:, h:])
    out = torch.zeros_like(m)
    out[:h, :h], out[h:, h:] = a_inv, c_inv
    out[h:, :h] = -(c_inv @ (m[h:, :h] @ a_inv))
    return out


def gptq_int4(w: np.ndarray, hessian: np.ndarray, group: int, zero_point: bool,
              act_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns codes (N, K) uint8, scale, offset (N, K // group) of the builder's grid
    (scale_search.int4_grid; a symmetric grid's scales searched with the Hessian diagonal,
    the energy of each input channel, as the importance of its weights)."""
    from bessemer.quantization.scale_search import int4_grid

    scale, offset = int4_grid(w, group, zero_point, importance=np.diag(hessian).astype(np.float32))
    sc, off = np.ascontiguousarray(scale.T), np.ascontiguousarray(offset.T)  # (K // group, N)
    Q = gptq(w, hessian, ColumnGrid("int4", sc, off, sc, group), act_order)
    return prim.quantize_int4(Q, scale, offset, group), scale, offset


def gptq_superblock(w: np.ndarray, hessian: np.ndarray, grid: dict[str, np.ndarray],
                    act_order: bool = False) -> np.ndarray:
    """Codes (N, K) uint8 on a two-level grid (superblock.superblock_grid, searched with the
    Hessian diagonal as importance), chosen by GPTQ: the fp32 scale and offset of each
    sub-block are fixed by the grid, so this is gptq_int4 on those (N, K // 32) values."""
    from bessemer.quantization import superblock as sb

    scale, offset = sb.expand(grid["super_scales"], grid["scales"], grid["super_offsets"], grid["offsets"])
    sc, off = np.ascontiguousarray(scale.T), np.ascontiguousarray(offset.T)  # (K // 32, N)
    safe = np.where(sc > 0, sc, np.float32(1.0))
    Q = gptq(w, hessian, ColumnGrid("int4", sc, off, safe, sb.SUB), act_order)
    return sb.quantize_codes(Q, grid)


def gptq_fp8(w: np.ndarray, hessian: np.ndarray, act_order: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """E4M3 codes (N, K) uint8 and the per-channel scales (N,) of round to nearest
    (amax / 448 of each original row), the codes chosen by GPTQ."""
    scale = fp8.channel_scales(w)  # (N,)
    Q = gptq(w, hessian, ColumnGrid("e4m3", scale), act_order)
    return fp8.encode_e4m3(Q / scale[:, None]), scale
