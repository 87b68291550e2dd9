"""The decoder every family's graph is: embed -> N x (attention, MLP or experts, each with its
norms and residual add) -> norm -> lm_head, shaped by ModelConfig (models/blocks.py)."""

from __future__ import annotations

from bessemer.ir import roles
from bessemer.ir.graph import Graph
from bessemer.models.blocks import attention_block, gated_mlp, rms_norm, scale, sparse_moe
from bessemer.models.config import ModelConfig
from bessemer.models.graph_builder import GraphBuilder
from bessemer.models.rope import rope_tables

INV_FREQ = "model.rotary_emb.inv_freq"
# checkpoint module names of a mixture of experts (under layers.{i}.{module}): Qwen2/3-MoE's;
# Mixtral's in models/moe.py
QWEN_MOE_NAMES = {"module": "mlp", "router": "gate", "experts": "experts.{}", "gate": "gate_proj",
                  "up": "up_proj", "down": "down_proj"}


def rope_constants(cfg: ModelConfig) -> tuple[dict, list[dict | None]]:
    """({constant name: inv_freq}, per layer the rope node's inv_freq name and attrs, or None
    where the layer has no RoPE). rope_parameters may be {layer type: params} (Gemma 3)."""
    per_type = isinstance(next(iter(cfg.rope_parameters.values()), None), dict)
    constants, by_type, layers = {}, {}, []
    for i in range(cfg.num_hidden_layers):
        if cfg.no_rope_layers and not cfg.no_rope_layers[i]:
            layers.append(None)
            continue
        kind = cfg.layer_types[i] if per_type else ""
        if kind not in by_type:
            params = cfg.rope_parameters[kind] if per_type else cfg.rope_parameters
            inv, scaling, rotary_dim = rope_tables(params, cfg.head_dim, cfg.max_position_embeddings)
            name = INV_FREQ if not per_type else f"model.rotary_emb.{kind}.inv_freq"
            constants[name] = inv
            by_type[kind] = dict(inv_freq=name, rotary_dim=rotary_dim, attention_scaling=scaling)
        layers.append(by_type[kind])
    return constants, layers


def mlp_block(g: GraphBuilder, cfg: ModelConfig, i: int, x: str, moe_names: dict) -> str:
    if i in cfg.moe_layers:
        return sparse_moe(g, cfg, f"{g.prefix}.layers.{i}.{moe_names.get('module', 'mlp')}", x, moe_names)
    return gated_mlp(g, cfg, f"{g.prefix}.layers.{i}.mlp", x, cfg.intermediate_size)


def decoder_layer(g: GraphBuilder, cfg: ModelConfig, i: int, x: str, rope: dict | None, moe_names: dict) -> str:
    """x: (T, hidden) residual stream in; returns the residual stream out."""
    p, hidden = f"{g.prefix}.layers.{i}", cfg.hidden_size
    residual = cfg.residual_multiplier
    if cfg.norm_placement == "post":  # OLMo2: x + norm(block(x))
        a = rms_norm(g, cfg, f"{p}.post_attention_layernorm", attention_block(g, cfg, i, x, rope), hidden)
        x = g.add(f"{p}.attn_residual", "add", [a, x])
        m = rms_norm(g, cfg, f"{p}.post_feedforward_layernorm", mlp_block(g, cfg, i, x, moe_names), hidden)
        return g.add(f"{p}.mlp_residual", "add", [m, x])
    sandwich = cfg.norm_placement == "sandwich"  # Gemma 3: norms on both sides of each block
    a = attention_block(g, cfg, i, rms_norm(g, cfg, f"{p}.input_layernorm", x, hidden), rope)
    if sandwich:
        a = rms_norm(g, cfg, f"{p}.post_attention_layernorm", a, hidden)
    x = g.add(f"{p}.attn_residual", "add", [scale(g, f"{p}.attn_residual_scale", a, residual), x])
    h = rms_norm(g, cfg, f"{p}.pre_feedforward_layernorm" if sandwich else f"{p}.post_attention_layernorm", x, hidden)
    m = mlp_block(g, cfg, i, h, moe_names)
    if sandwich:
        m = rms_norm(g, cfg, f"{p}.post_feedforward_layernorm", m, hidden)
    return g.add(f"{p}.mlp_residual", "add", [scale(g, f"{p}.mlp_residual_scale", m, residual), x])


def decoder_graph(cfg: ModelConfig, weight_shapes: dict, packed: dict | None = None, prefix: str = "model",
                  ignored: dict[str, str] | None = None, moe_names: dict | None = None) -> Graph:
    """packed: the checkpoint's packing table (GraphBuilder.packed); prefix: the decoder's module
    path; ignored: checkpoint tensors the graph may leave unread (pattern -> why)."""
    constants, ropes = rope_constants(cfg)
    shapes = dict(weight_shapes, **{name: tuple(c.shape) for name, c in constants.items()})
    g = GraphBuilder(shapes, packed or {}, prefix)
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    table = f"{prefix}.embed_tokens.weight"
    x = g.add(f"{prefix}.embed_tokens", "embedding", [], weights=[g.weight(table, (vocab, hidden))])
    x = scale(g, f"{prefix}.embed_scale", x, cfg.embedding_multiplier)
    for i in range(cfg.num_hidden_layers):
        x = decoder_layer(g, cfg, i, x, ropes[i], moe_names or QWEN_MOE_NAMES)
    # Only the rows whose logits are wanted go through the final norm and lm_head.
    x = g.add(f"{prefix}.logits_rows", "gather_rows", [x])
    x = rms_norm(g, cfg, f"{prefix}.norm", x, hidden)
    # Granite divides the logits by logits_scaling: done on lm_head's input, so that lm_head
    # stays the node producing the logits (its own quantization scheme, vocab split)
    x = scale(g, "logits_scaling", x, 1.0 / cfg.logits_scaling)
    head_module = "lm_head" if prefix == "model" else f"{prefix.rsplit('.', 1)[0]}.lm_head"
    head = table if cfg.tie_word_embeddings else f"{head_module}.weight"
    logits = g.add(head_module, "linear", [x], weights=[g.weight(head, (vocab, hidden))], role=roles.LOGITS)
    return g.finish(cfg, logits, constants, weight_shapes, ignored)

