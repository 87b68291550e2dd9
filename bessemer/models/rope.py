"""RoPE frequency tables, computed at build time and stored in the engine as a constant.

Variants differ only in inv_freq (and an attention scaling factor), so the runtime has one
rope kernel. Formulas follow transformers' `ROPE_INIT_FUNCTIONS` (fp32 arithmetic, as HF).
"""

from __future__ import annotations

import math

import numpy as np

from bessemer.errors import UnsupportedModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


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


def rope_tables(params: dict, head_dim: int) -> tuple[np.ndarray, float, int]:
    """Returns (inv_freq [rotary_dim/2] fp32, attention_scaling, rotary_dim)."""
    rope_type = params.get("rope_type", "default")
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    inv = default_inv_freq(params["rope_theta"], rotary_dim)
    if rope_type == "default":
        return inv, 1.0, rotary_dim
    if rope_type == "linear":
        return (inv / np.float32(params["factor"])).astype(np.float32), 1.0, rotary_dim
    if rope_type == "llama3":
        return llama3_inv_freq(inv, params), 1.0, rotary_dim
    raise UnsupportedModelError(
        f"rope_type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


