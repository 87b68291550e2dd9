"""The closed op set: every op declared once with its version, signature, shape rule,
which outputs may be computed in place, and a NumPy reference implementation.

The references are the oracle for the C++ kernels (tests/test_kernels.py) and power the
graph interpreter (builder/interpret.py) used to test passes. Shapes: every value is a
matrix (rows, width) whose rows are the step's tokens ("tokens") or the rows selected for
logits ("selected").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bessemer.builder.plan import ROWS_SELECTED, ROWS_TOKENS


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
                  sliding_window=0, kv_dtype=None):
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
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p @ vh[:, h // group]
    return out.reshape(tq, -1).astype(np.float32)
