"""AWQ: per-input-channel scales s that protect the weights salient activations hit.

For a group of linears reading one input X, a grid search over alpha picks
s = mean|x|^alpha / mean|w|^(1 - alpha) minimising ||X W^T - X (Q(W diag(s)) / s)^T||^2.
The scaled weights W diag(s) are quantized; the 1/s is folded, exactly, into whatever
produces X (InputGroup.fold: for a Llama layer the RMSNorm weight before q/k/v and
gate/up, the up_proj rows before down_proj). An input with no fold keeps s = 1 (o_proj:
with grouped KV heads no per-channel fold exists). Reference: Lin et al., 2023.
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization import primitives as prim
from bessemer.quantization.native_threads import native_threads
from bessemer.quantization.channel_scales import ChannelScales, InputGroup

GRID = 20


def fake_quant_int4(w: np.ndarray, group: int, zero_point: bool, col_scale: np.ndarray | None = None) -> np.ndarray:
    """w (N, K) on the builder's grid (scale_search.int4_grid) without the per-group scale
    search, which would cost its 33 candidates at each of the GRID alphas (the final codes are
    searched); with col_scale s (K,): Q(w diag(s)) / s, AWQ's candidate weight. One pass in
    native code on native_threads() threads (bessemer._C, targets/cpu/csrc/kernels/int4_fake_quant.cpp:
    NumPy's weight-sized temporaries were ~40% of AWQ's search), bit-identical to
    fake_quant_int4_reference, its statement in NumPy."""
    from bessemer import _C

    w = np.ascontiguousarray(w, dtype=np.float32)
    cs = None if col_scale is None else np.ascontiguousarray(col_scale, dtype=np.float32)
    return _C.int4_fake_quant(w, group, zero_point, cs, native_threads())


def fake_quant_int4_reference(w: np.ndarray, group: int, zero_point: bool,
                              col_scale: np.ndarray | None = None) -> np.ndarray:
    """fake_quant_int4 in NumPy: the oracle its native code is tested against bit for bit
    (tests/test_fake_quant.py)."""
    from bessemer.quantization.scale_search import int4_grid

    w = np.asarray(w, dtype=np.float32)
    if col_scale is not None:
        w = w * np.asarray(col_scale, dtype=np.float32)[None, :]
    scale, offset = int4_grid(w, group, zero_point, search=False)
    q = prim.dequantize_int4(prim.quantize_int4(w, scale, offset, group), scale, offset, group)
    return q if col_scale is None else q / np.asarray(col_scale, dtype=np.float32)[None, :]


def search_scale(weights: list[np.ndarray], x_abs_mean: np.ndarray, x_sample: np.ndarray,
                 group: int, zero_point: bool) -> tuple[np.ndarray, float, float]:
    """weights: the (N_i, K) matrices reading input x; x_sample: (R, K).
    Returns (s (K,), best alpha, loss reduction vs s = 1 as a ratio)."""
    w = np.concatenate(weights, axis=0).astype(np.float32)
    n, k = w.shape
    wg = np.abs(w.reshape(n, k // group, group))
    w_mean = (wg / np.maximum(wg.max(axis=2, keepdims=True), 1e-12)).reshape(n, k).mean(axis=0)
    x = x_sample.astype(np.float32)
    ref = x @ w.T
    best = (np.inf, None, 0.0)
    for i in range(GRID):
        alpha = i / GRID
        s = np.maximum(x_abs_mean, 1e-4) ** alpha / np.maximum(w_mean, 1e-4) ** (1 - alpha)
        s = (s / np.sqrt(s.max() * s.min())).astype(np.float32)
        approx = fake_quant_int4(w, group, zero_point, s)
        loss = float(((x @ approx.T - ref) ** 2).mean())
        if loss < best[0]:
            best = (loss, s, alpha)
    # plain RTN (s = 1) is a candidate too: AWQ must never make a layer worse
    rtn = float(((x @ fake_quant_int4(w, group, zero_point).T - ref) ** 2).mean())
    if rtn <= best[0]:
        return np.ones(k, dtype=np.float32), -1.0, 1.0
    return best[1], best[2], best[0] / rtn


def awq_transforms(get, groups: list[InputGroup], stats: dict, group_size: int, zero_point: bool,
                   progress=lambda m: None) -> tuple[dict, dict]:
    """Scales for every input group that has a fold (builder/input_groups.py).

    Returns ({tensor name: Transform}, report). `get(name)` reads an fp32 checkpoint tensor;
    stats: {group key: activation statistics} (quantization/calibration.py).
    """
    scales = ChannelScales()
    report = {}
    searched = [g for g in groups if g.fold is not None]
    for i, group in enumerate(searched):
        st = stats[group.key]
        ws = [get(n) for n in group.weights]
        g = prim.effective_group_size(ws[0].shape[1], group_size)
        s, alpha, ratio = search_scale(ws, st["abs_mean"], st["sample"], g, zero_point)
        scales.smooth(group, s)
        report[group.key] = {"alpha": alpha, "loss_vs_rtn": round(float(ratio), 4)}
        progress(f"awq: input {i + 1}/{len(searched)}")
    return scales.transforms, report
