"""Pure quantization primitives: choose scales, quantize, dequantize, measure the error.

These functions are the reference the quantized kernels are tested against; they know
nothing of kernels or storage layouts (format/layouts.py defines those). Shapes: a weight is
w: (N, K) = (out_features, in_features); groups run along K.
"""

from __future__ import annotations

import numpy as np

from bessemer.format.dtypes import bfloat16_bits_to_float32, to_bfloat16_bits

INT8_MAX = 127
INT4_LEVELS = 16  # unsigned codes 0..15
CHUNK_ELEMENTS = 1 << 20  # block size of the weight-sized passes: a few MiB of temporaries


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """fp32 -> the nearest bf16 values (ties to even), as fp32."""
    return bfloat16_bits_to_float32(to_bfloat16_bits(np.asarray(x, dtype=np.float32)))


def effective_group_size(k: int, group_size: int) -> int:
    """The group size actually used for K input features.

    Rule (documented in the engine's quant config): the largest multiple of 16 that is
    <= group_size and divides K; if none exists, one group spans all of K. SmolLM2's
    hidden size 576 with group 128 gives 96 (576 = 6 x 96); with 64 it stays 64.
    """
    if group_size <= 0 or group_size >= k:
        return k
    for g in range(group_size - group_size % 16, 15, -16):
        if k % g == 0:
            return g
    return k


def quantize_int8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8: w ~= q * scale[:, None]; q in [-127, 127].
    Returns q (N, K) int8, scale (N,) float32. Rows are done in blocks (an embedding table
    is the build's largest weight: no table-sized fp32 temporaries)."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    q, scale = np.empty((n, k), dtype=np.int8), np.empty(n, dtype=np.float32)
    rows = max(1, CHUNK_ELEMENTS // max(k, 1))
    for r0 in range(0, n, rows):
        block = w[r0:r0 + rows]
        amax = np.abs(block).max(axis=1)
        s = np.where(amax > 0, amax / INT8_MAX, 1.0).astype(np.float32)
        t = block / s[:, None]
        np.rint(t, out=t)
        np.clip(t, -INT8_MAX, INT8_MAX, out=t)
        q[r0:r0 + rows], scale[r0:r0 + rows] = t, s
    return q, scale


def dequantize_int8_per_channel(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    out = q.astype(np.float32)
    rows = max(1, CHUNK_ELEMENTS // max(q.shape[1], 1))
    for r0 in range(0, q.shape[0], rows):  # in place, a block at a time: one output-sized array
        np.multiply(out[r0:r0 + rows], scale[r0:r0 + rows, None], out=out[r0:r0 + rows])
    return out


def quantize_int8_per_token(x: np.ndarray, smooth: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric per-row int8 of activations, exactly as linear_w8a8 computes it
    (fp32 throughout): x' = x * smooth; a = max|x'|; q = rint(clip(x' * (127 / a)));
    scale = a / 127 (1 for an all-zero row, whose codes are 0).
    x: (M, K) float32, smooth: (K,) or None. Returns q (M, K) int8, scale (M,) float32."""
    x = np.asarray(x, dtype=np.float32)
    if smooth is not None:
        x = x * np.asarray(smooth, dtype=np.float32)[None, :]
    amax = np.abs(x).max(axis=1)
    nz = amax > 0
    inv = np.where(nz, np.float32(INT8_MAX) / np.where(nz, amax, 1), 0).astype(np.float32)
    q = np.rint(np.clip(x * inv[:, None], -INT8_MAX, INT8_MAX)).astype(np.int8)
    scale = np.where(nz, amax / np.float32(INT8_MAX), 1).astype(np.float32)
    return q, scale


def linear_w8a8_ref(x: np.ndarray, q: np.ndarray, w_scale: np.ndarray, smooth: np.ndarray | None = None,
                    bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reference of linear_w8a8@1. x: (M, K) fp32; q: (N, K) int8; w_scale: (N,).
    Returns (y (M, N) float64, acc (M, N) int64: the exact integer dot products)."""
    xq, xs = quantize_int8_per_token(x, smooth)
    acc = xq.astype(np.int64) @ q.astype(np.int64).T  # (M, N)
    y = acc.astype(np.float64) * (xs[:, None].astype(np.float32) * np.asarray(w_scale, np.float32)[None, :])
    if bias is not None:
        y = y + np.asarray(bias, dtype=np.float64)[None, :]
    return y, acc


def quantize_int8_per_group(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic symmetric int8 of activations per row and per group of `group` columns, exactly
    as linear_w4a8 computes it: quantize_int8_per_token of each group on its own.
    x: (M, K) float32, K a multiple of group. Returns q (M, K) int8, scale (M, K/group) float32."""
    x = np.asarray(x, dtype=np.float32)
    m, k = x.shape
    q, scale = quantize_int8_per_token(x.reshape(m * (k // group), group))
    return q.reshape(m, k), scale.reshape(m, k // group)


def linear_w4a8_ref(x: np.ndarray, codes: np.ndarray, scales: np.ndarray, group: int,
                    bias: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reference of linear_w4a8@1. x: (M, K) fp32; codes: (N, K) 0..15 (w = scale * (code - 8));
    scales: (N, K/group) fp32. Per row and group the exact integer dot product of the int8
    activations with code - 8, then y += float(dot) * (xs * scale) group by group in fp32
    (the kernel's FMA, here rounded once in float64 and once to fp32: it may differ from the
    kernel's single rounding by an ulp of y per group). Returns (y (M, N) float32,
    acc (M, N, K/group) int64: the exact integer dot products)."""
    xq, xs = quantize_int8_per_group(x, group)
    m, k = xq.shape
    n, ng = codes.shape[0], k // group
    w = codes.astype(np.int64) - 8
    acc = np.einsum("mgk,ngk->mng", xq.astype(np.int64).reshape(m, ng, group), w.reshape(n, ng, group))
    s = xs[:, None, :] * np.asarray(scales, np.float32)[None, :, :]  # (M, N, ng) fp32 products
    y = np.zeros((m, n), np.float32)
    for g in range(ng):
        y = (acc[:, :, g].astype(np.float32).astype(np.float64) * s[:, :, g].astype(np.float64)
             + y.astype(np.float64)).astype(np.float32)
    if bias is not None:
        y = y + np.asarray(bias, np.float32)[None, :]
    return y, acc


def fake_quant_int8_per_token(x: np.ndarray, smooth: np.ndarray | None = None) -> np.ndarray:
    """What the kernel's activations become: dequantized per-token int8 of x * smooth."""
    q, scale = quantize_int8_per_token(x, smooth)
    return q.astype(np.float32) * scale[:, None]


def int4_group_params(w: np.ndarray, group: int, zero_point: bool,
                      clip_ratio: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Scales and offsets of group-wise 4-bit codes: w ~= scale * code + offset, code in 0..15.

    symmetric (zero_point=False): offset = -8 * scale, scale = amax / 7 (codes 1..15 used,
    code 8 is zero); asymmetric: scale = (max - min) / 15, offset = -zero * scale with an
    integer zero (so that zero is exact, up to the offset's bf16 rounding).
    `clip_ratio` shrinks the range (AWQ/GPTQ-style clipping search).
    Both are bf16 values (stored as bf16: half the bytes of fp32 parameters, and the codes
    are chosen against exactly what is stored); -8 * scale is exact in bf16. Rounding
    moves the scale and the offset by at most 2^-8 of themselves (half a bf16 ulp), far
    less than the 4-bit rounding of the weights (the codes are chosen on the rounded grid).
    Returns scale, offset: (N, K // group) float32.
    """
    n, k = w.shape
    g = w.reshape(n, k // group, group).astype(np.float32)
    if zero_point:
        lo = np.minimum(g.min(axis=2), 0.0) * clip_ratio
        hi = np.maximum(g.max(axis=2), 0.0) * clip_ratio
        scale = round_to_bf16(np.where(hi > lo, (hi - lo) / (INT4_LEVELS - 1), 1.0))
        zero = np.clip(np.rint(-lo / scale), 0, INT4_LEVELS - 1)
        offset = round_to_bf16(-zero * scale)
    else:
        amax = np.abs(g).max(axis=2) * clip_ratio
        scale = round_to_bf16(np.where(amax > 0, amax / 7.0, 1.0))
        offset = (-8.0 * scale).astype(np.float32)
    return scale, offset


def quantize_int4(w: np.ndarray, scale: np.ndarray, offset: np.ndarray, group: int) -> np.ndarray:
    """Codes (N, K) uint8 in 0..15 for the given group parameters. Computed in blocks of rows
    in place (one block-sized fp32 temporary, not five weight-sized ones)."""
    n, k = w.shape
    codes = np.empty((n, k), dtype=np.uint8)
    rows = max(1, CHUNK_ELEMENTS // k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        g = w[r0:r1].reshape(r1 - r0, k // group, group).astype(np.float32)  # (rows, G, g), a copy
        np.subtract(g, offset[r0:r1, :, None], out=g)
        np.divide(g, scale[r0:r1, :, None], out=g)
        np.rint(g, out=g)
        np.clip(g, 0, INT4_LEVELS - 1, out=g)
        codes[r0:r1] = g.reshape(r1 - r0, k)
    return codes


def dequantize_int4(codes: np.ndarray, scale: np.ndarray, offset: np.ndarray, group: int) -> np.ndarray:
    """(N, K) fp32 from codes and group parameters, in blocks of rows (no weight-sized temporaries)."""
    n, k = codes.shape
    out = np.empty((n, k), dtype=np.float32)
    rows = max(1, CHUNK_ELEMENTS // k)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        g = out[r0:r1].reshape(r1 - r0, k // group, group)  # (rows, G, g), a view of out
        g[...] = codes[r0:r1].reshape(g.shape)
        np.multiply(g, scale[r0:r1, :, None], out=g)
        np.add(g, offset[r0:r1, :, None], out=g)
    return out


def sqnr_db(reference: np.ndarray, approx: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio in dB (higher is better; inf when exact). Summed in
    fp64 over blocks (no weight-sized fp64 temporaries)."""
    ref, app = np.asarray(reference).reshape(-1), np.asarray(approx).reshape(-1)
    signal = noise = 0.0
    for i in range(0, ref.size, CHUNK_ELEMENTS):
        r = ref[i:i + CHUNK_ELEMENTS].astype(np.float64)
        d = r - app[i:i + CHUNK_ELEMENTS]
        noise += float(np.square(d, out=d).sum())  # not np.dot: BLAS threads spin on a busy machine
        signal += float(np.square(r, out=r).sum())
    if noise == 0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise))
