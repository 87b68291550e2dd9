"""Storage layouts: how a tensor's elements lie in a rank file.

Ids are stable numbers: an id is never reused for another meaning. A layout is part of the
contract (its byte order is defined here, by its packer, and read by kernels); which layout
a weight is stored in is a target's choice (targets/<name>/lowering.py).

    row_major        C order over `shape`; 4-bit codes two per byte, the first (even index)
                     in the low nibble (the cuda target's int4 weights).
    panel16          a [N, K] matrix (out_features, in_features) stored as ceil(N/16) panels
                     of 16 output rows; element W[16p + j, k] lives at index (p*K + k)*16 + j;
                     rows past N are zero. Lets a GEMM/GEMV kernel read 16 outputs' weights
                     for one k with a single vector load.
    panel16_int4     4-bit codes (dtype int4) of a [N, K] matrix, panel16 order, 8 bytes per
                     (panel p, k): byte j holds the code of row 16p+j in its low nibble and
                     of row 16p+8+j in its high nibble (one byte load + mask/shift yields 16 lanes).
    vnni16           int8 [N, K] for the int8 x int8 kernel (linear_w8a8): ceil(N/16) panels of
                     16 rows, K padded with zeros to Kp = a multiple of 4, k in groups of 4:
                     W[16p + j, 4g + i] at byte ((p*Kp/4 + g)*16 + j)*4 + i. One 64-byte load
                     is 16 rows x 4 k, the operand of one vpdpbusd (16 int32 lanes).
    panel16_int4_k8  4-bit codes (dtype int4) of a [N, K] matrix, K a multiple of 8, for the
                     bf16 dot-product kernel (linear_w4a16@2): ceil(N/16) panels of 16 rows,
                     each K/8 blocks of 64 bytes (8 k); in block b of panel p, byte 4r + 2e + h
                     holds the code of row 16p + r at k = 8b + 4h + e in its low nibble and at
                     k = 8b + 4h + 2 + e in its high nibble. So 16-bit word 2r + e holds k =
                     8b + 2j + e in nibble j: one shift per k pair j lines up 16 rows x 2 k.

Size rule (one for every layout): a 2-D layout stores align(N, row_align) x align(K,
col_align) elements; row_major stores prod(shape); bytes = ceil(elements * bits / 8).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bessemer.format.dtypes import DTYPE_BITS, to_stored_elements

PANEL = 16


@dataclass(frozen=True)
class Layout:
    name: str
    id: int
    cpp: str  # the enumerator in csrc/format.h
    ndim: int = 0  # 0: any shape; 2: an [N, K] matrix
    row_align: int = 1  # N is padded (with zeros) to a multiple of this
    col_align: int = 1  # K is padded (with zeros) to a multiple of this
    k_multiple: int = 1  # K must be a multiple of this (no padding)
    dtypes: tuple[str, ...] = ()  # the element types it may hold; () = any


LAYOUTS: tuple[Layout, ...] = (
    Layout("row_major", 0, "LAYOUT_ROW_MAJOR"),
    Layout("panel16", 1, "LAYOUT_PANEL16", ndim=2, row_align=PANEL),
    Layout("panel16_int4", 2, "LAYOUT_PANEL16_INT4", ndim=2, row_align=PANEL, dtypes=("int4",)),
    Layout("vnni16", 3, "LAYOUT_VNNI16", ndim=2, row_align=PANEL, col_align=4, dtypes=("int8",)),
    Layout("panel16_int4_k8", 4, "LAYOUT_PANEL16_INT4_K8", ndim=2, row_align=PANEL, k_multiple=8,
           dtypes=("int4",)),
)
LAYOUT_IDS = {lay.name: lay.id for lay in LAYOUTS}
_BY_NAME = {lay.name: lay for lay in LAYOUTS}


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def layout(name: str) -> Layout:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown layout {name!r}") from None


def check_tensor(shape: tuple[int, ...], dtype: str, layout_name: str) -> None:
    """Raises ValueError when `layout_name` cannot hold a `dtype` tensor of `shape`."""
    lay = layout(layout_name)
    if dtype not in DTYPE_BITS:
        raise ValueError(f"unknown dtype {dtype!r}")
    if lay.dtypes and dtype not in lay.dtypes:
        raise ValueError(f"{lay.name} layout needs dtype {'/'.join(lay.dtypes)}, not {dtype}")
    if lay.ndim and len(shape) != lay.ndim:
        raise ValueError(f"{lay.name} layout needs a {lay.ndim}-D shape, got {list(shape)}")
    if lay.ndim and shape[1] % lay.k_multiple:
        raise ValueError(f"{lay.name} layout needs K a multiple of {lay.k_multiple}, got {shape[1]}")


def packed_nbytes(shape: tuple[int, ...], dtype: str, layout_name: str) -> int:
    """Bytes a tensor takes in the file (the size rule above). Only the size: check_tensor
    says whether the layout may hold it (readers refuse a tensor that fails it)."""
    lay = layout(layout_name)
    if lay.ndim and len(shape) != lay.ndim:
        raise ValueError(f"{lay.name} layout needs a {lay.ndim}-D shape, got {list(shape)}")
    if lay.ndim == 2:
        elements = align_up(shape[0], lay.row_align) * align_up(shape[1], lay.col_align)
    else:
        elements = int(np.prod(shape, dtype=np.int64))
    return (elements * DTYPE_BITS[dtype] + 7) // 8


# ---- packers: numpy arrays -> the bytes of a layout (flat arrays) ----

def pack_panel16(w: np.ndarray) -> np.ndarray:
    """[N, K] -> panel16 order (flat), zero-padding N up to a multiple of 16."""
    n, k = w.shape
    n_pad = align_up(n, PANEL)
    if n_pad != n:
        w = np.concatenate([w, np.zeros((n_pad - n, k), dtype=w.dtype)], axis=0)
    # [P, 16, K] -> [P, K, 16]
    return np.ascontiguousarray(w.reshape(n_pad // PANEL, PANEL, k).transpose(0, 2, 1)).reshape(-1)


def pack_panel16_int4(codes: np.ndarray) -> np.ndarray:
    """codes (N, K) uint8 in 0..15 -> flat uint8 array of ceil(N/16) * K * 8 bytes."""
    n, k = codes.shape
    n_pad = align_up(n, PANEL)
    c = np.zeros((n_pad, k), dtype=np.uint8)
    c[:n] = codes
    panels = c.reshape(n_pad // PANEL, PANEL, k).transpose(0, 2, 1)  # [P, K, 16]
    packed = panels[:, :, :8] | (panels[:, :, 8:] << 4)  # [P, K, 8]
    return np.ascontiguousarray(packed).reshape(-1)


def unpack_panel16(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    """pack_panel16's flat [P, K, 16] elements -> the [N, K] rows (the padding dropped)."""
    n_pad = align_up(n, PANEL)
    panels = packed.reshape(n_pad // PANEL, k, PANEL)
    return np.ascontiguousarray(panels.transpose(0, 2, 1)).reshape(n_pad, k)[:n]


def unpack_panel16_int4(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    p = packed.reshape(-1, k, 8)
    return unpack_panel16(np.concatenate([p & 0xF, p >> 4], axis=2), n, k)  # [P, K, 16] codes


def pack_panel16_int4_k8(codes: np.ndarray) -> np.ndarray:
    """codes (N, K) uint8 in 0..15, K % 8 == 0 -> flat uint8 array of ceil(N/16) * K * 8 bytes."""
    n, k = codes.shape
    if k % 8:
        raise ValueError(f"panel16_int4_k8 needs K a multiple of 8, got {k}")
    n_pad = align_up(n, PANEL)
    c = np.zeros((n_pad, k), dtype=np.uint8)
    c[:n] = codes
    # k = 8b + 4h + 2t + e: [P, r, b, h, t, e] -> [P, b, r, e, h, t]; t = the nibble
    blocks = c.reshape(n_pad // PANEL, PANEL, k // 8, 2, 2, 2).transpose(0, 2, 1, 5, 3, 4)
    return np.ascontiguousarray(blocks[..., 0] | (blocks[..., 1] << 4)).reshape(-1)


def unpack_panel16_int4_k8(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    n_pad = align_up(n, PANEL)
    b = packed.reshape(n_pad // PANEL, k // 8, PANEL, 2, 2)  # [P, b, r, e, h]
    nib = np.stack([b & 0xF, b >> 4], axis=-1)  # [P, b, r, e, h, t]
    return np.ascontiguousarray(nib.transpose(0, 2, 1, 4, 5, 3)).reshape(n_pad, k)[:n]


def pack_int4_row_major(codes: np.ndarray) -> np.ndarray:
    """codes (..., K) in 0..15, K even -> (..., K / 2) bytes: code 2j low nibble, 2j + 1 high."""
    c = np.asarray(codes, np.uint8)
    if c.shape[-1] % 2:
        raise ValueError(f"int4 row_major needs an even last dimension, got {c.shape[-1]}")
    return np.ascontiguousarray(c[..., 0::2] | (c[..., 1::2] << 4)).reshape(-1)


def pack_int4_codes(codes: np.ndarray, layout_name: str) -> np.ndarray:
    """codes (N, K) in 0..15 in one of the int4 layouts (panel16_int4, panel16_int4_k8, row_major)."""
    if layout_name == "row_major":
        return pack_int4_row_major(codes)
    if layout_name == "panel16_int4_k8":
        return pack_panel16_int4_k8(codes)
    if layout_name == "panel16_int4":
        return pack_panel16_int4(codes)
    raise ValueError(f"{layout_name!r} is not an int4 layout")


def pack_vnni16(q: np.ndarray) -> np.ndarray:
    """q (N, K) int8 -> flat int8 array, vnni16 order."""
    n, k = q.shape
    n_pad, k_pad = align_up(n, PANEL), align_up(k, 4)
    c = np.zeros((n_pad, k_pad), dtype=np.int8)
    c[:n, :k] = q
    # [P, 16, Kp/4, 4] -> [P, Kp/4, 16, 4]
    return np.ascontiguousarray(c.reshape(n_pad // PANEL, PANEL, k_pad // 4, 4).transpose(0, 2, 1, 3)).reshape(-1)


def unpack_vnni16(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    n_pad, k_pad = align_up(n, PANEL), align_up(k, 4)
    p = packed.reshape(n_pad // PANEL, k_pad // 4, PANEL, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(p).reshape(n_pad, k_pad)[:n, :k]


def pack(v: np.ndarray, layout_name: str) -> np.ndarray:
    """Elements already in their stored type (codes, bf16 bits, ...) -> the layout's bytes."""
    if layout_name == "row_major":
        return np.ascontiguousarray(v).reshape(-1)
    if layout_name == "panel16":
        return pack_panel16(v)
    if layout_name == "vnni16":
        return pack_vnni16(v)
    return pack_int4_codes(v, layout_name)


def encode(w: np.ndarray, dtype: str, layout_name: str) -> np.ndarray:
    """fp32 values -> bytes-ready array in a floating stored dtype and a layout."""
    return pack(to_stored_elements(w, dtype), layout_name)
