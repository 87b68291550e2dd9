"""MXFP4 (OCP microscaling FP4), as gpt-oss checkpoints store their experts: blocks of 32
E2M1 values sharing one power-of-two scale. The reference decode (checkpoints holding such
pairs are read dequantized by builder/checkpoint.py for every other use) and the row encoder
of formats.Mxfp4Experts, the cpu target's experts kept in MXFP4 (moe_mxfp4).

Stored: `<name>_blocks` (..., N, G, 16) uint8, two 4-bit codes per byte (low nibble first),
and `<name>_scales` (..., N, G) uint8, the shared exponent + 127. A row of N holds G * 32
values along K; the tensor the model uses is that (..., N, K) transposed to (..., K, N).
"""

from __future__ import annotations

import numpy as np

# E2M1: sign, 2 exponent bits, 1 mantissa bit
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)
BLOCK = 32


def dequantized_shape(blocks_shape: tuple[int, ...]) -> tuple[int, ...]:
    *prefix, n, g, b = blocks_shape
    return (*prefix, g * 2 * b, n)


def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks (..., N, G, 16) uint8, scales (..., N, G) uint8 -> (..., G*32, N) float32."""
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] * 2 != BLOCK:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape} do not pair")
    values = np.empty(blocks.shape[:-1] + (BLOCK,), dtype=np.float32)
    values[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    values[..., 1::2] = FP4_VALUES[blocks >> 4]
    values = np.ldexp(values, scales.astype(np.int32)[..., None] - 127)  # exact: powers of two
    rows = values.reshape(blocks.shape[:-2] + (-1,))  # (..., N, K)
    return np.ascontiguousarray(np.swapaxes(rows, -1, -2))


def encode_mxfp4_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """rows (N, K) float32, K a multiple of 32 -> codes (N, K/2) uint8 (element 2j in the low
    nibble of byte j), scales (N, K/32) uint8 (exponent + 127): the OCP rule, scale
    2^(floor(log2(max |x|)) - 2) per block (E2M1's largest power is 4), nearest code.
    Values that are already MXFP4 (a checkpoint's, dequantized) come back exactly."""
    n, k = rows.shape
    if k % BLOCK:
        raise ValueError(f"MXFP4 needs K a multiple of {BLOCK}, got {k}")
    groups = rows.reshape(n, k // BLOCK, BLOCK)
    amax = np.abs(groups).max(axis=-1)
    exp = np.floor(np.log2(np.maximum(amax, np.float32(2.0 ** -126)))).astype(np.int32) - 2
    exp = np.clip(exp, -127, 127)
    scaled = groups / np.ldexp(np.float32(1.0), exp)[..., None].astype(np.float32)
    magnitude = np.searchsorted(_MIDPOINTS, np.abs(scaled), side="left").astype(np.uint8)  # 0..7
    codes = magnitude | (np.signbit(scaled).astype(np.uint8) << 3)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return np.ascontiguousarray(packed.reshape(n, k // 2)), (exp + 127).astype(np.uint8)


def decode_mxfp4_rows(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes (N, K/2), scales (N, K/32) uint8 (encode_mxfp4_rows) -> (N, K) float32."""
    n = codes.shape[0]
    blocks = codes.reshape(n, -1, BLOCK // 2)
    return np.swapaxes(decode_mxfp4(blocks, scales), -1, -2).reshape(n, -1)


# ties between two codes round to the smaller magnitude (side="left" of the midpoint); a
# value that is exactly a code is never near a midpoint
_MIDPOINTS = ((FP4_VALUES[:7] + FP4_VALUES[1:8]) / 2).astype(np.float32)
