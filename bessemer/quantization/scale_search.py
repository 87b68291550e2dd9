"""Group scales chosen by search: the int4 grid that minimises the (importance-weighted)
squared error of each group, instead of the one its largest weight dictates.

Symmetric int4 (no offsets stored): w ~= scale * (code - 8), code in 0..15, so a group has
the 16 levels -8..7 times its scale. Round to nearest with scale = amax / 7 uses 15 of them;
mapping the weight of largest magnitude onto -8 (llama.cpp's Q4_0 rule) uses all 16. The
search tries scales around that one, refits each candidate by least squares on the codes it
gives, and keeps the one with the least error: with `importance` (mean x^2 of each input
channel over calibration rows, the diagonal of the GPTQ Hessian), the error that matters for
the layer's output; without it, plain weight error. The same idea as the scale searches of
AWQ's clipping and of llama.cpp's quantizers, written for this grid.

Shapes: w: (N, K), groups of `group` along K; scales (N, K // group).
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization import primitives as prim

SYM_ZERO = 8  # code of 0 on the symmetric grid: w = scale * (code - 8)
# divisors tried for the largest-magnitude weight v (scale = v / -d): d = 8 maps v onto code 0
# (level -8), d = 7 onto level 7 with the opposite sign; d > 8 clips v. With importance
# weights the best scale of a group can clip a weight that matters little by half: a
# brute force over 4000 divisors (tests/test_scale_search.py) finds nothing 2% better
# than these 33 (6.5..9 missed groups by up to 3x).
SEARCH_DIVISORS = np.linspace(4.0, 12.0, 33)


def symmetric_codes(w: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    """Codes (N, K) uint8 in 0..15 of w on the symmetric grid of `scale` (N, K // group)."""
    return prim.quantize_int4(w, scale, -SYM_ZERO * scale, group)


def dequantize_symmetric(codes: np.ndarray, scale: np.ndarray, group: int) -> np.ndarray:
    return prim.dequantize_int4(codes, scale, -SYM_ZERO * scale, group)


def _groups(w: np.ndarray, group: int) -> np.ndarray:
    n, k = w.shape
    return np.asarray(w, dtype=np.float32).reshape(n, k // group, group)


def _signed_absmax(g: np.ndarray) -> np.ndarray:
    """The value of largest magnitude of each group (its sign kept): (N, G)."""
    idx = np.abs(g).argmax(axis=2)
    return np.take_along_axis(g, idx[..., None], axis=2)[..., 0]


def _rule_scales(vmax: np.ndarray) -> np.ndarray:
    """v / -8 rounded to bf16 for each group's signed absmax v (1 for an all-zero group): (N, G)."""
    return prim.round_to_bf16(np.where(vmax == 0, 1.0, vmax / -float(SYM_ZERO)))


def _importance(importance: np.ndarray | None, k: int) -> np.ndarray:
    """h (K,) of the search: the importance floored at 1e-12 of its largest (no weight ignored)."""
    h = np.ones(k, np.float32) if importance is None else np.asarray(importance, np.float32).reshape(k)
    return np.maximum(h, 1e-12 * max(float(h.max()), 1e-30))


def int4_symmetric_scales(w: np.ndarray, group: int, importance: np.ndarray | None = None,
                          search: bool = True) -> np.ndarray:
    """Scales (N, K // group), bf16 values as float32, for codes on the symmetric grid.

    search=False: scale = v / -8 for the weight v of largest magnitude (all 16 levels, v
    exact up to the scale's bf16 rounding). search=True: for every divisor d of
    SEARCH_DIVISORS, codes for scale v / -d, then the least-squares scale for those codes,
    sum(h w L) / sum(h L^2) with h the importance of each weight's input channel (K,);
    the candidate with the least sum(h (w - scale L)^2) wins (d = 8 is among them, so the
    search never does worse than search=False, up to bf16 rounding). The search runs in
    native code over all cores (bessemer._C, targets/cpu/csrc/kernels/int4_scale_search.cpp:
    34 candidates x 2 roundings of every weight were most of a 4-bit build in NumPy); it is
    bit-identical to int4_symmetric_scales_reference, its statement in NumPy.
    """
    if not search:
        return _rule_scales(_signed_absmax(_groups(w, group))).astype(np.float32)
    from bessemer import _C

    w = np.ascontiguousarray(w, dtype=np.float32)
    return _C.int4_symmetric_scale_search(w, group, _importance(importance, w.shape[1]), SEARCH_DIVISORS)


def int4_symmetric_scales_reference(w: np.ndarray, group: int, importance: np.ndarray | None = None) -> np.ndarray:
    """int4_symmetric_scales(search=True) in NumPy: the oracle the native search is tested
    against bit for bit (tests/test_scale_search.py). Every sum is NumPy's pairwise fp32
    sum and v / -d is computed in fp64 (d is an fp64 scalar), which the native code copies."""
    g = _groups(w, group)  # (N, G, g)
    n, ng, _ = g.shape
    vmax = _signed_absmax(g)
    zero = vmax == 0
    base = _rule_scales(vmax)
    h = _importance(importance, ng * group).reshape(1, ng, group)  # (1, G, g)

    def error(scale):
        levels = np.clip(np.rint(g / scale[..., None]), -SYM_ZERO, SYM_ZERO - 1)
        return (h * (g - scale[..., None] * levels) ** 2).sum(axis=2), levels

    best_scale = base
    best_err, _ = error(base)
    for d in SEARCH_DIVISORS:
        cand = np.where(zero, 1.0, vmax / -d).astype(np.float32)
        _, levels = error(cand)
        num = (h * g * levels).sum(axis=2)
        den = (h * levels * levels).sum(axis=2)
        refit = prim.round_to_bf16(np.where(den > 0, num / np.where(den > 0, den, 1.0), cand))
        refit = np.where(refit == 0, base, refit)  # a group whose codes all round to 0
        err, _ = error(refit)
        better = err < best_err
        best_scale = np.where(better, refit, best_scale)
        best_err = np.where(better, err, best_err)
    return best_scale.astype(np.float32)


def int4_grid(w: np.ndarray, group: int, zero_point: bool, importance: np.ndarray | None = None,
              search: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The 4-bit grid the builder stores w on: (scale, offset), (N, K // group) each, with
    w ~= scale * code + offset. Asymmetric: min/max of each group (primitives.int4_group_params,
    scale and offset stored); symmetric: the searched scale, offset = -8 * scale (not stored).
    RTN, AWQ and GPTQ all quantize on this grid; `importance` (K,) weights the search."""
    if zero_point:
        return prim.int4_group_params(w, group, True)
    scale = int4_symmetric_scales(w, group, importance, search)
    return scale, (-SYM_ZERO * scale).astype(np.float32)
