"""Element types of stored tensors: one vocabulary for the whole contract.

Ids are stable numbers: an id is never reused for another meaning. `bits` is the size of
one element; a layout's size rule (layouts.py) turns shape x bits into bytes. User-facing
spellings (`--kv-cache-dtype fp8`, `--quant fp8`) are flags, mapped to these names where
the builder writes the engine (kv.py, quantization/formats.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    id: int
    bits: int
    cpp: str  # the enumerator in csrc/format.h


DTYPES: tuple[DType, ...] = (
    DType("float32", 0, 32, "DT_F32"),
    DType("float16", 1, 16, "DT_F16"),
    DType("bfloat16", 2, 16, "DT_BF16"),
    DType("int8", 3, 8, "DT_I8"),
    DType("uint8", 4, 8, "DT_U8"),
    DType("int32", 5, 32, "DT_I32"),
    DType("float8_e4m3", 6, 8, "DT_F8E4M3"),  # OCP E4M3FN (quantization/fp8.py)
    DType("int4", 7, 4, "DT_I4"),  # 4-bit codes, only in the int4 layouts
)
DTYPE_IDS = {d.name: d.id for d in DTYPES}
DTYPE_BITS = {d.name: d.bits for d in DTYPES}


def dtype_name(dtype_id: int) -> str:
    for d in DTYPES:
        if d.id == dtype_id:
            return d.name
    raise ValueError(f"unknown dtype id {dtype_id}")


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    out = ((bits + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_stored_elements(w: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values -> an array whose bytes are those values in a floating `dtype`."""
    w = np.asarray(w, dtype=np.float32)
    if dtype == "float32":
        return w
    if dtype == "bfloat16":
        return to_bfloat16_bits(w)
    if dtype == "float16":
        return w.astype(np.float16)
    raise ValueError(f"to_stored_elements: {dtype!r} is not a floating dtype written from fp32 values")
