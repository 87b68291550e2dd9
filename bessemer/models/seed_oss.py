"""SeedOssForCausalLM (ByteDance Seed-OSS): Llama maths with separate bias switches for
q/k/v (attention_bias), o_proj (attention_out_bias) and the MLP (mlp_bias)."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, o_proj_bias=bool(hf.get("attention_out_bias", False)))


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
