"""SmolLM3ForCausalLM: a Llama graph in which every no_rope_layer_interval-th layer has no
RoPE (HF's no_rope_layers: 1 = rotates, 0 = NoPE), with Qwen-style optional windows."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig, layer_windows
from bessemer.models.qwen2 import WINDOW_FIELDS


def config_from_hf(hf: dict) -> ModelConfig:
    n = hf["num_hidden_layers"]
    interval = hf.get("no_rope_layer_interval", 4)
    no_rope = hf.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    return llama.config_from_hf(hf, WINDOW_FIELDS + ("no_rope_layers",), sliding_windows=layer_windows(hf),
                                no_rope_layers=tuple(int(v) for v in no_rope))


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
