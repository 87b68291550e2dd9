"""Gemma3ForCausalLM and the text part of Gemma3ForConditionalGeneration checkpoints.

RMSNorms with weight offset 1 (x * (1 + w)) on both sides of each block, q/k normalised per
head, GELU-tanh gated MLP, embeddings times sqrt(hidden_size) (tied lm_head unscaled),
softmax scale query_pre_attn_scalar ** -0.5, and interleaved local sliding-window layers
and global layers, each kind with its own RoPE (rope_parameters per layer type). The vision
tower of a multimodal checkpoint is not built; its tensors are named as ignored.
"""

from __future__ import annotations

import math

from bessemer.ir.graph import Graph
from bessemer.errors import UnsupportedModelError
from bessemer.models import llama
from bessemer.models.config import ModelConfig, rope_parameters_from_hf
from bessemer.models.decoder import decoder_graph

MULTIMODAL = "Gemma3ForConditionalGeneration"
VISION = {r"^vision_tower\.": "the vision tower (only the text model is built)",
          r"^multi_modal_projector\.": "the image projector (only the text model is built)"}


def _rope_by_layer_type(text: dict) -> dict:
    params = text.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        return {kind: rope_parameters_from_hf({**text, "rope_parameters": sub}) for kind, sub in params.items()}
    # older configs: rope_theta (+ rope_scaling) for global layers, rope_local_base_freq for local ones
    return {"full_attention": rope_parameters_from_hf(text),
            "sliding_attention": rope_parameters_from_hf({"rope_theta": text.get("rope_local_base_freq", 10000.0)})}


def config_from_hf(hf: dict) -> ModelConfig:
    text = dict(hf["text_config"], architectures=hf["architectures"]) if hf["architectures"][0] == MULTIMODAL else hf
    act = text.get("hidden_activation") or text.get("hidden_act") or "gelu_pytorch_tanh"
    if act != "gelu_pytorch_tanh":
        raise UnsupportedModelError(f"hidden_activation {act!r} is not supported for Gemma 3 (gelu_pytorch_tanh)")
    n = text["num_hidden_layers"]
    types = tuple(text.get("layer_types") or [
        "sliding_attention" if (i + 1) % text.get("sliding_window_pattern", 6) else "full_attention" for i in range(n)])
    window = int(text.get("sliding_window") or 0)
    tie = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", True))
    return llama.config_from_hf(
        {**text, "rope_parameters": None, "rope_scaling": None, "hidden_act": "silu"},  # both handled here
        ("query_pre_attn_scalar", "sliding_window", "layer_types", "sliding_window_pattern"),
        hidden_act=act, qk_norm="per_head", norm_placement="sandwich", norm_weight_offset=1.0,
        layer_types=types, rope_parameters=_rope_by_layer_type(text),
        sliding_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        embedding_multiplier=math.sqrt(text["hidden_size"]), tie_word_embeddings=bool(tie),
        attention_multiplier=float(text.get("query_pre_attn_scalar") or text["head_dim"]) ** -0.5,
        o_proj_bias=bool(text.get("attention_bias", False)), mlp_bias=False)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    if cfg.architecture == MULTIMODAL:
        return decoder_graph(cfg, weight_shapes, prefix="language_model.model", ignored=VISION)
    return decoder_graph(cfg, weight_shapes)
