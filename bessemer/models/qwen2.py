"""Qwen2ForCausalLM: a Llama graph with biases on q/k/v (not o_proj) and per-layer windows."""

from __future__ import annotations

from bessemer.builder.graph import Graph
from bessemer.models import llama
from bessemer.models.blocks import decoder_graph
from bessemer.models.config import ModelConfig


def _sliding_windows(hf: dict) -> tuple[int, ...]:
    """Qwen2 windows only the layers that `layer_types` (or max_window_layers) mark sliding."""
    n = hf["num_hidden_layers"]
    window = int(hf.get("sliding_window") or 0)
    if not hf.get("use_sliding_window") or not window:
        return (0,) * n
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= hf.get("max_window_layers", n) else "full_attention"
        for i in range(n)]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, attention_bias=True, o_proj_bias=False, mlp_bias=False,
                                sliding_windows=_sliding_windows(hf))


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
