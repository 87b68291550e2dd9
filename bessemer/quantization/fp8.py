"""FP8 E4M3 primitives (OCP FP8 E4M3FN): round, encode, decode, per-channel weights and
static per-tensor or dynamic per-token activations. The reference the linear_fp8 kernel is tested against.

E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; 0x7F / 0xFF are NaN,
so the largest finite value is 448 = 1.75 * 2^8. Normal values 2^(e-7) * (1 + m/8) for
e in 1..15, subnormals m * 2^-9 (e = 0). Rounding is to nearest, ties to even, and
saturates: anything beyond +-448 becomes +-448 (never NaN), as TensorRT and modelopt do.

Shapes: a weight is w: (N, K) = (out_features, in_features); activations x: (T, K).
"""

from __future__ import annotations

import numpy as np

E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0 ** -6
E4M3_SUBNORMAL_STEP = 2.0 ** -9
NAN_CODES = (0x7F, 0xFF)


def round_to_e4m3(x: np.ndarray) -> np.ndarray:
    """Nearest E4M3 value (ties to even, saturating at +-448), as float32; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float64)
    a = np.minimum(np.abs(x), E4M3_MAX)
    # the spacing of E4M3 values around a: 2^(exponent - 3), floored at the subnormal step
    e = np.frexp(a)[1] - 1.0  # floor(log2 a), exact (a = 0 gives -1: subnormal step anyway)
    step = np.exp2(np.maximum(e, -6.0) - 3.0)
    q = np.rint(a / step) * step  # power-of-two step: exact; np.rint rounds ties to even
    return np.copysign(np.minimum(q, E4M3_MAX), x).astype(np.float32)


def _code_values() -> np.ndarray:
    """Value of each of the 256 codes (float64); NaN codes -> NaN."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    e, m = (codes >> 3) & 0xF, codes & 0x7
    mag = np.where(e == 0, m * E4M3_SUBNORMAL_STEP, np.exp2(e - 7.0) * (1.0 + m / 8.0))
    out = sign * mag
    out[list(NAN_CODES)] = np.nan
    return out


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    """uint8 codes -> float32 values (NaN for 0x7F / 0xFF)."""
    return _code_values().astype(np.float32)[np.asarray(codes, dtype=np.uint8)]


ENCODE_CHUNK = 1 << 20  # elements encoded at a time: bounds the temporaries of an 8B-sized weight


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """float -> uint8 code of its rounded E4M3 value (round_to_e4m3); -0.0 -> 0x80, NaN -> 0x7F.
    float32 (and narrower) input is encoded from its bits, a chunk at a time (a weight of an
    8B model in seconds, where the float64 search took minutes); float64 input is rounded as
    float64, never first to float32 (that would round twice)."""
    x = np.asarray(x)
    if x.dtype == np.float64:
        return _encode_rounded(round_to_e4m3(x))
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    out = np.empty(flat.shape, np.uint8)
    for i in range(0, flat.size, ENCODE_CHUNK):
        out[i:i + ENCODE_CHUNK] = _encode_float32(flat[i:i + ENCODE_CHUNK])
    return out.reshape(x.shape)


def _encode_float32(x: np.ndarray) -> np.ndarray:
    """Codes of float32 x (1-D) by integer arithmetic on its bits: round the 23-bit mantissa
    to 3 bits, ties to even (add 0x7FFFF plus the lowest kept bit, then truncate: a carry
    moves the exponent up, as it should); below 2^-6 the subnormal grid of 2^-9 steps, where
    x * 512 is exact and np.rint rounds ties to even. |x| is clamped to 448 first, so no value
    rounds to the NaN pattern."""
    sign = ((x.view(np.uint32) >> 24) & 0x80).astype(np.uint8)
    a = np.minimum(np.abs(x), np.float32(E4M3_MAX))  # NaN stays NaN
    bits = a.view(np.uint32)
    rounded = bits + np.uint32(0x7FFFF) + ((bits >> 20) & np.uint32(1))
    # E4M3 exponent field (bias 7) and the 3 kept mantissa bits; meaningful where a >= 2^-6
    normal = (((rounded >> 23).astype(np.int32) - (127 - 7)) << 3) | ((rounded >> 20) & np.uint32(7)).astype(np.int32)
    subnormal = np.rint(a * np.float32(1 / E4M3_SUBNORMAL_STEP))
    small = a < np.float32(E4M3_MIN_NORMAL)
    mag = np.where(small, np.where(np.isnan(subnormal), 0, subnormal).astype(np.int32), normal).astype(np.uint8)
    return np.where(np.isnan(a), np.uint8(0x7F), mag | sign)


def _encode_rounded(v: np.ndarray) -> np.ndarray:
    """Codes of values already on the E4M3 grid (round_to_e4m3's output)."""
    v = np.asarray(v, np.float64)
    table = _code_values()[:0x7F]  # non-negative finite codes, increasing with the code
    mag = np.searchsorted(table, np.abs(v)).astype(np.uint8)  # exact: v is on the grid
    sign = np.signbit(v).astype(np.uint8) << 7
    return np.where(np.isnan(v), np.uint8(0x7F), mag | sign).astype(np.uint8)


def channel_scales(w: np.ndarray) -> np.ndarray:
    """Per-output-channel scales amax / 448 (1 for an all-zero row): (N,) float32."""
    amax = np.abs(np.asarray(w, dtype=np.float32)).max(axis=1)
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), 1.0).astype(np.float32)


def quantize_fp8_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w ~= decode(codes) * scale[:, None]. Returns codes (N, K) uint8, scale (N,) float32."""
    w = np.asarray(w, dtype=np.float32)
    scale = channel_scales(w)
    return encode_e4m3(w / scale[:, None]), scale


def dequantize_fp8_per_channel(codes: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return decode_e4m3(codes) * np.asarray(scale, np.float32)[:, None]


def activation_scale(amax: float) -> np.float32:
    """Static per-tensor activation scale from the calibrated max |x| (1 if it is 0)."""
    amax = np.float32(amax)
    return np.float32(amax / np.float32(E4M3_MAX)) if amax > 0 else np.float32(1.0)


def token_scales(x: np.ndarray) -> np.ndarray:
    """Dynamic per-token activation scales (linear_fp8@2): max |x[t]| / 448 in fp32 (1 for an
    all-zero row). x: (T, K) -> (T, 1) float32, to broadcast over K."""
    amax = np.abs(np.asarray(x, np.float32)).max(axis=1)
    return np.where(amax > 0, amax / np.float32(E4M3_MAX), 1.0).astype(np.float32)[:, None]


GROUP_EXP_MAX = 64  # cap of a group's exponent: E4M3 values times 2^-64 stay normal in fp32 and bf16


def group_exponents(x: np.ndarray, group: int) -> np.ndarray:
    """linear_fp8@2 with act_group G: each group of G columns of a row (the last one may be
    shorter) gets e = the largest integer in [0, GROUP_EXP_MAX] with max|x[t, group]| * 2^e
    <= max|x[t]| (0 for an all-zero group): the group is quantized with the row's scale times
    2^-e, as OCP MX formats scale blocks by powers of two. Exact (frexp, no division), so the
    kernels compute the same integers. x: (T, K) -> (T, ceil(K / G)) int32."""
    a = np.abs(np.asarray(x, np.float32))
    T, K = a.shape
    starts = np.arange(0, K, group)
    amax_g = np.maximum.reduceat(a, starts, axis=1) if K else np.zeros((T, 0), np.float32)
    amax_r = a.max(axis=1, keepdims=True) if K else np.zeros((T, 1), np.float32)
    mr, er = np.frexp(amax_r)
    mg, eg = np.frexp(amax_g)
    e = er - eg - (mg > mr)
    return np.where(amax_g > 0, np.clip(e, 0, GROUP_EXP_MAX), 0).astype(np.int32)


def quantize_activation_grouped(x: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """What linear_fp8@2 with act_group G multiplies by the weights before its epilogue's
    per-row scale: e4m3(x / (s * 2^-e)) * 2^-e per group (group_exponents), float32 (exact:
    powers of two). x: (T, K), scale: (T, 1) -> (T, K)."""
    x = np.asarray(x, np.float32)
    e = np.repeat(group_exponents(x, group), group, axis=1)[:, :x.shape[1]]
    p = np.ldexp(np.float32(1.0), -e).astype(np.float32)  # 2^-e
    s_g = (np.asarray(scale, np.float32) * p).astype(np.float32)
    return (round_to_e4m3(x / s_g) * p).astype(np.float32)


def quantize_activation(x: np.ndarray, scale) -> np.ndarray:
    """E4M3 values of x / scale (fp32 division, then round_to_e4m3): what linear_fp8 feeds
    its GEMM. x: (T, K) -> (T, K) float32 on the E4M3 grid; scale: a float (static) or
    (T, 1) (per token)."""
    return round_to_e4m3(np.asarray(x, np.float32) / np.asarray(scale, np.float32))


def fake_quant_activation(x: np.ndarray, scale) -> np.ndarray:
    """x after an E4M3 round trip: quantize_activation(x, scale) * scale."""
    return quantize_activation(x, scale) * np.asarray(scale, np.float32)


def linear_fp8_reference(x: np.ndarray, codes: np.ndarray, w_scale: np.ndarray, x_scale: float | None,
                         bias: np.ndarray | None = None, act_group: int = 0) -> np.ndarray:
    """What linear_fp8 computes, in float64: (e4m3(x / s_x) @ decode(codes).T) * s_x * s_w,
    s_x the static scale (@1) or, x_scale None, each token's own (token_scales, @2), refined
    per act_group columns by a power of two when act_group > 0 (quantize_activation_grouped).
    x: (T, K), codes: (N, K) -> (T, N)."""
    s_x = token_scales(x) if x_scale is None else np.float32(x_scale)
    if act_group:
        if x_scale is not None:
            raise ValueError("act_group applies to dynamic per-token scales (linear_fp8@2) only")
        xq = quantize_activation_grouped(x, s_x, act_group).astype(np.float64)
    else:
        xq = quantize_activation(x, s_x).astype(np.float64)
    y = xq @ decode_e4m3(codes).astype(np.float64).T * (np.asarray(s_x, np.float64) * np.asarray(w_scale, np.float64))
    return y + (0.0 if bias is None else np.asarray(bias, np.float64))
