"""Shared building blocks: every Llama-like family builds its graph from these.

Families differ by config (biases, tied embeddings, RoPE variant, sliding windows), never
by forked copies of this code. Node names are HF module paths; weights are HF tensor names.
Each linear gets its role here (builder/roles.py: how tensor parallelism splits it, which
fusion group it joins), so passes never infer structure from module names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.builder import roles
from bessemer.builder.graph import Graph, Node, WeightRef, verify
from bessemer.models.config import ModelConfig
from bessemer.models.rope import rope_tables

INV_FREQ = "model.rotary_emb.inv_freq"


@dataclass
class GraphBuilder:
    """Accumulates nodes while a family's build_graph runs; local to one build."""

    weight_shapes: dict
    nodes: list = field(default_factory=list)

    def weight(self, name: str, shape: tuple[int, ...], optional: bool = False) -> WeightRef | None:
        """The checkpoint tensor `name`, which must have the shape the config implies."""
        if name not in self.weight_shapes:
            if optional:
                return None
            raise KeyError(f"tensor {name} is missing")
        if tuple(self.weight_shapes[name]) != tuple(shape):
            raise KeyError(f"tensor {name} has shape {tuple(self.weight_shapes[name])}, the config implies {tuple(shape)}")
        return WeightRef.single(name, self.weight_shapes[name])

    def add(self, name: str, op: str, inputs: list[str], outputs: list[str] | None = None,
            weights: list = (), role: roles.LinearRole | None = None, **attrs) -> str | tuple[str, ...]:
        outputs = outputs or [name]
        while weights and weights[-1] is None:  # drop absent optional weights
            weights = weights[:-1]
        self.nodes.append(Node(name, op, tuple(inputs), tuple(outputs), tuple(weights), attrs, role))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def rms_norm(g: GraphBuilder, name: str, x: str, eps: float, width: int) -> str:
    return g.add(name, "rms_norm", [x], weights=[g.weight(f"{name}.weight", (width,))], eps=eps,
                 weight_offset=0.0)


def linear(g: GraphBuilder, name: str, x: str, out_features: int, in_features: int, bias: bool,
           role: roles.LinearRole) -> str:
    return g.add(name, "linear", [x], role=role, weights=[
        g.weight(f"{name}.weight", (out_features, in_features)),
        g.weight(f"{name}.bias", (out_features,), optional=not bias)])


def attention_block(g: GraphBuilder, cfg: ModelConfig, layer: int, x: str, rope_attrs: dict) -> str:
    p = f"model.layers.{layer}.self_attn"
    hidden, d = cfg.hidden_size, cfg.head_dim
    qkv = roles.Fusion(roles.QKV, f"{p}.qkv_proj")
    q = linear(g, f"{p}.q_proj", x, cfg.num_attention_heads * d, hidden, cfg.attention_bias,
               roles.column(roles.QUERY_HEADS, qkv))
    k = linear(g, f"{p}.k_proj", x, cfg.num_key_value_heads * d, hidden, cfg.attention_bias,
               roles.column(roles.KV_HEADS, qkv))
    v = linear(g, f"{p}.v_proj", x, cfg.num_key_value_heads * d, hidden, cfg.attention_bias,
               roles.column(roles.KV_HEADS, qkv))
    heads = dict(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                 head_dim=cfg.head_dim)
    q, k = g.add(f"{p}.rotary_emb", "rope", [q, k], [f"{p}.q_rot", f"{p}.k_rot"],
                 [g.weight(INV_FREQ, g.weight_shapes[INV_FREQ])], **heads, **rope_attrs)
    o = g.add(f"{p}.attn", "attention", [q, k, v], layer=layer, scale=cfg.head_dim ** -0.5,
              sliding_window=cfg.sliding_windows[layer] if cfg.sliding_windows else 0, **heads)
    return linear(g, f"{p}.o_proj", o, hidden, cfg.num_attention_heads * d, cfg.o_proj_bias,
                  roles.row(roles.QUERY_HEADS))


def gated_mlp(g: GraphBuilder, cfg: ModelConfig, layer: int, x: str) -> str:
    p = f"model.layers.{layer}.mlp"
    hidden, inter = cfg.hidden_size, cfg.intermediate_size
    gate_up = roles.Fusion(roles.GATE_UP, f"{p}.gate_up_proj")
    gate = linear(g, f"{p}.gate_proj", x, inter, hidden, cfg.mlp_bias, roles.column(roles.FEATURES, gate_up))
    up = linear(g, f"{p}.up_proj", x, inter, hidden, cfg.mlp_bias, roles.column(roles.FEATURES, gate_up))
    h = g.add(f"{p}.act_fn", "silu_mul", [gate, up])
    return linear(g, f"{p}.down_proj", h, hidden, inter, cfg.mlp_bias, roles.row(roles.FEATURES))


def decoder_graph(cfg: ModelConfig, weight_shapes: dict) -> Graph:
    """Pre-norm decoder: embed -> N x (norm, attention, add, norm, gated MLP, add) -> norm -> lm_head."""
    inv_freq, scaling, rotary_dim = rope_tables(cfg.rope_parameters, cfg.head_dim)
    shapes = dict(weight_shapes, **{INV_FREQ: tuple(inv_freq.shape)})
    g = GraphBuilder(shapes)
    rope_attrs = dict(rotary_dim=rotary_dim, attention_scaling=scaling)
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    x = g.add("model.embed_tokens", "embedding", [],
              weights=[g.weight("model.embed_tokens.weight", (vocab, hidden))])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}"
        h = rms_norm(g, f"{p}.input_layernorm", x, cfg.rms_norm_eps, hidden)
        a = attention_block(g, cfg, i, h, rope_attrs)
        x = g.add(f"{p}.attn_residual", "add", [a, x])
        h = rms_norm(g, f"{p}.post_attention_layernorm", x, cfg.rms_norm_eps, hidden)
        m = gated_mlp(g, cfg, i, h)
        x = g.add(f"{p}.mlp_residual", "add", [m, x])
    # Only the rows whose logits are wanted go through the final norm and lm_head.
    x = g.add("model.logits_rows", "gather_rows", [x])
    x = rms_norm(g, "model.norm", x, cfg.rms_norm_eps, hidden)
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    logits = g.add("lm_head", "linear", [x], weights=[g.weight(head, (vocab, hidden))], role=roles.LOGITS)
    return verify(Graph(tuple(g.nodes), logits, constants={INV_FREQ: inv_freq}, weight_shapes=shapes))
