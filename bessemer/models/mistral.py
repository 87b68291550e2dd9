"""MistralForCausalLM: a Llama graph with sliding-window attention on every layer."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig


def config_from_hf(hf: dict) -> ModelConfig:
    window = int(hf.get("sliding_window") or 0)
    return llama.config_from_hf(hf, ("sliding_window",), sliding_windows=(window,) * hf["num_hidden_layers"],
                                attention_bias=False, o_proj_bias=False, mlp_bias=False)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
