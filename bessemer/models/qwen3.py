"""Qwen3ForCausalLM: Qwen2's windows without its biases (attention_bias covers q/k/v/o), and
each head of q and k RMS-normalised before RoPE (q_norm, k_norm: one (head_dim,) weight)."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.config import ModelConfig, layer_windows
from bessemer.models.decoder import decoder_graph
from bessemer.models.qwen2 import WINDOW_FIELDS


def config_from_hf(hf: dict, understood: tuple[str, ...] = (), **overrides) -> ModelConfig:
    return llama.config_from_hf(hf, WINDOW_FIELDS + understood, qk_norm="per_head", mlp_bias=False,
                                sliding_windows=layer_windows(hf), **overrides)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
