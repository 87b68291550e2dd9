"""Quantized KV cache: the reference of the cache write and read (`--kv-cache-dtype`).

Scheme (both int8 and fp8): symmetric, with a *dynamic* scale per (token, KV head),
chosen when the token's K (after RoPE) or V row is written into the cache and stored
beside the codes. No calibration is needed and an outlier token or head only coarsens
its own row. Per token and layer the cache holds, for K and for V, num_kv_heads * head_dim
one-byte codes plus num_kv_heads float32 scales.

- int8: scale = amax / 127, code = rint(x * (127 / amax)) in [-127, 127] (half to even).
- fp8:  OCP E4M3FN (bias 7, max 448, no infinities): scale = amax / 448, code =
  e4m3(x * (448 / amax)) rounded to nearest even; the dequantized value is
  e4m3_value(code) * scale.
A row of zeros gets scale 0 and codes 0.

The arithmetic is the kernel's, step by step in float32 (amax, the reciprocal multiplier,
the product, the rounding), so the codes of attention@1's cache write equal these.
Shapes: x: (..., head_dim); codes the same shape; scales x.shape[:-1]. The cache's layout
and size per token are the contract's: format/kv.py.
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization.fp8 import E4M3_MAX as _E4M3_MAX, decode_e4m3, encode_e4m3

KV_QUANT_DTYPES = ("int8", "fp8")
INT8_MAX = np.float32(127.0)
E4M3_MAX = np.float32(_E4M3_MAX)  # float32, as the kernel computes the scale


def _amax(x: np.ndarray) -> np.ndarray:
    return np.abs(x).max(axis=-1)


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x: (..., D) -> codes int8 (..., D), scales float32 (...)."""
    x = np.asarray(x, np.float32)
    amax = _amax(x)
    safe = np.where(amax > 0, amax, np.float32(1.0))
    inv = np.where(amax > 0, INT8_MAX / safe, np.float32(0.0)).astype(np.float32)
    codes = np.clip(np.rint(x * inv[..., None]), -127, 127).astype(np.int8)
    return codes, (amax / INT8_MAX).astype(np.float32)


def dequantize_int8(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return codes.astype(np.float32) * scales[..., None]


def quantize_fp8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x: (..., D) -> codes uint8 (E4M3FN bytes) (..., D), scales float32 (...)."""
    x = np.asarray(x, np.float32)
    amax = _amax(x)
    safe = np.where(amax > 0, amax, np.float32(1.0))
    inv = np.where(amax > 0, E4M3_MAX / safe, np.float32(0.0)).astype(np.float32)
    return encode_e4m3(x * inv[..., None]), (amax / E4M3_MAX).astype(np.float32)


def dequantize_fp8(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    return decode_e4m3(codes) * scales[..., None]


def fake_quantize_kv(x: np.ndarray, kv_dtype: str) -> np.ndarray:
    """What attention reads back for rows x (..., D) written into a kv_dtype cache."""
    if kv_dtype == "int8":
        return dequantize_int8(*quantize_int8(x))
    if kv_dtype == "fp8":
        return dequantize_fp8(*quantize_fp8(x))
    raise ValueError(f"kv_dtype {kv_dtype!r} is not a quantized KV dtype ({', '.join(KV_QUANT_DTYPES)})")

