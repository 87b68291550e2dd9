"""Qwen2ForCausalLM: a Llama graph with biases on q/k/v (not o_proj) and per-layer windows.
SeedOssForCausalLM is the same maths with its own bias switches (models/seed_oss.py)."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig, layer_windows

WINDOW_FIELDS = ("sliding_window", "use_sliding_window", "layer_types")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, WINDOW_FIELDS, attention_bias=True, o_proj_bias=False, mlp_bias=False,
                                sliding_windows=layer_windows(hf))


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
