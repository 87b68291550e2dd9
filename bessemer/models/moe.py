"""Mixture-of-experts families: MixtralForCausalLM, Qwen2MoeForCausalLM (with a gated shared
expert), Qwen3MoeForCausalLM (Qwen3 attention). Top-k routing after a softmax over all
experts (renormalised: Mixtral always, Qwen when norm_topk_prob); the `moe` op reads only
the routed experts' weights."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama, qwen3
from bessemer.models.config import ModelConfig, layer_windows
from bessemer.models.decoder import QWEN_MOE_NAMES, decoder_graph
from bessemer.models.qwen2 import WINDOW_FIELDS

MIXTRAL_NAMES = {"module": "block_sparse_moe", "router": "gate", "experts": "experts.{}", "gate": "w1",
                 "up": "w3", "down": "w2"}


def _sparse_layers(hf: dict) -> tuple[int, ...]:
    """Qwen-MoE: layers not in mlp_only_layers, every decoder_sparse_step-th."""
    step, dense = hf.get("decoder_sparse_step", 1) or 1, set(hf.get("mlp_only_layers") or ())
    return tuple(i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0)


def config_from_hf(hf: dict) -> ModelConfig:
    arch = hf["architectures"][0]
    n = hf["num_hidden_layers"]
    if arch == "MixtralForCausalLM":
        window = int(hf.get("sliding_window") or 0)
        return llama.config_from_hf(
            hf, ("num_local_experts", "sliding_window"), attention_bias=False, o_proj_bias=False, mlp_bias=False,
            sliding_windows=(window,) * n, num_experts=hf["num_local_experts"],
            num_experts_per_tok=hf["num_experts_per_tok"], moe_intermediate_size=hf["intermediate_size"],
            norm_topk_prob=True, moe_layers=tuple(range(n)))
    experts = dict(num_experts=hf.get("num_experts") or hf["num_local_experts"], num_experts_per_tok=hf["num_experts_per_tok"],
                   moe_intermediate_size=hf["moe_intermediate_size"],
                   norm_topk_prob=bool(hf.get("norm_topk_prob", False)), moe_layers=_sparse_layers(hf))
    if arch == "Qwen3MoeForCausalLM":
        return qwen3.config_from_hf(hf, ("num_experts", "num_local_experts"), **experts)
    return llama.config_from_hf(  # Qwen2-MoE: Qwen2 attention (q/k/v biases)
        hf, WINDOW_FIELDS + ("num_experts",), attention_bias=True, o_proj_bias=False, mlp_bias=False,
        sliding_windows=layer_windows(hf), shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0),
        **experts)


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    names = MIXTRAL_NAMES if cfg.architecture == "MixtralForCausalLM" else QWEN_MOE_NAMES
    return decoder_graph(cfg, weight_shapes, moe_names=names)
