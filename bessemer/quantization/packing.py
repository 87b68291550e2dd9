"""Packing layouts for quantized weights: how codes and scales lie in a rank file.

A layout is separate from the algorithm that chose the scales (RTN, AWQ, GPTQ all give
the same storage) and from the kernel that reads it. Layout ids: engine_format.LAYOUT_IDS.

    int8 per channel   q: int8 panel16 [N, K];  scales: float32 row_major [N]
    int4 group-wise    codes: int4 panel16_int4_k8 [N, K] (panel16_int4 when K % 8 != 0:
                       int4_codes_layout);  scales, offsets: bfloat16 panel16
                       [N, K // group]  (w = scale * code + offset, code in 0..15)
    int8 x int8 (w8a8) q: int8 vnni16 [N, K];  scales: float32 row_major [N];
                       wsum: int32 row_major [N] = sum_k q[n, k] (the VNNI kernel feeds
                       activations shifted to u8 = code + 128 and subtracts 128 * wsum);
                       smooth (o_proj only, optional): float32 row_major [K], the 1/s
                       SmoothQuant multiplier applied to activations before they are quantized
"""

from __future__ import annotations

import numpy as np

from bessemer.builder.engine_format import PANEL, align_up, bfloat16_bits_to_float32, pack_panel16, to_bfloat16_bits


def pack_panel16_int4(codes: np.ndarray) -> np.ndarray:
    """codes (N, K) uint8 in 0..15 -> flat uint8 array of ceil(N/16) * K * 8 bytes."""
    n, k = codes.shape
    n_pad = align_up(n, PANEL)
    c = np.zeros((n_pad, k), dtype=np.uint8)
    c[:n] = codes
    panels = c.reshape(n_pad // PANEL, PANEL, k).transpose(0, 2, 1)  # [P, K, 16]
    packed = panels[:, :, :8] | (panels[:, :, 8:] << 4)  # [P, K, 8]
    return np.ascontiguousarray(packed).reshape(-1)


def unpack_panel16_int4(packed: np.ndarray, n: int, k: int) -> np.ndarray:
    n_pad = align_up(n, PANEL)
    p = packed.reshape(n_pad // PANEL, k, 8)
    panels = np.concatenate([p & 0xF, p >> 4], axis=2)  # [P, K, 16]
    return np.ascontiguousarray(panels.transpose(0, 2, 1)).reshape(n_pad, k)[:n]


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


def int4_codes_layout(k: int) -> str:
    """Layout the builder stores int4 codes of a K-column matrix in (what linear_w4a16@2 reads fastest)."""
    return "panel16_int4_k8" if k % 8 == 0 else "panel16_int4"


def pack_int4_codes(codes: np.ndarray, layout: str | None = None) -> np.ndarray:
    """codes (N, K) in `layout` (panel16_int4 or panel16_int4_k8; default int4_codes_layout(K))."""
    layout = layout or int4_codes_layout(codes.shape[1])
    return pack_panel16_int4_k8(codes) if layout == "panel16_int4_k8" else pack_panel16_int4(codes)


GROUP_PARAM_DTYPE = "bfloat16"  # int4 scales and offsets as stored (primitives.int4_group_params)


def pack_group_params(params: np.ndarray, dtype: str) -> np.ndarray:
    """scales or offsets (N, K // group), bf16 values as float32 -> panel16 order, as bf16
    bits (uint16; exact: the values are bf16 already) or float32."""
    p = np.asarray(params, dtype=np.float32)
    if dtype == "float32":
        return pack_panel16(p)
    bits = to_bfloat16_bits(p)
    if not np.array_equal(bfloat16_bits_to_float32(bits), p):
        raise ValueError("int4 group parameters must be bf16 values (primitives.int4_group_params rounds them)")
    return pack_panel16(bits)


def pack_vnni16(q: np.ndarray) -> np.ndarray:
    """q (N, K) int8 -> flat int8 array, vnni16 order (engine_format.LAYOUT_IDS)."""
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
