"""SmoothQuant: per-input-channel factors that move activation outliers into the weights.

For a linear y = x W^T whose input channel j has activation range a_j = max|x_j| (from
calibration) and weight range w_j = max_n |W[n, j]|, the factor

    s_j = a_j^alpha / w_j^(1 - alpha)

rescales both sides, y = (x / s) (W diag(s))^T, so that int8 per-token activations and
int8 per-channel weights lose less (alpha = 0.5 splits the range evenly). W diag(s) is
what gets quantized; the 1/s goes where it costs nothing when that is exact (InputGroup.fold,
read from the graph by builder/input_groups.py; for a Llama layer):

    q/k/v       1/s folded into input_layernorm's weight        (RMSNorm is per channel)
    gate/up     1/s folded into post_attention_layernorm's weight
    down_proj   1/s folded into up_proj's rows: h = silu(g) * up, so scaling up's row j
                scales h_j; per-output-channel int8 of up_proj is invariant to row scaling,
                so the fold is exact even after quantization
    o_proj      reads the attention output: no per-channel producer (with grouped KV heads
                the channels of one KV head are shared by several query heads). Either the
                kernel multiplies the activations by 1/s before quantizing them
                (o_proj_smoothing "kernel") or o_proj is not smoothed ("none", the default:
                measured slightly better on SmolLM2, see quantization/config.py). Other
                inputs without a fold (OLMo2's residual stream into q/k/v, gate/up)
                are not smoothed: the quantize pass gives only o_proj the kernel's 1/s.

Factors are shared by the linears that read one input (their weights concatenated).
Reference: Xiao et al., 2023. Pure functions; the builder applies the result.
"""

from __future__ import annotations

import numpy as np

from bessemer.quantization.channel_scales import ChannelScales, InputGroup

# Same guards as nvidia-modelopt's smoothquant: channels never seen active keep s = 1, and
# s stays in [1e-4, 1e4] so a dead weight column cannot blow the activation up.
S_MIN, S_MAX = 1e-4, 1e4
EPS = 1.0 / (1 << 31)


def weight_in_amax(weights: list[np.ndarray]) -> np.ndarray:
    """max_n |W[n, j]| over all rows of the (N_i, K) weights reading one input -> (K,)."""
    return np.max([np.abs(w).max(axis=0) for w in weights], axis=0).astype(np.float32)


def smooth_factors(act_amax: np.ndarray, w_amax: np.ndarray, alpha: float) -> np.ndarray:
    """s (K,) float32 = act_amax^alpha / w_amax^(1 - alpha), guarded (see S_MIN)."""
    a = np.asarray(act_amax, dtype=np.float64)
    w = np.maximum(np.asarray(w_amax, dtype=np.float64), EPS)
    s = np.maximum(a, EPS) ** alpha / w ** (1.0 - alpha)
    s = np.where(a <= EPS, 1.0, s)
    return np.clip(s, S_MIN, S_MAX).astype(np.float32)


def smoothquant_transforms(get, groups: list[InputGroup], act_amax: dict, alpha: float,
                           kernel_smoothed: frozenset = frozenset()) -> tuple[dict, dict, dict]:
    """Factors for every input group (builder/input_groups.py).

    get(name): an fp32 checkpoint tensor; act_amax: {group key: (K,) max |x|};
    kernel_smoothed: the first weights of groups without a fold whose kernel applies a stored
    1/s (the quantize pass's `smooth`, o_proj_smoothing "kernel"); other unfolded groups are
    not smoothed.
    Returns (transforms {tensor: Transform}, multipliers {first weight of an unfolded group:
    (K,) 1/s for the kernel}, report).
    """
    scales = ChannelScales()
    multipliers: dict[str, np.ndarray] = {}
    report = {}
    for group in groups:
        if group.fold is None and group.weights[0] not in kernel_smoothed:
            continue
        a = np.asarray(act_amax[group.key], dtype=np.float32)
        s = smooth_factors(a, weight_in_amax([get(n) for n in group.weights]), alpha)
        inv = scales.smooth(group, s)
        if group.fold is None:
            multipliers[group.weights[0]] = inv
        # how much flatter the activations got: max/median channel range, before and after
        after = a / s
        report[group.key] = {"act_spread": round(float(a.max() / max(np.median(a), EPS)), 2),
                             "act_spread_smoothed": round(float(after.max() / max(np.median(after), EPS)), 2)}
    return scales.transforms, multipliers, report


def smoothed_statistics(stats: dict, groups: list[InputGroup], inverse: dict) -> dict:
    """The calibration statistics of the smoothed inputs x / s, from those of x (exact: the
    fold is exact in fp32). inverse: {group key: (K,) 1/s}; other inputs are unchanged.
    hessian (K, K) -> H * (1/s)(1/s)^T, abs_max and abs_mean (K,) -> times 1/s; the stored
    statistics are not modified (they may be the calibration cache's)."""
    out = dict(stats)
    for group in groups:
        inv = inverse.get(group.key)
        if inv is None:
            continue
        inv = np.asarray(inv, np.float32)
        s = dict(stats[group.key])
        if s.get("hessian") is not None:
            s["hessian"] = (s["hessian"] * inv[:, None] * inv[None, :]).astype(np.float32)
        for k in ("abs_max", "abs_mean"):
            s[k] = (s[k] * inv).astype(np.float32)
        if "sample" in s:
            s["sample"] = (s["sample"] * inv).astype(np.float32)
        out[group.key] = s
    return out
