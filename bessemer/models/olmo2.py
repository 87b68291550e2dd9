"""Olmo2ForCausalLM: q and k each normalised by one RMSNorm across all heads before RoPE,
and norms on each block's output (x + norm(attention(x)), x + norm(mlp(x))), none on its input."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, qk_norm="full", norm_placement="post", mlp_bias=False)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
