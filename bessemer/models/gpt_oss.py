"""GptOssForCausalLM: attention with a learned sink logit per head and biases on q/k/v/o,
alternating sliding-window and full layers, yarn RoPE, and a mixture of experts routed by a
softmax over the top-k router logits, whose experts (stacked tensors, gate/up interleaved)
apply gpt-oss's clamped swiglu. Experts stored in MXFP4 (`*_blocks`, `*_scales`) are read
dequantized (builder/checkpoint.py); when the config says so (quantization_config's
quant_method "mxfp4", as the released checkpoints do) the moe nodes get attr mxfp4_experts,
and a target with an MXFP4 expert kernel keeps them in MXFP4 (targets/cpu/lowering.py)."""

from __future__ import annotations

from dataclasses import replace

from bessemer.ir.graph import Graph
from bessemer.errors import UnsupportedModelError
from bessemer.models import llama
from bessemer.models.config import ModelConfig
from bessemer.models.decoder import decoder_graph

NAMES = {"module": "mlp", "router": "router", "stacked": True}


def config_from_hf(hf: dict) -> ModelConfig:
    if (hf.get("swiglu_alpha", 1.702), hf.get("swiglu_limit", 7.0)) != (1.702, 7.0):
        raise UnsupportedModelError(f"swiglu_alpha {hf.get('swiglu_alpha')} / swiglu_limit {hf.get('swiglu_limit')}: "
                                    "only gpt-oss's 1.702 / 7.0 are implemented")
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
    window = int(hf.get("sliding_window") or 0)
    return llama.config_from_hf(
        hf, ("num_local_experts", "sliding_window", "layer_types"), attention_bias=bool(hf.get("attention_bias", True)),
        o_proj_bias=bool(hf.get("attention_bias", True)), mlp_bias=False,
        sliding_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        num_experts=hf["num_local_experts"], num_experts_per_tok=hf["num_experts_per_tok"],
        moe_intermediate_size=hf["intermediate_size"], moe_layers=tuple(range(n)), moe_routing="topk_softmax",
        moe_activation="swiglu_oai", moe_bias=True, attention_sinks=True,
        extra={"mxfp4_experts": (hf.get("quantization_config") or {}).get("quant_method") == "mxfp4"})


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    graph = decoder_graph(cfg, weight_shapes, moe_names=NAMES)
    if not cfg.extra.get("mxfp4_experts"):
        return graph
    return replace(graph, nodes=tuple(replace(n, attrs=dict(n.attrs, mxfp4_experts=1)) if n.op == "moe" else n
                                      for n in graph.nodes), values={})
