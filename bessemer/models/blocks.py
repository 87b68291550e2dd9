"""Shared building blocks: every decoder family builds its graph from these.

Families differ by config (biases, tied embeddings, RoPE variant, sliding windows, q/k norms,
norm placement, multipliers, experts), never by forked copies of this code. Node names are HF
module paths; weights are HF tensor names, or row ranges of one (a checkpoint that stores
q/k/v or gate/up packed in one tensor gives a packing table: the linears stay separate and
the fusion passes re-fuse them). Each linear gets its role here (ir/roles.py: how tensor
parallelism splits it, which fusion group it joins), so passes never infer structure from
module names.
"""

from __future__ import annotations

from bessemer.ir import roles
from bessemer.models.config import ModelConfig
from bessemer.models.graph_builder import GraphBuilder
from bessemer.plugins.ops import moe_weight_shapes

# the activations of a gated MLP (HF hidden_act / hidden_activation) -> the op computing act(gate) * up
GATED_ACTS = {"silu": "silu_mul", "swish": "silu_mul", "gelu_pytorch_tanh": "gelu_tanh_mul"}


def rms_norm(g: GraphBuilder, cfg: ModelConfig, name: str, x: str, width: int) -> str:
    return g.add(name, "rms_norm", [x], weights=[g.weight(f"{name}.weight", (width,))], eps=cfg.rms_norm_eps,
                 weight_offset=cfg.norm_weight_offset)


def scale(g: GraphBuilder, name: str, x: str, factor: float) -> str:
    """x * factor; nothing when the factor is 1 (the graph of a family without multipliers)."""
    return x if factor == 1.0 else g.add(name, "scale", [x], factor=float(factor))


def linear(g: GraphBuilder, name: str, x: str, out_features: int, in_features: int, bias: bool,
           role: roles.LinearRole) -> str:
    return g.add(name, "linear", [x], role=role, weights=[
        g.weight(f"{name}.weight", (out_features, in_features)),
        g.weight(f"{name}.bias", (out_features,), optional=not bias)])


def _qk_norms(g: GraphBuilder, cfg: ModelConfig, p: str, q: str, k: str) -> tuple[str, str]:
    d, hq, hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    if cfg.qk_norm == "full":  # OLMo2: one norm across all heads
        return rms_norm(g, cfg, f"{p}.q_norm", q, hq * d), rms_norm(g, cfg, f"{p}.k_norm", k, hkv * d)
    if cfg.qk_norm == "per_head":  # Qwen3, Gemma 3: each head normalised, one weight for all
        out = []
        for name, x, heads, kv in (("q_norm", q, hq, 0), ("k_norm", k, hkv, 1)):
            out.append(g.add(f"{p}.{name}", "rms_norm_heads", [x], weights=[g.weight(f"{p}.{name}.weight", (d,))],
                             num_heads=heads, head_dim=d, eps=cfg.rms_norm_eps, weight_offset=cfg.norm_weight_offset,
                             kv_heads=kv))
        return out[0], out[1]
    return q, k


def attention_block(g: GraphBuilder, cfg: ModelConfig, layer: int, x: str, rope: dict | None) -> str:
    """rope: {"inv_freq": constant name, attrs...} of this layer, or None (a NoPE layer)."""
    p = f"{g.prefix}.layers.{layer}.self_attn"
    hidden, d = cfg.hidden_size, cfg.head_dim
    hq, hkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    qkv = roles.Fusion(roles.QKV, f"{p}.qkv_proj")
    # a norm across all heads needs every head's q/k on every tensor-parallel rank
    q_shard, k_shard = (roles.WHOLE, roles.WHOLE) if cfg.qk_norm == "full" else (roles.QUERY_HEADS, roles.KV_HEADS)
    q = linear(g, f"{p}.q_proj", x, hq, hidden, cfg.attention_bias, roles.column(q_shard, qkv))
    k = linear(g, f"{p}.k_proj", x, hkv, hidden, cfg.attention_bias, roles.column(k_shard, qkv))
    v = linear(g, f"{p}.v_proj", x, hkv, hidden, cfg.attention_bias, roles.column(roles.KV_HEADS, qkv))
    q, k = _qk_norms(g, cfg, p, q, k)
    heads = dict(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                 head_dim=cfg.head_dim)
    if rope is not None:
        inv_freq = rope["inv_freq"]
        q, k = g.add(f"{p}.rotary_emb", "rope", [q, k], [f"{p}.q_rot", f"{p}.k_rot"],
                     [g.weight(inv_freq, g.weight_shapes[inv_freq])], **heads,
                     **{a: v for a, v in rope.items() if a != "inv_freq"})
    softmax_scale = cfg.attention_multiplier if cfg.attention_multiplier is not None else cfg.head_dim ** -0.5
    sinks = [g.weight(f"{p}.sinks", (cfg.num_attention_heads,))] if cfg.attention_sinks else []
    o = g.add(f"{p}.attn", "attention_sinks" if sinks else "attention", [q, k, v], weights=sinks, layer=layer,
              scale=softmax_scale, sliding_window=cfg.sliding_windows[layer] if cfg.sliding_windows else 0, **heads)
    return linear(g, f"{p}.o_proj", o, hidden, cfg.num_attention_heads * d, cfg.o_proj_bias,
                  roles.row(roles.QUERY_HEADS))


def gated_mlp(g: GraphBuilder, cfg: ModelConfig, p: str, x: str, inter: int) -> str:
    """down(act(gate(x)) * up(x)) of the MLP at module path p, intermediate size inter."""
    hidden = cfg.hidden_size
    gate_up = roles.Fusion(roles.GATE_UP, f"{p}.gate_up_proj")
    gate = linear(g, f"{p}.gate_proj", x, inter, hidden, cfg.mlp_bias, roles.column(roles.FEATURES, gate_up))
    up = linear(g, f"{p}.up_proj", x, inter, hidden, cfg.mlp_bias, roles.column(roles.FEATURES, gate_up))
    h = g.add(f"{p}.act_fn", GATED_ACTS[cfg.hidden_act], [gate, up])
    return linear(g, f"{p}.down_proj", h, hidden, inter, cfg.mlp_bias, roles.row(roles.FEATURES))


def sparse_moe(g: GraphBuilder, cfg: ModelConfig, p: str, x: str, names: dict) -> str:
    """The top-k mixture of experts at module path p (plus Qwen2-MoE's gated shared expert).
    names: the checkpoint's module names (router, per-expert path template and gate/up/down
    names), or "stacked": the experts' tensors stored stacked, gpt-oss style."""
    hidden, n, inter = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    logits = linear(g, f"{p}.{names['router']}", x, n, hidden, cfg.moe_bias, roles.column(roles.WHOLE))
    attrs = dict(num_experts=n, top_k=cfg.num_experts_per_tok, expert_size=inter,
                 softmax_after_topk=int(cfg.moe_routing == "topk_softmax"), norm_topk_prob=int(cfg.norm_topk_prob),
                 activation=int(cfg.moe_activation == "swiglu_oai"))
    if names.get("stacked"):
        attrs["layout"] = 1
        e = f"{p}.experts"
        shapes = moe_weight_shapes(attrs, hidden)
        weights = [g.weight(name, shape) for name, shape in zip(
            (f"{e}.gate_up_proj", f"{e}.down_proj", f"{e}.gate_up_proj_bias", f"{e}.down_proj_bias"), shapes)]
    else:
        expert = [f"{p}.{names['experts'].format(e)}" for e in range(n)]
        weights = [g.stacked(f"{p}.experts.gate_up_proj.weight",
                             [f"{m}.{names[w]}.weight" for m in expert for w in ("gate", "up")], (n * 2 * inter, hidden)),
                   g.stacked(f"{p}.experts.down_proj.weight", [f"{m}.{names['down']}.weight" for m in expert],
                             (n * hidden, inter))]
    y = g.add(f"{p}.experts", "moe", [x, logits], weights=weights, **attrs)
    if not cfg.shared_expert_intermediate_size:
        return y
    shared = gated_mlp(g, cfg, f"{p}.shared_expert", x, cfg.shared_expert_intermediate_size)
    gate = linear(g, f"{p}.shared_expert_gate", x, 1, hidden, False, roles.column(roles.WHOLE))
    shared = g.add(f"{p}.shared_expert_gated", "sigmoid_gate_mul", [shared, gate])
    return g.add(f"{p}.shared_expert_add", "add", [y, shared])
