"""A build is never silently wrong: every config field that changes the maths is understood,
and every checkpoint tensor is used.

A checkpoint whose `architectures` names the wrong family (a Qwen3 labelled Llama) loads
without a missing tensor; what gives it away is a tensor nothing reads (q_norm) or a config
field the family does not implement (Granite's multipliers, SmolLM3's no_rope_layers).
"""

from __future__ import annotations

import re
from typing import Callable

from bessemer.errors import UnsupportedModelError


def _absent(value, hf) -> bool:
    return value is None


def _one(value, hf) -> bool:
    return value is None or float(value) == 1.0


def _falsy(value, hf) -> bool:
    return not value


def _no_window(value, hf) -> bool:
    # Qwen-style configs keep a window size that only applies with use_sliding_window
    return value is None or hf.get("use_sliding_window") is False


def _all_full_attention(value, hf) -> bool:
    return value is None or all(t == "full_attention" for t in value)


def _all_rope(value, hf) -> bool:
    return value is None or all(bool(v) for v in value)


def _llama_scale(value, hf) -> bool:
    heads = hf.get("num_attention_heads") or 1
    head_dim = hf.get("head_dim") or hf.get("hidden_size", heads) // heads
    return value is None or abs(float(value) - head_dim ** -0.5) < 1e-12


# Config fields that change a model's maths when set, with the test for the value at which
# they do not (HF writes defaults, so a field may be present and harmless). A family lists
# the ones it implements; any other that is set is an error naming it.
MATH_FIELDS: dict[str, Callable] = {
    "attn_logit_softcapping": _absent,
    "final_logit_softcapping": _absent,
    "query_pre_attn_scalar": _absent,
    "embedding_multiplier": _one,
    "residual_multiplier": _one,
    "logits_scaling": _one,
    "attention_multiplier": _llama_scale,
    "no_rope_layers": _all_rope,
    "layer_types": _all_full_attention,
    "sliding_window": _no_window,
    "use_sliding_window": _falsy,
    "sliding_window_pattern": _absent,
    "use_qk_norm": _falsy,
    "qk_layernorm": _falsy,
    "clip_qkv": _absent,
    "num_experts": _falsy,
    "num_local_experts": _falsy,
    "n_routed_experts": _falsy,
    "attention_sink": _falsy,
    "use_bidirectional_attention": _falsy,
}


def check_math_fields(hf: dict, understood: tuple[str, ...] = ()) -> None:
    """Raises UnsupportedModelError naming the first maths-changing field `hf` sets that the
    family (hf["architectures"][0]) does not implement."""
    arch = (hf.get("architectures") or ["?"])[0]
    for name, neutral in MATH_FIELDS.items():
        if name in understood or name not in hf or neutral(hf[name], hf):
            continue
        raise UnsupportedModelError(
            f"config.json sets {name}={_short(hf[name])}, which changes the model's maths and {arch} does not "
            f"implement it; if the checkpoint is another family, correct \"architectures\" in config.json")


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Tensors a checkpoint may hold that no graph reads, and why.
UNUSED_OK = {
    r"(^|\.)rotary_emb\.inv_freq$": "RoPE tables are recomputed from the config",
}


def check_tensors_used(consumed: set[str], checkpoint: dict, arch: str,
                       ignored: dict[str, str] | None = None) -> None:
    """Raises UnsupportedModelError naming a checkpoint tensor that the graph does not read,
    unless a pattern of UNUSED_OK or `ignored` (the family's own, e.g. a vision tower of
    a multimodal checkpoint whose text part is built) explains it."""
    patterns = [re.compile(p) for p in {**UNUSED_OK, **(ignored or {})}]
    unused = sorted(n for n in checkpoint if n not in consumed and not any(p.search(n) for p in patterns))
    if unused:
        more = f" (and {len(unused) - 1} more)" if len(unused) > 1 else ""
        raise UnsupportedModelError(
            f"checkpoint tensor {unused[0]}{more} is not used by the {arch} graph, so the build would ignore "
            f"part of the model; if the checkpoint is another family, correct \"architectures\" in config.json")
