"""MXFP4 (OCP microscaling FP4), as gpt-oss checkpoints store their experts: blocks of 32
E2M1 values sharing one power-of-two scale. The reference decode; checkpoints holding such
pairs are read dequantized (builder/checkpoint.py).

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
