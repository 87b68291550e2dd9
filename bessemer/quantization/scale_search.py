"""Group scales chosen by search: the int4 grid that minimises the (importance-weighted)
squared error of each group, instead of the one its largest weight dictates.

Symmetric int4 (no offsets stored): w ~= scale * (code - 8), code in 0..15, so a group has
the 16 levels -8..7 times its scale. Round to nearest with scale = amax / 7 uses 15 of them;
mapping the weight of largest magnitude onto -8 (llama.cpp's Q4_0 rule) uses all 16. The
search tries scales around that one, refits each candidate by least squares on the codes it
gives, and keeps the one with the least error: with `importance` (mean x^2 of each input
channel over calibration rows, the diagonal of the GPTQ Hessian), the error that matters for
the layer's output; without it, plain weight error. The same idea as the scale searches of
AWQ's clipping and of llama.cpp's quantizers, written for this grid. Given the calibration
rows a weight reads (an expert's routed tokens), int4_symmetric_scales_for_inputs searches for
the error of the group's share of the output, (w - q)^T X_g^T X_g (w - q), the correlations
of the group's input channels included (the diagonal alone is the importance above).

Shapes: w: (N, K), groups of `group` along K; scales (N, K // group).
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization import primitives as prim
from bessemer.quantization.native_threads import native_threads

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
    native code on native_threads() threads (bessemer._C, targets/cpu/csrc/kernels/int4_scale_search.cpp:
    34 candidates x 2 roundings of every weight were most of a 4-bit build in NumPy); it is
    bit-identical to int4_symmetric_scales_reference, its statement in NumPy.
    """
    if not search:
        return _rule_scales(_signed_absmax(_groups(w, group))).astype(np.float32)
    from bessemer import _C

    w = np.ascontiguousarray(w, dtype=np.float32)
    return _C.int4_symmetric_scale_search(w, group, _importance(importance, w.shape[1]), SEARCH_DIVISORS,
                                          native_threads())


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


# The divisors the output-error search tries: the window around Q4_0's 8 where its best scales
# fall. Each candidate costs two (group x group) products per group of every row: on
# Qwen3-30B-A3B's expert gate/up (1536 x 2048) 9 of them cost 0.9 CPU-s per expert in NumPy
# (int4_symmetric_scales_for_inputs_reference; the plain search included), 0.1 in native code
# (plus the plain search's 0.1), all 33 about 3x that, and the 9's error on the calibration
# rows came within 5% of all 33's (0.409 vs 0.388 of RTN's, 0.935 vs 0.904; 14-94 routed rows).
OUTPUT_SEARCH_DIVISORS = np.linspace(6.5, 9.0, 9)


def group_second_moments(x: np.ndarray, group: int) -> np.ndarray:
    """(K // group, group, group) float32: X_g^T X_g / R of each group's input channels over
    the rows x (R, K), shrunk toward its diagonal by min(1, group / R). From R < group rows a
    block is singular, and a search on it fits those R rows rather than the input: on 9 of the
    Qwen3-30B-A3B expert gate/up, held-out error vs RTN's, median 0.85 unshrunk (0.74-1.14),
    0.82 shrunk (0.72-1.08); shrunk twice as hard, 0.92."""
    r, k = x.shape
    xg = np.ascontiguousarray(np.asarray(x, np.float32).reshape(r, k // group, group).transpose(1, 2, 0))
    moments = (xg @ xg.transpose(0, 2, 1)) / np.float32(r)  # (G, g, g)
    shrink = np.float32(min(1.0, group / r))
    diag = np.einsum("gii->gi", moments).copy()
    moments *= 1 - shrink
    idx = np.arange(group)
    moments[:, idx, idx] += shrink * diag
    return moments


def _levels(gt: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Symmetric levels -8..7 of groups gt (G, N, g) on scales (G, N)."""
    q = gt / scale[..., None]
    np.rint(q, out=q)
    np.maximum(q, -SYM_ZERO, out=q)
    np.minimum(q, SYM_ZERO - 1, out=q)
    return q


def _times_moments(v: np.ndarray, moments: np.ndarray) -> np.ndarray:
    """(G, N, g) @ (G, g, g) by NumPy's own loop, not BLAS: a threaded BLAS splits each of the
    G small products and spins its threads between calls, which cost 3-4 CPU-s per Qwen3-30B-A3B
    expert gate/up at 2 threads against 0.5 at 1 (the same wall time or worse)."""
    return np.einsum("gni,gij->gnj", v, moments, optimize=False)


def _output_error(gt: np.ndarray, moments: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """(G, N): e^T M e of each group's error e = g - scale * levels."""
    e = gt - scale[..., None] * _levels(gt, scale)
    return np.einsum("gni,gni->gn", _times_moments(e, moments), e)


def int4_symmetric_scales_for_inputs(w: np.ndarray, group: int, moments: np.ndarray, threads: int | None = None) -> np.ndarray:
    """Scales (N, K // group), bf16 values, minimising each group's output error e^T M e on
    the calibration rows (moments: group_second_moments (K // group, group, group)): the search
    int4_symmetric_scales_for_inputs_reference states, run in native code on `threads` threads
    (None: native_threads(); bessemer._C, targets/cpu/csrc/kernels/int4_output_search.cpp). The
    native sums run in another order than NumPy's einsum, so a refit near a bf16 rounding midpoint may round the other way: there
    the native search tries both neighbours, so it keeps the reference's candidates and may
    find a better one. Contract (tests/test_scale_search.py): each group's chosen scale has an
    output error at most the reference choice's x (1 + 1e-5), and >= 99% of the scales are the
    same (measured: 99.94%). Per Qwen3-30B-A3B expert gate/up (1536 x 2048, g32): 0.1 CPU-s
    for the native output search and 0.1 for the plain search it starts from, against the
    reference's 0.9 for both; down (2048 x 768) half that."""
    from bessemer import _C

    w = np.ascontiguousarray(w, dtype=np.float32)
    return _C.int4_output_error_scale_search(w, group, np.ascontiguousarray(moments, dtype=np.float32),
                                             int4_symmetric_scales(w, group), OUTPUT_SEARCH_DIVISORS,
                                             native_threads() if threads is None else threads)


def int4_symmetric_scales_for_inputs_reference(w: np.ndarray, group: int, moments: np.ndarray) -> np.ndarray:
    """int4_symmetric_scales_for_inputs in NumPy, the oracle its native search is tested
    against: scales (N, K // group), bf16 values, minimising each group's output error
    e^T M e on the calibration rows (moments: group_second_moments). Candidates: the plain
    search's scales (int4_symmetric_scales: RTN's grid, so no group does worse than RTN on
    this error) and, for each divisor d of OUTPUT_SEARCH_DIVISORS, the least-squares scale
    (L^T M w) / (L^T M L) of the codes L of v / -d, each measured with the codes rounded to
    nearest on it, as they are stored. (Ranking the candidates by the error of L itself at that
    scale, w^T M w - 2 s L^T M w + s^2 L^T M L, saves one product with M per candidate, 0.54
    against 0.88 CPU-s per Qwen3-30B-A3B expert gate/up, but its error came out 16% above a
    dense brute force's in tests/test_scale_search.py, against 7% this way.)"""
    n, k = w.shape
    gt = np.ascontiguousarray(np.asarray(w, np.float32).reshape(n, k // group, group).transpose(1, 0, 2))  # (G, N, g)
    gm = _times_moments(gt, moments)  # (G, N, g): M w of each group
    vmax = _signed_absmax(gt)  # (G, N)
    best = np.ascontiguousarray(int4_symmetric_scales(w, group).T)
    best_err = _output_error(gt, moments, best)
    for d in OUTPUT_SEARCH_DIVISORS:
        codes = _levels(gt, np.where(vmax == 0, 1.0, vmax / -d).astype(np.float32))
        num = np.einsum("gni,gni->gn", gm, codes)
        den = np.einsum("gni,gni->gn", _times_moments(codes, moments), codes)
        refit = prim.round_to_bf16(np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)).astype(np.float32)
        refit = np.where(refit == 0, best, refit)  # every code rounded to 0 (or an all-zero group)
        err = _output_error(gt, moments, refit)
        better = err < best_err
        best = np.where(better, refit, best)
        best_err = np.where(better, err, best_err)
    return np.ascontiguousarray(best.T)
