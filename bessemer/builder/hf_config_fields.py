"""The types of a HF config.json's fields, checked once when the checkpoint is opened.

Families read these fields with int()/float()/bool() or use them in shapes; a field of the
wrong type would otherwise surface as a traceback deep in a family, or worse be accepted
with another meaning ("tie_word_embeddings": "no" is truthy). A field that is absent or null
is left to the family (which knows its HF default); one that is present must have its type.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from bessemer.errors import BessemerError
from bessemer.models.rope import ROPE_REQUIRED, YARN_BETA_FAST, YARN_BETA_SLOW


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive_int(value) -> bool:
    return _int(value) and value > 0


def _non_negative_int(value) -> bool:
    return _int(value) and value >= 0


def _number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _positive_number(value) -> bool:
    return _number(value) and value > 0


def _fraction(value) -> bool:
    return _number(value) and 0 < value <= 1


def _positive_numbers(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(_positive_number(v) for v in value)


def _bool(value) -> bool:
    return isinstance(value, bool)


def _string(value) -> bool:
    return isinstance(value, str) and value != ""


def _strings(value) -> bool:
    return isinstance(value, list) and all(_string(v) for v in value)


def _non_empty_strings(value) -> bool:
    return _strings(value) and len(value) > 0


def _token_ids(value) -> bool:
    return _non_negative_int(value) or (isinstance(value, list) and all(_non_negative_int(v) for v in value))


def _bits(value) -> bool:
    return isinstance(value, list) and all(v in (0, 1) and not isinstance(v, float) for v in value)


def _object(value) -> bool:
    return isinstance(value, dict)


# field -> (test, what the test wants, in words)
FIELD_TYPES: dict[str, tuple[Callable, str]] = {
    "architectures": (_non_empty_strings, "a non-empty list of class names"),
    "model_type": (_string, "a string"),
    "vocab_size": (_positive_int, "a positive integer"),
    "hidden_size": (_positive_int, "a positive integer"),
    "intermediate_size": (_positive_int, "a positive integer"),
    "num_hidden_layers": (_positive_int, "a positive integer"),
    "num_attention_heads": (_positive_int, "a positive integer"),
    "num_key_value_heads": (_positive_int, "a positive integer"),
    "head_dim": (_positive_int, "a positive integer"),
    "max_position_embeddings": (_positive_int, "a positive integer"),
    "original_max_position_embeddings": (_positive_int, "a positive integer"),
    "sliding_window": (_non_negative_int, "a non-negative integer"),
    "max_window_layers": (_non_negative_int, "a non-negative integer"),
    "num_experts": (_non_negative_int, "a non-negative integer"),
    "num_local_experts": (_non_negative_int, "a non-negative integer"),
    "num_experts_per_tok": (_positive_int, "a positive integer"),
    "moe_intermediate_size": (_positive_int, "a positive integer"),
    "shared_expert_intermediate_size": (_non_negative_int, "a non-negative integer"),
    "decoder_sparse_step": (_positive_int, "a positive integer"),
    "rms_norm_eps": (_positive_number, "a positive number"),
    "layer_norm_eps": (_positive_number, "a positive number"),
    "rope_theta": (_positive_number, "a positive number"),
    "rope_local_base_freq": (_positive_number, "a positive number"),
    "partial_rotary_factor": (_fraction, "a number in (0, 1]"),
    "embedding_multiplier": (_number, "a finite number"),
    "residual_multiplier": (_number, "a finite number"),
    "logits_scaling": (_number, "a finite number"),
    "attention_multiplier": (_number, "a finite number"),
    "query_pre_attn_scalar": (_positive_number, "a positive number"),
    "tie_word_embeddings": (_bool, "true or false"),
    "attention_bias": (_bool, "true or false"),
    "mlp_bias": (_bool, "true or false"),
    "use_sliding_window": (_bool, "true or false"),
    "norm_topk_prob": (_bool, "true or false"),
    "hidden_act": (_string, "an activation name"),
    "hidden_activation": (_string, "an activation name"),
    "layer_types": (_strings, "a list of layer type names"),
    "no_rope_layers": (_bits, "a list of 0/1 per layer"),
    "mlp_only_layers": (lambda v: isinstance(v, list) and all(_non_negative_int(i) for i in v),
                        "a list of layer indices"),
    "bos_token_id": (_non_negative_int, "a token id"),
    "eos_token_id": (_token_ids, "a token id or a list of token ids"),
    "pad_token_id": (_non_negative_int, "a token id"),
    "rope_scaling": (_object, "an object"),
    "rope_parameters": (_object, "an object"),
    "text_config": (_object, "an object"),
}


# The entries of a rope_parameters (or older rope_scaling) object. models/rope.py divides by
# the factors and by their differences and takes their logarithms: a 0 crashed the build, and
# a 0, negative or NaN theta or factor built an engine that emits token 0 forever. Unlike the
# fields above, null is no default here: the maths would read it.
ROPE_FIELD_TYPES: dict[str, tuple[Callable, str]] = {
    "rope_type": (_string, "a rope type name"),
    "type": (_string, "a rope type name"),
    "rope_theta": (_positive_number, "a positive number"),
    "partial_rotary_factor": (_fraction, "a number in (0, 1]"),
    "factor": (_positive_number, "a positive number"),
    "low_freq_factor": (_positive_number, "a positive number"),
    "high_freq_factor": (_positive_number, "a positive number"),
    "original_max_position_embeddings": (_positive_int, "a positive integer"),
    "attention_factor": (_positive_number, "a positive number"),
    "beta_fast": (_positive_number, "a positive number"),
    "beta_slow": (_positive_number, "a positive number"),
    "mscale": (_positive_number, "a positive number"),
    "mscale_all_dim": (_positive_number, "a positive number"),
    "truncate": (_bool, "true or false"),
    "short_factor": (_positive_numbers, "a non-empty list of positive numbers"),
    "long_factor": (_positive_numbers, "a non-empty list of positive numbers"),
}


def _shown(value) -> str:
    return repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."


def _refuse(path: Path, field: str, problem: str) -> BessemerError:
    return BessemerError(f"{path}: {field} {problem}; correct config.json or re-export the checkpoint with "
                         "save_pretrained")


def check_field_types(hf: dict, path: Path) -> None:
    """Raises BessemerError naming the first field of `hf` (or of its text_config, for
    multimodal wrappers) whose value has the wrong type, or whose RoPE parameters are out of
    their range."""
    if not isinstance(hf, dict):
        raise BessemerError(f"{path} is not a JSON object; re-export the checkpoint with save_pretrained")
    for scope, fields in (("", hf), ("text_config.", hf.get("text_config"))):
        if not isinstance(fields, dict):
            continue
        for name, (ok, wanted) in FIELD_TYPES.items():
            value = fields.get(name)
            if value is not None and not ok(value):
                raise _refuse(path, scope + name, f"must be {wanted}, got {_shown(value)}")
        for name, params in _rope_objects(fields):
            problem = _rope_problem(params)
            if problem:
                raise _refuse(path, f"{scope}{name}.{problem[0]}", problem[1])


def _rope_objects(fields: dict):
    """(name, params) of each RoPE parameter object: rope_parameters / rope_scaling, or
    each of their per-layer-type objects (Gemma 3: {"full_attention": {...}, ...})."""
    for name in ("rope_parameters", "rope_scaling"):
        value = fields.get(name)
        if not isinstance(value, dict):
            continue
        if value and all(isinstance(v, dict) for v in value.values()):
            yield from ((f"{name}.{kind}", sub) for kind, sub in value.items())
        else:
            yield name, value


def _rope_problem(params: dict) -> tuple[str, str] | None:
    """(the key, what is wrong with it) for the first bad entry of one RoPE object; keys
    this file does not know are left to models/rope.py, which refuses them by name."""
    for key, value in params.items():
        ok, wanted = ROPE_FIELD_TYPES.get(key, (None, ""))
        if ok is not None and not ok(value):
            return key, f"must be {wanted}, got {_shown(value)}"
    rope_type = params.get("rope_type", params.get("type", "default"))
    for key in ROPE_REQUIRED.get(rope_type, ()):
        if key not in params:
            return key, f"is missing; rope_type {rope_type} needs it ({ROPE_FIELD_TYPES[key][1]})"
    if rope_type == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        # the band between them is blended by a ramp over (high - low)
        return "high_freq_factor", (f"must be greater than low_freq_factor ({params['low_freq_factor']}), "
                                    f"got {params['high_freq_factor']}")
    if rope_type == "yarn":  # the ramp runs from beta_fast's dimension down to beta_slow's
        fast, slow = params.get("beta_fast", YARN_BETA_FAST), params.get("beta_slow", YARN_BETA_SLOW)
        if not fast > slow:
            return "beta_fast", f"must be greater than beta_slow ({slow}), got {fast}"
    return None
