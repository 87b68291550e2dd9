"""Shared building blocks: every Llama-like family builds its graph from these.

Families differ by config (biases, tied embeddings, RoPE variant, sliding windows, q/k norms,
norm placement), never by forked copies of this code. Node names are HF module paths; weights
are HF tensor names, or row ranges of one (a checkpoint that stores q/k/v or gate/up packed in
one tensor gives a packing table: the linears stay separate and the fusion passes re-fuse them).
Each linear gets its role here (builder/roles.py: how tensor parallelism splits it, which
fusion group it joins), so passes never infer structure from module names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.builder import roles
from bessemer.builder.graph import Graph, Node, WeightRef, verify
from bessemer.models.checks import check_tensors_used
from bessemer.models.config import ModelConfig
from bessemer.models.rope import rope_tables

INV_FREQ = "model.rotary_emb.inv_freq"


@dataclass
class GraphBuilder:
    """Accumulates nodes while a family's build_graph runs; local to one build."""

    weight_shapes: dict
    # packing table: a name the graph uses -> (checkpoint tensor, first row, row count)
    packed: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)

    def weight(self, name: str, shape: tuple[int, ...], optional: bool = False) -> WeightRef | None:
        """The checkpoint tensor `name` (or its rows in a packed tensor), which must have the
        shape the config implies."""
        if name in self.packed:
            return self._packed_rows(name, shape)
        if name not in self.weight_shapes:
            if optional:
                return None
            raise KeyError(f"tensor {name} is missing")
        if tuple(self.weight_shapes[name]) != tuple(shape):
            raise KeyError(f"tensor {name} has shape {tuple(self.weight_shapes[name])}, the config implies {tuple(shape)}")
        return WeightRef.single(name, self.weight_shapes[name])

    def _packed_rows(self, name: str, shape: tuple[int, ...]) -> WeightRef:
        tensor, start, rows = self.packed[name]
        full = self.weight_shapes.get(tensor)
        if full is None:
            raise KeyError(f"tensor {tensor} is missing")
        if tuple(full[1:]) != tuple(shape[1:]) or rows != shape[0] or start + rows > full[0]:
            raise KeyError(f"tensor {tensor} has shape {tuple(full)}, the config implies rows "
                           f"[{start}, {start + rows}) of width {tuple(shape[1:])} for {name}")
        cols = full[1] if len(full) > 1 else 0
        return WeightRef(name, (tensor,), tuple(shape), slices=((start, start + rows, 0, cols),))

    def add(self, name: str, op: str, inputs: list[str], outputs: list[str] | None = None,
            weights: list = (), role: roles.LinearRole | None = None, **attrs) -> str | tuple[str, ...]:
        outputs = outputs or [name]
        while weights and weights[-1] is None:  # drop absent optional weights
            weights = weights[:-1]
        self.nodes.append(Node(name, op, tuple(inputs), tuple(outputs), tuple(weights), attrs, role))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def finish(self, cfg: ModelConfig, output: str, constants: dict, checkpoint: dict,
               ignored: dict[str, str] | None = None) -> Graph:
        """The verified graph, once every tensor of `checkpoint` (name -> shape) is read by a
        node or explained by `ignored` (pattern -> why; models/checks.py)."""
        consumed = {p for n in self.nodes for w in n.weights if w is not None for p in w.parts}
        if cfg.tie_word_embeddings:  # HF ties lm_head to the embedding whatever the file holds
            ignored = {r"^lm_head\.weight$": "tied to the embedding", **(ignored or {})}
        check_tensors_used(consumed, checkpoint, cfg.architecture, ignored)
        return verify(Graph(tuple(self.nodes), output, constants=constants, weight_shapes=self.weight_shapes))


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
    hq, hkv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    qkv = roles.Fusion(roles.QKV, f"{p}.qkv_proj")
    # a norm across all heads needs every head's q/k on every tensor-parallel rank
    q_shard, k_shard = (roles.WHOLE, roles.WHOLE) if cfg.qk_norm == "full" else (roles.QUERY_HEADS, roles.KV_HEADS)
    q = linear(g, f"{p}.q_proj", x, hq, hidden, cfg.attention_bias, roles.column(q_shard, qkv))
    k = linear(g, f"{p}.k_proj", x, hkv, hidden, cfg.attention_bias, roles.column(k_shard, qkv))
    v = linear(g, f"{p}.v_proj", x, hkv, hidden, cfg.attention_bias, roles.column(roles.KV_HEADS, qkv))
    if cfg.qk_norm == "full":
        q = rms_norm(g, f"{p}.q_norm", q, cfg.rms_norm_eps, hq)
        k = rms_norm(g, f"{p}.k_norm", k, cfg.rms_norm_eps, hkv)
    heads = dict(num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
                 head_dim=cfg.head_dim)
    if not cfg.no_rope_layers or cfg.no_rope_layers[layer]:
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


def decoder_layer(g: GraphBuilder, cfg: ModelConfig, i: int, x: str, rope_attrs: dict) -> str:
    """x: (T, hidden) residual stream in; returns the residual stream out."""
    p, eps, hidden = f"model.layers.{i}", cfg.rms_norm_eps, cfg.hidden_size
    if cfg.norm_placement == "post":  # OLMo2: x + norm(block(x))
        a = rms_norm(g, f"{p}.post_attention_layernorm", attention_block(g, cfg, i, x, rope_attrs), eps, hidden)
        x = g.add(f"{p}.attn_residual", "add", [a, x])
        m = rms_norm(g, f"{p}.post_feedforward_layernorm", gated_mlp(g, cfg, i, x), eps, hidden)
        return g.add(f"{p}.mlp_residual", "add", [m, x])
    h = rms_norm(g, f"{p}.input_layernorm", x, eps, hidden)
    a = attention_block(g, cfg, i, h, rope_attrs)
    x = g.add(f"{p}.attn_residual", "add", [a, x])
    h = rms_norm(g, f"{p}.post_attention_layernorm", x, eps, hidden)
    m = gated_mlp(g, cfg, i, h)
    return g.add(f"{p}.mlp_residual", "add", [m, x])


def decoder_graph(cfg: ModelConfig, weight_shapes: dict, packed: dict | None = None) -> Graph:
    """Decoder: embed -> N x (attention, gated MLP, each with its norm and residual add) -> norm
    -> lm_head. packed: the checkpoint's packing table (GraphBuilder.packed), if it has one."""
    inv_freq, scaling, rotary_dim = rope_tables(cfg.rope_parameters, cfg.head_dim, cfg.max_position_embeddings)
    shapes = dict(weight_shapes, **{INV_FREQ: tuple(inv_freq.shape)})
    g = GraphBuilder(shapes, packed or {})
    rope_attrs = dict(rotary_dim=rotary_dim, attention_scaling=scaling)
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    x = g.add("model.embed_tokens", "embedding", [],
              weights=[g.weight("model.embed_tokens.weight", (vocab, hidden))])
    for i in range(cfg.num_hidden_layers):
        x = decoder_layer(g, cfg, i, x, rope_attrs)
    # Only the rows whose logits are wanted go through the final norm and lm_head.
    x = g.add("model.logits_rows", "gather_rows", [x])
    x = rms_norm(g, "model.norm", x, cfg.rms_norm_eps, hidden)
    head = "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
    logits = g.add("lm_head", "linear", [x], weights=[g.weight(head, (vocab, hidden))], role=roles.LOGITS)
    return g.finish(cfg, logits, {INV_FREQ: inv_freq}, weight_shapes)
