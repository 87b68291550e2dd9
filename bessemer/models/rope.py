"""RoPE frequency tables, computed at build time and stored in the engine as a constant.

Variants differ only in inv_freq (and an attention scaling factor), so the runtime has one
rope kernel. Formulas follow transformers' `ROPE_INIT_FUNCTIONS` (fp32 arithmetic, as HF).
Two variants change their table with the sequence length in HF; a fixed table is exact
only up to a length (max_exact_positions), and the build refuses a longer --max-seq-len:
- dynamic: the default table up to max_position_embeddings (HF rescales beyond it);
- longrope: short_factor up to original_max_position_embeddings (HF switches to
  long_factor for a whole sequence once it is longer).
"""

from __future__ import annotations

import math

import numpy as np

from bessemer.errors import UnsupportedModelError

# rope_parameters keys each type reads besides rope_type, rope_theta, partial_rotary_factor;
# any other key would change the maths in a way this file does not implement.
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "original_max_position_embeddings", "attention_factor"),
}
# the keys of ROPE_KEYS the maths reads without a default (the rest default as in HF); the
# checkpoint's config is checked for them, and for each value's range, in
# builder/hf_config_fields.py before a build starts
ROPE_REQUIRED = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor",),
}
YARN_BETA_FAST, YARN_BETA_SLOW = 32, 1  # HF's defaults: the ramp's ends, in rotations
SUPPORTED_ROPE_TYPES = tuple(ROPE_KEYS)
COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")  # "type": older name of rope_type


def default_inv_freq(theta: float, dim: int) -> np.ndarray:
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, params: dict) -> np.ndarray:
    factor = params["factor"]
    low_freq_factor = params["low_freq_factor"]
    high_freq_factor = params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, blended, scaled).astype(np.float32)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(params: dict, dim: int, max_positions: int) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al., 2023): interpolated frequencies for long wavelengths, extrapolated
    for short ones, a linear ramp between; cos/sin scaled by the attention factor."""
    base = float(params["rope_theta"])
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = (yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all)
                     if mscale and mscale_all else yarn_get_mscale(factor))
    beta_fast, beta_slow = params.get("beta_fast") or YARN_BETA_FAST, params.get("beta_slow") or YARN_BETA_SLOW

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as HF: avoid a zero-width ramp
    pos_freqs = np.float32(base) ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim))
    extrapolation = (1.0 / pos_freqs).astype(np.float32)
    interpolation = (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1: extrapolate (short wavelengths keep their frequency)
    return (interpolation * (1 - keep) + extrapolation * keep).astype(np.float32), float(attention)


def longrope_inv_freq(params: dict, dim: int, max_positions: int) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3): per-frequency factors (short_factor within the original context);
    cos/sin scaled by sqrt(1 + log(factor) / log(original)) for the extended context."""
    original = params["original_max_position_embeddings"]
    factor = params.get("factor") or max_positions / original
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = np.asarray(params["short_factor"], dtype=np.float32)
    if ext.shape != (dim // 2,):
        raise UnsupportedModelError(f"rope short_factor has {ext.size} entries, rotary dims need {dim // 2}")
    shape = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (1.0 / (ext * np.float32(params["rope_theta"]) ** shape)).astype(np.float32), float(attention)


def max_exact_positions(params: dict, max_positions: int) -> tuple[int, str]:
    """(the longest sequence a fixed table reproduces exactly, that limit in words)."""
    if params.get("rope_type") == "longrope":
        limit = int(params["original_max_position_embeddings"])
        return limit, (f"the original context {limit} of longrope (original_max_position_embeddings; "
                       "beyond it HF switches to long_factor per sequence)")
    return max_positions, f"the model's max_position_embeddings {max_positions}"


def rope_tables(params: dict, head_dim: int, max_positions: int) -> tuple[np.ndarray, float, int]:
    """Returns (inv_freq [rotary_dim/2] fp32, attention_scaling, rotary_dim)."""
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_KEYS:
        raise UnsupportedModelError(
            f"rope_type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
    unknown = sorted(k for k in params if k not in COMMON_KEYS + ROPE_KEYS[rope_type])
    if unknown:
        raise UnsupportedModelError(
            f"rope parameter {unknown[0]!r} (rope_type {rope_type}) changes the maths and is not implemented; "
            f"{rope_type} reads {', '.join(ROPE_KEYS[rope_type]) or 'no other parameters'}")
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    inv = default_inv_freq(params["rope_theta"], rotary_dim)
    if rope_type in ("default", "dynamic"):  # dynamic: the default table within max_positions
        return inv, 1.0, rotary_dim
    if rope_type == "linear":
        return (inv / np.float32(params["factor"])).astype(np.float32), 1.0, rotary_dim
    if rope_type == "llama3":
        return llama3_inv_freq(inv, params), 1.0, rotary_dim
    if rope_type == "yarn":
        return (*yarn_inv_freq(params, rotary_dim, max_positions), rotary_dim)
    return (*longrope_inv_freq(params, rotary_dim, max_positions), rotary_dim)
