"""Phi3ForCausalLM (Phi-3, Phi-3.5, Phi-4, Phi-4-mini): Llama maths with q/k/v packed in one
qkv_proj tensor and gate/up in one gate_up_proj tensor, a window on every layer when
sliding_window is set, partial rotary dims and longrope scaling ("su", "yarn" are its old names).

The packed tensors are read as row ranges (GraphBuilder.packed): the graph has the usual
q/k/v and gate/up linears, which the fusion passes fuse back into one GEMM each.
"""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.decoder import decoder_graph
from bessemer.models.config import ModelConfig, rope_parameters_from_hf


def config_from_hf(hf: dict) -> ModelConfig:
    rope = rope_parameters_from_hf(hf)
    if rope["rope_type"] in ("su", "yarn"):  # as transformers' Phi3Config
        rope = rope_parameters_from_hf({**hf, "rope_parameters": {**rope, "rope_type": "longrope"}})
    window = int(hf.get("sliding_window") or 0)
    return llama.config_from_hf(hf, ("sliding_window",), rope_parameters=rope, attention_bias=False,
                                o_proj_bias=False, mlp_bias=False,
                                sliding_windows=(window,) * hf["num_hidden_layers"])


def packing(cfg: ModelConfig) -> dict:
    """Where each projection's rows sit in the packed checkpoint tensors."""
    d, inter = cfg.head_dim, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    table = {}
    for i in range(cfg.num_hidden_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        for name, start, rows in (("q", 0, q), ("k", q, kv), ("v", q + kv, kv)):
            table[f"{a}.{name}_proj.weight"] = (f"{a}.qkv_proj.weight", start, rows)
        table[f"{m}.gate_proj.weight"] = (f"{m}.gate_up_proj.weight", 0, inter)
        table[f"{m}.up_proj.weight"] = (f"{m}.gate_up_proj.weight", inter, inter)
    return table


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes, packing(cfg))
