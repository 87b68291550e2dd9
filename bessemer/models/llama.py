"""LlamaForCausalLM: Llama 1/2/3 (incl. llama3 RoPE scaling), TinyLlama, SmolLM, SmolLM2."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.errors import UnsupportedModelError
from bessemer.models.decoder import decoder_graph
from bessemer.models.checks import check_math_fields
from bessemer.models.config import ModelConfig, eos_ids, rope_parameters_from_hf


def config_from_hf(hf: dict, understood: tuple[str, ...] = (), **overrides) -> ModelConfig:
    """understood: the maths-changing config fields (models/checks.py) the calling family
    implements through `overrides`; Llama itself implements none."""
    check_math_fields(hf, understood)
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported (only silu gated MLPs)")
    heads = hf["num_attention_heads"]
    num_layers = hf["num_hidden_layers"]
    fields = dict(
        architecture=hf["architectures"][0], model_type=hf.get("model_type", "llama"),
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_hidden_layers=num_layers,
        num_attention_heads=heads, num_key_value_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
        rope_parameters=rope_parameters_from_hf(hf),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
        o_proj_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        sliding_windows=(0,) * num_layers,
        bos_token_id=hf.get("bos_token_id"), eos_token_id=eos_ids(hf),
    )
    fields.update(overrides)
    return ModelConfig(**fields)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
