"""GraniteForCausalLM: Llama maths with four multipliers: embeddings times
embedding_multiplier, each block's output times residual_multiplier before its residual add,
attention_multiplier as the softmax scale, and logits divided by logits_scaling."""

from __future__ import annotations

from bessemer.ir.graph import Graph
from bessemer.models import llama
from bessemer.models.config import ModelConfig
from bessemer.models.decoder import decoder_graph

MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def config_from_hf(hf: dict) -> ModelConfig:
    return llama.config_from_hf(hf, MULTIPLIERS, **{m: float(hf.get(m, 1.0)) for m in MULTIPLIERS})


def build_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    return decoder_graph(cfg, weight_shapes)
