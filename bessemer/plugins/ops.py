"""The closed op set: every op declared once with its version, signature, shape rule,
which outputs may be computed in place, and a NumPy reference implementation.

The references are the oracle for the C++ kernels (tests/test_kernels.py) and power the
graph interpreter (ir/interpret.py) used to test passes. Shapes: every value is a
matrix (rows, width) whose rows are the step's tokens ("tokens") or the rows selected for
logits ("selected").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bessemer.format.plan import ROWS_SELECTED, ROWS_TOKENS


@dataclass(frozen=True)
class StepInputs:
    """Per-step metadata the references need; mirrors Executor.step's arguments."""

    token_ids: np.ndarray  # [T] int
    positions: np.ndarray  # [T] int
    seq_ids: np.ndarray  # [T] which sequence each row belongs to
    logits_indices: np.ndarray  # [L] rows whose logits are wanted


@dataclass(frozen=True)
class OpDecl:
    name: str
    version: int
    num_ins: int
    num_outs: int
    weight_roles: tuple[str, ...]  # required weights, in kernel order; "bias?" = optional
    # (in_widths, attrs, weight_shapes) -> out widths; raises ValueError on a mismatch.
    infer: Callable[[list[int], dict, list[tuple[int, ...]]], list[int]]
    # output index -> input index it may overwrite (the kernel supports aliasing them).
    inplace: dict
    rows: str = ""  # "" = outputs have the rows of input 0; else a fixed rows kind
    # What output 0's channel j is proportional to, so a per-channel factor on it can be
    # folded there exactly (AWQ, SmoothQuant; builder/input_groups.py): "weight" = entry j
    # of the weight (plus attrs weight_offset), "rows" = row j of the weight and bias j,
    # "input1" = channel j of input 1; "" = nothing per channel.
    channel_scale: str = ""
    # Which targets run an op is theirs to declare (targets/<name>/kernel_table.py KERNELS):
    # an op may be declared here with its reference before any target has its kernel.


def _same(ins, attrs, ws):
    if len(set(ins)) != 1:
        raise ValueError(f"operand widths differ: {ins}")
    return [ins[0]]


def _linear(ins, attrs, ws):
    n, k = ws[0]
    if ins[0] != k:
        raise ValueError(f"input width {ins[0]} != weight in_features {k}")
    if len(ws) > 1 and ws[1] != (n,):
        raise ValueError(f"bias shape {ws[1]} != ({n},)")
    return [n]


def _embedding(ins, attrs, ws):
    return [ws[0][1]]


def _norm(ins, attrs, ws):
    if ws[0] != (ins[0],):
        raise ValueError(f"norm weight {ws[0]} != ({ins[0]},)")
    return [ins[0]] * (2 if len(ins) == 2 else 1)


def _split(ins, attrs, ws):
    sizes = [int(s) for s in attrs["sizes"]]
    if sum(sizes) != ins[0]:
        raise ValueError(f"split sizes {sizes} do not sum to {ins[0]}")
    return sizes


def _rope(ins, attrs, ws):
    d, r = int(attrs["head_dim"]), int(attrs["rotary_dim"])
    if ins != [attrs["num_heads"] * d, attrs["num_kv_heads"] * d]:
        raise ValueError(f"rope operand widths {ins} do not match heads x head_dim")
    if ws[0] != (r // 2,) or r > d or r % 2:
        raise ValueError(f"inv_freq shape {ws[0]} does not match rotary_dim {r}")
    return list(ins)


def _attention(ins, attrs, ws):
    d, hq, hkv = int(attrs["head_dim"]), int(attrs["num_heads"]), int(attrs["num_kv_heads"])
    if ins != [hq * d, hkv * d, hkv * d] or hq % hkv:
        raise ValueError(f"attention operand widths {ins} do not match heads {hq}/{hkv} x {d}")
    return [hq * d]


def _heads_norm(ins, attrs, ws):
    h, d = int(attrs["num_heads"]), int(attrs["head_dim"])
    if ins[0] != h * d or ws[0] != (d,):
        raise ValueError(f"per-head norm of width {ins[0]} with weight {ws[0]} does not match {h} heads x {d}")
    return [ins[0]]


def _gate_column(ins, attrs, ws):
    if ins[1] != 1:
        raise ValueError(f"gate width {ins[1]} != 1")
    return [ins[0]]


def moe_weight_shapes(attrs, hidden: int) -> list[tuple[int, ...]]:
    """gate_up, down (and their biases) as a moe node's layout stores them: 0 = per-expert
    [gate; up] rows stacked (E*2I, H) and down (E*H, I); 1 = gpt-oss's stacked tensors,
    input-major with gate/up interleaved: (E, H, 2I) and (E, I, H)."""
    n, size = int(attrs["num_experts"]), int(attrs["expert_size"])
    if int(attrs.get("layout", 0)) == 1:  # a tensor-parallel rank holds local_experts of them
        n = int(attrs.get("local_experts", n))
        return [(n, hidden, 2 * size), (n, size, hidden), (n, 2 * size), (n, hidden)]
    return [(n * 2 * size, hidden), (n * hidden, size), (n * 2 * size,), (n * hidden,)]


def _moe(ins, attrs, ws):
    hidden, experts = ins
    n = int(attrs["num_experts"])
    if experts != n or not 0 < int(attrs["top_k"]) <= n:
        raise ValueError(f"router width {experts} / top_k {attrs['top_k']} do not fit {n} experts")
    if [tuple(w) for w in ws] != moe_weight_shapes(attrs, hidden)[:len(ws)]:
        raise ValueError(f"expert weights {ws} do not match {n} experts of {attrs['expert_size']} x {hidden}")
    return [hidden]


def _attention_sinks(ins, attrs, ws):
    if ws[0] != (int(attrs["num_heads"]),):
        raise ValueError(f"sinks {ws[0]} != ({attrs['num_heads']},)")
    return _attention(ins, attrs, ws)


def shard_range(full: int, tp_size: int, rank: int) -> tuple[int, int]:
    """Rows [start, stop) of a `full`-long axis that `rank` holds when it is cut in tp_size
    contiguous pieces of ceil(full / tp_size) (the last may be shorter): the rule of the
    vocab-parallel lm_head, shared by the pass, all_gather's shape check and its kernel."""
    chunk = -(-full // tp_size)
    return min(full, rank * chunk), min(full, (rank + 1) * chunk)


def _all_gather(ins, attrs, ws):
    full, n, r = int(attrs["full_width"]), int(attrs["tp_size"]), int(attrs["tp_rank"])
    start, stop = shard_range(full, n, r)
    if ins[0] != stop - start:
        raise ValueError(f"shard width {ins[0]} != {stop - start} (rank {r} of {n} over {full})")
    return [full]


OPS: dict[str, OpDecl] = {d.name: d for d in [
    OpDecl("embedding", 1, 0, 1, ("table",), _embedding, {}, ROWS_TOKENS),
    OpDecl("rms_norm", 1, 1, 1, ("weight",), _norm, {0: 0}, channel_scale="weight"),
    OpDecl("add_rms_norm", 1, 2, 2, ("weight",), _norm, {1: 1}, channel_scale="weight"),
    OpDecl("add", 1, 2, 1, (), _same, {0: 0}),
    OpDecl("linear", 1, 1, 1, ("weight", "bias?"), _linear, {}, channel_scale="rows"),
    # silu(gate) * up: channel j is linear in up's channel j
    OpDecl("silu_mul", 1, 2, 1, (), _same, {}, channel_scale="input1"),
    OpDecl("gather_rows", 1, 1, 1, (), lambda i, a, w: [i[0]], {}, ROWS_SELECTED),
    # split makes views of its input (no kernel); lowering turns it into column offsets.
    OpDecl("split", 0, 1, -1, (), _split, {}),
    OpDecl("rope", 1, 2, 2, ("inv_freq",), _rope, {0: 0, 1: 1}),
    OpDecl("attention", 1, 3, 1, (), _attention, {}),
    # RMSNorm of each head of a (T, num_heads * head_dim) value, one (head_dim,) weight for
    # all heads (Qwen3, Gemma 3 q/k norms); attrs num_heads, head_dim, eps, weight_offset,
    # kv_heads (1: the heads are KV heads, k_norm; tensor parallelism counts them so).
    OpDecl("rms_norm_heads", 1, 1, 1, ("weight",), _heads_norm, {0: 0}),
    # gelu_tanh(gate) * up (Gemma's gated MLP)
    OpDecl("gelu_tanh_mul", 1, 2, 1, (), _same, {}, channel_scale="input1"),
    # x * factor (attrs factor): Gemma's sqrt(hidden) embeddings, Granite's multipliers
    OpDecl("scale", 1, 1, 1, (), lambda i, a, w: [i[0]], {0: 0}),
    # y * sigmoid(g), g one column (Qwen2-MoE's shared expert gate)
    OpDecl("sigmoid_gate_mul", 1, 2, 1, (), _gate_column, {}),
    # Mixture of experts: x (T, H) and router logits (T, E) -> (T, H). Weights: every
    # expert's [gate; up] rows stacked (E*2I, H) and its down rows (E*H, I); only the top_k
    # experts a token routes to are read; silu(gate) * up. attrs num_experts, top_k,
    # expert_size (I), softmax_after_topk (0: softmax over all experts then top-k, Mixtral
    # and Qwen; 1: softmax over the top-k logits, gpt-oss), norm_topk_prob (renormalise the
    # top-k probabilities); layout (moe_weight_shapes); activation (0: silu(gate) * up;
    # 1: gpt-oss's (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)); with
    # layout 1 under tensor parallelism, first_expert / local_experts: the experts this rank
    # holds (tokens routed elsewhere add nothing here; an all_reduce sums the ranks).
    # Stored quantized (quantization/formats.py ExpertStack, Mxfp4Experts), the experts are read
    # by a target's moe_* kernels (format/plan.py); the reference is this one on their values.
    OpDecl("moe", 1, 2, 1, ("gate_up", "down", "gate_up_bias?", "down_bias?"), _moe, {}),
    # attention whose softmax also counts one learned logit per head (gpt-oss's sinks)
    OpDecl("attention_sinks", 1, 3, 1, ("sinks",), _attention_sinks, {}),
    # Tensor parallelism (builder/passes/shard_tensor_parallel.py). attrs tp_size, tp_rank.
    # all_reduce: every rank's x replaced by the sum over ranks (in place).
    OpDecl("all_reduce", 1, 1, 1, (), lambda i, a, w: [i[0]], {0: 0}),
    # all_gather: this rank's columns (shard_range(full_width)) -> the full row on every rank.
    OpDecl("all_gather", 1, 1, 1, (), _all_gather, {}),
]}


# ---- NumPy references (float64 inside, float32 out, like the kernels' fp32 accumulate) ----

def ref_rms_norm(x, w, eps, weight_offset=0.0):
    x64 = x.astype(np.float64)
    inv = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    return (x64 * inv * (w.astype(np.float64) + weight_offset)).astype(np.float32)


def ref_silu_mul(g, u):
    g64 = g.astype(np.float64)
    return (g64 / (1.0 + np.exp(-g64)) * u).astype(np.float32)


def ref_all_reduce(shards: list[np.ndarray]) -> np.ndarray:
    """Sum over ranks, accumulated in fp32 in rank order 0, 1, ..., exactly what the kernel
    computes on every rank (so all ranks hold bit-identical residual streams)."""
    out = np.array(shards[0], dtype=np.float32)
    for s in shards[1:]:
        out = (out + np.asarray(s, dtype=np.float32)).astype(np.float32)
    return out


def ref_all_gather(shards: list[np.ndarray]) -> np.ndarray:
    """Rank shards (rows, width_r) side by side: (rows, sum of widths)."""
    return np.concatenate([np.asarray(s, dtype=np.float32) for s in shards], axis=1)


def ref_rope(x, positions, inv_freq, num_heads, head_dim, rotary_dim, scaling=1.0):
    # x: (T, num_heads * head_dim); rotate-half on the first rotary_dim dims of each head
    t = x.reshape(len(x), num_heads, head_dim).astype(np.float64)
    ang = positions.astype(np.float32)[:, None] * inv_freq.astype(np.float32)[None, :]
    cos = (np.cos(ang.astype(np.float64)) * scaling)[:, None, :]
    sin = (np.sin(ang.astype(np.float64)) * scaling)[:, None, :]
    half = rotary_dim // 2
    a, b = t[..., :half].copy(), t[..., half:rotary_dim].copy()
    t[..., :half] = a * cos - b * sin
    t[..., half:rotary_dim] = b * cos + a * sin
    return t.reshape(len(x), -1).astype(np.float32)


def ref_attention(q, k_all, v_all, q_pos, kv_pos, num_heads, num_kv_heads, head_dim, scale,
                  sliding_window=0, kv_dtype=None, sinks=None):
    """Attention of one sequence. q: (Tq, Hq*D) at positions q_pos; k_all, v_all:
    (Tk, Hkv*D) of the whole cached context at positions kv_pos. kv_dtype "int8" / "fp8":
    K and V as a quantized cache gives them back (the cache write's reference)."""
    if kv_dtype is not None:
        from bessemer.quantization.kv_cache import fake_quantize_kv

        def stored(x):  # x: (Tk, Hkv*D) -> per (token, head) rows through the cache
            rows = np.asarray(x, np.float32).reshape(len(x), num_kv_heads, head_dim)
            return fake_quantize_kv(rows, kv_dtype).reshape(len(x), -1)

        k_all, v_all = stored(k_all), stored(v_all)
    tq = len(q)
    qh = q.reshape(tq, num_heads, head_dim).astype(np.float64)
    kh = k_all.reshape(len(k_all), num_kv_heads, head_dim).astype(np.float64)
    vh = v_all.reshape(len(v_all), num_kv_heads, head_dim).astype(np.float64)
    group = num_heads // num_kv_heads
    out = np.zeros((tq, num_heads, head_dim))
    for h in range(num_heads):
        s = qh[:, h] @ kh[:, h // group].T * scale  # (Tq, Tk)
        mask = kv_pos[None, :] <= q_pos[:, None]
        if sliding_window:
            mask &= kv_pos[None, :] > q_pos[:, None] - sliding_window
        s = np.where(mask, s, -np.inf)
        top = s.max(axis=1, keepdims=True) if sinks is None else np.maximum(s.max(axis=1, keepdims=True), sinks[h])
        p = np.exp(s - top)
        # a sink is one more logit in the softmax's denominator, with no value
        p /= p.sum(axis=1, keepdims=True) + (0.0 if sinks is None else np.exp(float(sinks[h]) - top))
        out[:, h] = p @ vh[:, h // group]
    return out.reshape(tq, -1).astype(np.float32)


def ref_sample_rows(logits, temperature, top_k, top_p, uniform) -> np.ndarray:
    """Token per row as the device sampler draws it (the cuda target's sample_kernel).

    logits: (L, V); temperature, top_k, top_p, uniform: (L,). temperature <= 0: argmax
    (first index). Else top-k keeps the logits >= the k-th largest (top_k <= 0 or >= V:
    all); top-p keeps, of those, the logits >= the largest value t whose kept mass
    (exp((x - max) / T) summed over x >= t) reaches top_p times the top-k mass; the draw is
    the first token, in vocabulary order, whose cumulative kept mass exceeds uniform times
    the kept mass (the last kept token if rounding leaves none). Ties are all kept.
    """
    out = np.empty(len(logits), dtype=np.int64)
    for r, row in enumerate(np.asarray(logits, dtype=np.float32)):
        if temperature[r] <= 0:
            out[r] = int(np.argmax(row))
            continue
        x = row.astype(np.float64)
        keep = np.ones(len(x), dtype=bool)
        if 0 < top_k[r] < len(x):
            keep = x >= np.sort(x)[-int(top_k[r])]
        w = np.exp((x - x.max()) / float(temperature[r]))
        if top_p[r] < 1:
            target = float(top_p[r]) * w[keep].sum()
            for t in np.unique(x[keep])[::-1]:  # candidate thresholds, largest first
                if w[keep & (x >= t)].sum() >= target:
                    keep &= x >= t
                    break
        w = np.where(keep, w, 0.0)
        hits = np.flatnonzero(keep & (np.cumsum(w) > float(uniform[r]) * w.sum()))
        out[r] = hits[0] if len(hits) else np.flatnonzero(keep)[-1]
    return out


def ref_rms_norm_heads(x, w, num_heads, head_dim, eps, weight_offset=0.0):
    t = x.reshape(len(x), num_heads, head_dim)
    return ref_rms_norm(t, w, eps, weight_offset).reshape(len(x), -1)


def ref_gelu_tanh_mul(g, u):
    g64 = g.astype(np.float64)
    gelu = 0.5 * g64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (g64 + 0.044715 * g64 ** 3)))
    return (gelu * u).astype(np.float32)


def ref_scale(x, factor):
    return (x.astype(np.float64) * factor).astype(np.float32)


def ref_sigmoid_gate_mul(y, g):
    return (y.astype(np.float64) / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32)


def ref_moe_routing(logits, top_k, softmax_after_topk, norm_topk_prob):
    """(T, E) router logits -> (experts (T, k), weights (T, k)), as transformers routes."""
    z = logits.astype(np.float64)
    if softmax_after_topk:
        top = np.argsort(-z, axis=1, kind="stable")[:, :top_k]
        v = np.take_along_axis(z, top, axis=1)
        p = np.exp(v - v.max(axis=1, keepdims=True))
        return top, p / p.sum(axis=1, keepdims=True)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    top = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    w = np.take_along_axis(p, top, axis=1)
    return top, (w / w.sum(axis=1, keepdims=True) if norm_topk_prob else w)


def _expert_act(g, u, activation):
    if activation == 1:  # gpt-oss
        g, u = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
        return (u + 1.0) * g / (1.0 + np.exp(-1.702 * g))
    return g / (1.0 + np.exp(-g)) * u


def ref_expert_hidden(gate_up_out, activation, interleaved):
    """One expert's gate_up output (R, 2I) -> the input of its down (R, I): act(gate, up),
    gate and up interleaved (layout 1, gpt-oss) or [gate | up] (layout 0)."""
    i = gate_up_out.shape[1] // 2
    if interleaved:
        return _expert_act(gate_up_out[:, ::2], gate_up_out[:, 1::2], activation)
    return _expert_act(gate_up_out[:, :i], gate_up_out[:, i:], activation)


def ref_moe(x, logits, weights, num_experts, top_k, expert_size, softmax_after_topk, norm_topk_prob,
            layout=0, activation=0, first_expert=0, local_experts=None, matmul_input=None):
    """x: (T, H); weights: gate_up, down[, gate_up_bias, down_bias] as `layout` stores them
    (moe_weight_shapes), of experts [first_expert, first_expert + local_experts). Only the
    routed experts' weights are read. matmul_input: applied to both matmuls' inputs (the
    bf16 rounding of the w4a16 expert kernel's activations)."""
    cast = matmul_input or (lambda v: v)
    top, probs = ref_moe_routing(logits, top_k, softmax_after_topk, norm_topk_prob)
    top = top - first_expert  # local expert index; outside [0, local) is another rank's
    num_experts = num_experts if local_experts is None else local_experts
    i, h = expert_size, x.shape[1]
    gate_up, down = weights[0].astype(np.float64), weights[1].astype(np.float64)
    bias_gu = weights[2].astype(np.float64) if len(weights) > 2 and weights[2] is not None else None
    bias_d = weights[3].astype(np.float64) if len(weights) > 3 and weights[3] is not None else None
    x64, out = x.astype(np.float64), np.zeros((len(x), h))
    for e in range(num_experts):
        rows, slot = np.nonzero(top == e)  # the tokens routed to e
        if len(rows) == 0:
            continue
        if layout == 1:
            gu = cast(x64[rows]) @ gate_up[e]  # (R, 2I), gate and up interleaved
            if bias_gu is not None:
                gu = gu + bias_gu[e]
            y = cast(ref_expert_hidden(gu, activation, True)) @ down[e]
        else:
            gu = cast(x64[rows]) @ gate_up[e * 2 * i:(e + 1) * 2 * i].T
            if bias_gu is not None:
                gu = gu + bias_gu[e * 2 * i:(e + 1) * 2 * i]
            y = cast(ref_expert_hidden(gu, activation, False)) @ down[e * h:(e + 1) * h].T
        if bias_d is not None:
            y = y + (bias_d[e] if layout == 1 else bias_d[e * h:(e + 1) * h])
        out[rows] += y * probs[rows, slot][:, None]
    return out.astype(np.float32)
