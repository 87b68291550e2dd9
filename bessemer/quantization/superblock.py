"""The two-level 4-bit grid (k-quant class, as llama.cpp's Q4_K): super-blocks of SUPER
columns, each cut into sub-blocks of SUB columns with their own scale and minimum, coded as
small integers under one fp16 super-scale and one fp16 super-minimum per super-block.

    w[n, k] = (d[n, s] * sc[n, j]) * code[n, k] - (dmin[n, s] * m[n, j])
        j = k // SUB (sub-block), s = k // B (super-block of B <= SUPER columns), code in 0..15,
        sc, m in 0..SUB_LEVELS (uint8), d, dmin >= 0 fp16 values

Each sub-block is asymmetric (its minimum, never above 0, is a level), which is what makes
4 bits per code plus two 8-bit sub-parameters per 32 columns more accurate than a bf16 scale
per 32 symmetric columns: the price per weight is 4 + 16/32 + 32/B: 4.625 bits with B = 256, 4.667 with B = 192.
Why 8-bit sub-parameters, not Q4_K's 6: they are stored one per byte anyway (the kernel reads
a byte per row and sub-block), and 8 bits code a sub-block's scale to 1/255 of the
super-block's largest instead of 1/63: weight SQNR on SmolLM2-135M's layer-3 q_proj 47.2 dB
against 35.1 dB with 6-bit codes (levels=63), on Gaussian weights 8 bits win too
(tests/test_superblock.py).

Choosing the grid: per sub-block, a search over candidate ranges (the min/max range scaled
by factors around 1) with a least-squares refit of (scale, minimum) to the codes each gives,
weighted by the importance of each input column (the GPTQ Hessian diagonal when calibrated);
then the super-parameters are the largest sub-scale / minimum over SUB_LEVELS (fp16), and
the sub-parameters are rounded under them. Codes: round to nearest on that final grid, or
GPTQ (gptq.gptq_superblock) on the same grid.

Shapes: w (N, K), K a multiple of the super-block B (super_block_size); sub arrays
(N, K // SUB); super arrays (N, K // B).
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization import primitives as prim
from bessemer.quantization.native_threads import native_threads

SUPER = 256  # the largest super-block (llama.cpp's QK_K)
SUB = 32
SUB_LEVELS = 255  # largest sub-scale / sub-minimum code (8 bits)
# Range factors tried per sub-block: the codes of (max - min) * f / 15 around min / f,
# each refitted by least squares. Shrinking the range clips the extreme weights of a
# sub-block when the others gain more than they lose.
RANGE_FACTORS = np.linspace(0.7, 1.1, 17)
# Rows searched at once: rows are independent, and blocks of 128 keep the search's NumPy
# temporaries (about 25 per range factor) in cache; SmolLM2's 3072 x 576 gate|up weight
# searched whole took 1.5-2x the CPU time.
SEARCH_ROWS = 128


def super_block_size(k: int) -> int | None:
    """The super-block of a weight with k input columns: the largest multiple of SUB up to
    SUPER that divides k (SmolLM2's 576 = 3 x 192: Q4_K's fixed 256 fits none of its
    attention and gate/up weights, where llama.cpp falls back to Q5_0), or None (k is not a
    multiple of SUB)."""
    fits = [s for s in range(SUB, SUPER + 1, SUB) if k % s == 0]
    return fits[-1] if fits else None


def _weighted_fit(g: np.ndarray, h: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares (scale, minimum) of g ~= scale * codes + minimum with weights h, the
    minimum kept <= 0. g, codes: (..., SUB); h: (SUB,) or broadcastable. Returns (...,) each."""
    sw = h.sum(axis=-1) * np.ones(g.shape[:-1], np.float32)
    hc = h * codes
    sq, sqq = hc.sum(-1), (hc * codes).sum(-1)
    sw_, sqw = (h * g).sum(-1), (hc * g).sum(-1)
    det = sw * sqq - sq * sq
    ok = det > 0
    safe = np.where(ok, det, 1.0)
    scale = np.where(ok, (sw * sqw - sq * sw_) / safe, 0.0)
    minimum = np.where(ok, (sqq * sw_ - sq * sqw) / safe, 0.0)
    # a positive minimum is not on the grid: refit the scale alone with minimum 0
    pos = minimum > 0
    alone = np.where(sqq > 0, sqw / np.where(sqq > 0, sqq, 1.0), 0.0)
    scale = np.where(pos, alone, scale)
    minimum = np.where(pos, 0.0, minimum)
    return np.maximum(scale, 0.0).astype(np.float32), minimum.astype(np.float32)


def _codes(g: np.ndarray, scale: np.ndarray, minimum: np.ndarray) -> np.ndarray:
    safe = np.where(scale > 0, scale, 1.0)
    q = np.rint((g - minimum[..., None]) / safe[..., None])
    return np.where(scale[..., None] > 0, np.clip(q, 0, prim.INT4_LEVELS - 1), 0).astype(np.float32)


def _error(g, h, scale, minimum, codes):
    return (h * (g - (scale[..., None] * codes + minimum[..., None])) ** 2).sum(-1)


def _floored_importance(importance: np.ndarray | None, k: int) -> np.ndarray:
    """(K,) fp32 importance, all ones when None, floored above 0 (a zero weighs a little)."""
    h = np.ones(k, np.float32) if importance is None else np.asarray(importance, np.float32).reshape(k)
    return np.maximum(h, 1e-12 * max(float(h.max()), 1e-30))


def sub_block_params(w: np.ndarray, importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Searched fp32 (scale >= 0, minimum <= 0) of every sub-block: (N, K // SUB) each.
    The search runs in native code on native_threads() threads (bessemer._C, targets/cpu/csrc/kernels/
    int4_superblock_search.cpp: in NumPy it was most of an int4-k build and of the mixed
    precision measurement); it is bit-identical to sub_block_params_reference."""
    from bessemer import _C

    w = np.ascontiguousarray(w, dtype=np.float32)
    return _C.int4_superblock_search(w, _floored_importance(importance, w.shape[1]), RANGE_FACTORS, native_threads())


def sub_block_params_reference(w: np.ndarray, importance: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """sub_block_params in NumPy: the oracle the native search is tested against bit for bit
    (tests/test_superblock.py). Every sum is NumPy's pairwise fp32 sum; a range factor's
    candidate scale and minimum, fp32 values times an fp64 factor, are fp64, as are the
    codes computed from them (then exact in fp32); the native code copies each step."""
    n, k = w.shape
    g = np.asarray(w, np.float32).reshape(n, k // SUB, SUB)
    h = _floored_importance(importance, k).reshape(1, k // SUB, SUB)
    scale, minimum = np.empty((n, k // SUB), np.float32), np.empty((n, k // SUB), np.float32)
    for r in range(0, n, SEARCH_ROWS):
        scale[r:r + SEARCH_ROWS], minimum[r:r + SEARCH_ROWS] = _search(g[r:r + SEARCH_ROWS], h)
    return scale, minimum


def _search(g: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sub_block_params of the sub-blocks g (rows, K // SUB, SUB) with importance h (1, K // SUB, SUB)."""
    lo = np.minimum(g.min(-1), 0.0)
    hi = np.maximum(g.max(-1), lo)
    best_s = (hi - lo) / (prim.INT4_LEVELS - 1)
    best_m = lo
    best_e = _error(g, h, best_s, best_m, _codes(g, best_s, best_m))
    for f in RANGE_FACTORS:
        s0, m0 = (hi - lo) * f / (prim.INT4_LEVELS - 1), lo * f
        s, m = _weighted_fit(g, h, _codes(g, s0, m0))
        e = _error(g, h, s, m, _codes(g, s, m))
        better = e < best_e
        best_s, best_m, best_e = np.where(better, s, best_s), np.where(better, m, best_m), np.where(better, e, best_e)
    return best_s.astype(np.float32), best_m.astype(np.float32)


def _to_fp16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def code_under_super(values: np.ndarray, super_block: int, levels: int = SUB_LEVELS) -> tuple[np.ndarray, np.ndarray]:
    """values (N, K // SUB) >= 0 -> (super (N, K // SUPER) fp16 values, codes (N, K // SUB)
    uint8 in 0..levels) with values ~= super * code. The super value is the block's largest
    over `levels`, rounded up to fp16 so that the largest codes to at most `levels`."""
    n, nsub = values.shape
    per = super_block // SUB
    v = values.reshape(n, nsub // per, per)
    top = v.max(-1) / levels
    d = _to_fp16(top)
    d = np.where(d < top, np.nextafter(d.astype(np.float16), np.float16(np.inf)).astype(np.float32), d)
    safe = np.where(d > 0, d, 1.0)
    codes = np.where(d[..., None] > 0, np.clip(np.rint(v / safe[..., None]), 0, levels), 0)
    return d.astype(np.float32), codes.reshape(n, nsub).astype(np.uint8)


def expand(super_scales, scales, super_offsets, offsets) -> tuple[np.ndarray, np.ndarray]:
    """The fp32 scale and offset (N, K // SUB) of every sub-block, as every kernel computes
    them: d * sc and -(dmin * m), products of fp32 values rounded once."""
    per = scales.shape[1] // super_scales.shape[1]
    d = np.repeat(np.asarray(super_scales, np.float32), per, axis=1)
    dmin = np.repeat(np.asarray(super_offsets, np.float32), per, axis=1)
    return (d * scales.astype(np.float32)).astype(np.float32), (-(dmin * offsets.astype(np.float32))).astype(np.float32)


def superblock_grid(w: np.ndarray, super_block: int, importance: np.ndarray | None = None,
                    levels: int = SUB_LEVELS) -> dict[str, np.ndarray]:
    """The stored grid parameters of w (N, K): {scales, offsets (uint8 (N, K // SUB)),
    super_scales, super_offsets (fp16 values as float32 (N, K // super_block))}."""
    scale, minimum = sub_block_params(w, importance)
    d, sc = code_under_super(scale, super_block, levels)
    dmin, m = code_under_super(-minimum, super_block, levels)
    return {"scales": sc, "offsets": m, "super_scales": d, "super_offsets": dmin}


def quantize_codes(w: np.ndarray, grid: dict[str, np.ndarray]) -> np.ndarray:
    """Round-to-nearest codes (N, K) uint8 of w on the grid."""
    scale, offset = expand(grid["super_scales"], grid["scales"], grid["super_offsets"], grid["offsets"])
    n, k = w.shape
    g = np.asarray(w, np.float32).reshape(n, k // SUB, SUB)
    return _codes(g, scale, offset).reshape(n, k).astype(np.uint8)


def dequantize(q: dict[str, np.ndarray]) -> np.ndarray:
    """The (N, K) fp32 weight of stored parts {codes, scales, offsets, super_scales, super_offsets}."""
    scale, offset = expand(q["super_scales"], q["scales"], q["super_offsets"], q["offsets"])
    return prim.dequantize_int4(q["codes"], scale, offset, SUB)
