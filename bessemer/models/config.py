"""ModelConfig: the decoder-only transformer description every family maps its HF config to.

Field names are HF `config.json` names, so a reader of either file knows both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # HF architectures[0]
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_parameters: dict  # {"rope_type": ..., "rope_theta": ..., scaling fields}
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v projections
    o_proj_bias: bool = False
    mlp_bias: bool = False
    hidden_act: str = "silu"
    # per-layer sliding window (0 = full attention); length num_hidden_layers
    sliding_windows: tuple[int, ...] = ()
    # per layer, as HF: 1 = the layer applies RoPE, 0 = it does not (SmolLM3); () = every layer
    no_rope_layers: tuple[int, ...] = ()
    # q/k normalisation before RoPE: "" none, "full" one RMSNorm over all heads (OLMo2),
    # "per_head" one RMSNorm per head with a (head_dim,) weight (Qwen3, Gemma 3)
    qk_norm: str = ""
    # where a block's norm sits: "pre" (on its input, Llama), "post" (on its output, before
    # the residual add: OLMo2's post_attention_layernorm / post_feedforward_layernorm), or
    # "sandwich" (both: Gemma 3's input/post_attention and pre/post_feedforward norms)
    norm_placement: str = "pre"
    # RMSNorm computes x * (weight + offset): 1.0 for Gemma's zero-centred weights
    norm_weight_offset: float = 0.0
    # HF layer_types, kept when RoPE differs per layer type (Gemma 3: rope_parameters is
    # {layer type: params}, local sliding layers and global layers with their own bases)
    layer_types: tuple[str, ...] = ()
    embedding_multiplier: float = 1.0  # Granite's; Gemma scales embeddings by sqrt(hidden_size)
    residual_multiplier: float = 1.0  # Granite: each block's output scaled before the residual add
    logits_scaling: float = 1.0  # Granite: logits divided by it
    attention_multiplier: float | None = None  # the softmax scale; None: head_dim ** -0.5
    # mixture of experts (HF num_local_experts or num_experts); 0: dense MLPs
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # renormalise the top-k routing probabilities
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: a gated dense expert beside them
    moe_layers: tuple[int, ...] = ()  # the layers whose MLP is the sparse block
    moe_routing: str = "softmax_topk"  # or "topk_softmax" (gpt-oss: softmax over the top-k logits)
    moe_activation: str = "silu"  # or "swiglu_oai" (gpt-oss's clamped swiglu)
    moe_bias: bool = False  # router and experts have biases (gpt-oss)
    attention_sinks: bool = False  # a learned softmax logit per head (gpt-oss)
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = asdict(self)
        d["sliding_windows"] = list(self.sliding_windows)
        for name in ("no_rope_layers", "layer_types", "moe_layers"):
            d[name] = list(getattr(self, name))
        d["eos_token_id"] = list(self.eos_token_id)
        return d


def rope_parameters_from_hf(hf: dict) -> dict:
    """transformers 5 writes `rope_parameters`; older checkpoints `rope_theta` + `rope_scaling`."""
    if isinstance(hf.get("rope_parameters"), dict):
        params = dict(hf["rope_parameters"])
    else:
        params = dict(hf.get("rope_scaling") or {})
        params.setdefault("rope_theta", hf.get("rope_theta", 10000.0))
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params["rope_theta"] = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    # as transformers' standardize_rope_params: top-level fields of older configs (Phi-3/4)
    if hf.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    if params["rope_type"] in ("llama3", "yarn", "longrope"):
        if hf.get("original_max_position_embeddings") is not None:
            params["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
        params.setdefault("original_max_position_embeddings", hf.get("max_position_embeddings"))
    return dict(sorted(params.items()))


def layer_windows(hf: dict) -> tuple[int, ...]:
    """Per-layer sliding windows of Qwen-style configs: only layers that `layer_types` (or,
    in older configs, max_window_layers) mark sliding, and only with use_sliding_window."""
    n = hf["num_hidden_layers"]
    window = int(hf.get("sliding_window") or 0)
    if not hf.get("use_sliding_window") or not window:
        return (0,) * n
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= hf.get("max_window_layers", n) else "full_attention"
        for i in range(n)]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def eos_ids(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list) else (int(eos),)
