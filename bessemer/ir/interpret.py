"""Reference interpreter: runs a Graph with NumPy (plugins/ops.py references).

The oracle for passes (the graph before and after a pass must compute the same logits)
and a second opinion on the C++ executor. One sequence, whole prompt, no KV cache.
"""

from __future__ import annotations

import numpy as np

from bessemer.ir.graph import Graph, infer_shapes
from bessemer.plugins import ops


def _weight(graph: Graph, weights, ref):
    """A node's weight: its parts (each cut to its tensor-parallel slice) concatenated."""
    if ref is None:
        return None
    arrays = []
    for i, p in enumerate(ref.parts):
        arr = graph.constants[p] if p in graph.constants else weights(p)
        if ref.slices:
            r0, r1, c0, c1 = ref.slices[i]
            arr = arr[r0:r1, c0:c1] if arr.ndim == 2 else arr[r0:r1]
        arrays.append(arr)
    return np.concatenate(arrays, axis=0)


def interpret(graph: Graph, weights, token_ids: list[int]) -> np.ndarray:
    """Returns logits [len(token_ids), vocab]. `weights(name) -> fp32 array` (HF names or
    graph constants); fused weights are concatenated from their parts here."""
    return interpret_ranks([graph], weights, token_ids)


def interpret_ranks(graphs: list[Graph], weights, token_ids: list[int]) -> np.ndarray:
    """Runs the graphs of all tensor-parallel ranks in lockstep (they have the same nodes,
    with per-rank weights and attrs); all_reduce / all_gather combine the ranks' values
    with the ops' references. Returns rank 0's logits. One graph = an ordinary run."""
    graphs = [infer_shapes(g) if not g.values else g for g in graphs]
    ids = np.asarray(token_ids, dtype=np.int64)
    envs: list[dict[str, np.ndarray]] = [{} for _ in graphs]
    for nodes in zip(*(g.nodes for g in graphs)):
        n = nodes[0]
        if n.op in ("all_reduce", "all_gather"):
            shards = [env[m.inputs[0]] for env, m in zip(envs, nodes)]
            y = ops.ref_all_reduce(shards) if n.op == "all_reduce" else ops.ref_all_gather(shards)
            for env, m in zip(envs, nodes):
                env[m.outputs[0]] = y.copy()
            continue
        for g, env, m in zip(graphs, envs, nodes):
            x = [env[i] for i in m.inputs]
            ws = [_weight(g, weights, r) for r in m.weights]
            for name, value in zip(m.outputs, _run(m, x, ws, ids)):
                env[name] = value
    return envs[0][graphs[0].output]


def _run(n, x, ws, ids) -> list[np.ndarray]:
    a = n.attrs
    pos = np.arange(len(ids))
    if n.op == "embedding":
        outs = [ws[0][ids].astype(np.float32)]
    elif n.op == "rms_norm":
        outs = [ops.ref_rms_norm(x[0], ws[0], a["eps"], a["weight_offset"])]
    elif n.op == "add_rms_norm":
        r = (x[0].astype(np.float64) + x[1]).astype(np.float32)
        outs = [ops.ref_rms_norm(r, ws[0], a["eps"], a["weight_offset"]), r]
    elif n.op == "add":
        outs = [(x[0].astype(np.float64) + x[1]).astype(np.float32)]
    elif n.op == "linear":
        y = x[0].astype(np.float64) @ ws[0].T.astype(np.float64)
        if len(ws) > 1 and ws[1] is not None:
            y += ws[1]
        outs = [y.astype(np.float32)]
    elif n.op == "silu_mul":
        outs = [ops.ref_silu_mul(x[0], x[1])]
    elif n.op == "gather_rows":
        outs = [x[0]]  # all rows are selected
    elif n.op == "split":
        cuts = np.cumsum(a["sizes"])[:-1]
        outs = np.split(x[0], cuts, axis=1)
    elif n.op == "rope":
        outs = [ops.ref_rope(x[0], pos, ws[0], int(a["num_heads"]), int(a["head_dim"]),
                             int(a["rotary_dim"]), a["attention_scaling"]),
                ops.ref_rope(x[1], pos, ws[0], int(a["num_kv_heads"]), int(a["head_dim"]),
                             int(a["rotary_dim"]), a["attention_scaling"])]
    elif n.op == "attention":
        outs = [ops.ref_attention(x[0], x[1], x[2], pos, pos, int(a["num_heads"]),
                                  int(a["num_kv_heads"]), int(a["head_dim"]), a["scale"],
                                  int(a["sliding_window"]))]
    elif n.op == "rms_norm_heads":
        outs = [ops.ref_rms_norm_heads(x[0], ws[0], int(a["num_heads"]), int(a["head_dim"]), a["eps"],
                                       a["weight_offset"])]
    elif n.op == "gelu_tanh_mul":
        outs = [ops.ref_gelu_tanh_mul(x[0], x[1])]
    elif n.op == "scale":
        outs = [ops.ref_scale(x[0], a["factor"])]
    elif n.op == "sigmoid_gate_mul":
        outs = [ops.ref_sigmoid_gate_mul(x[0], x[1])]
    elif n.op == "moe":
        outs = [ops.ref_moe(x[0], x[1], ws, int(a["num_experts"]), int(a["top_k"]), int(a["expert_size"]),
                            bool(a["softmax_after_topk"]), bool(a["norm_topk_prob"]), int(a.get("layout", 0)),
                            int(a.get("activation", 0)), int(a.get("first_expert", 0)),
                            int(a["local_experts"]) if "local_experts" in a else None)]
    elif n.op == "attention_sinks":
        outs = [ops.ref_attention(x[0], x[1], x[2], pos, pos, int(a["num_heads"]), int(a["num_kv_heads"]),
                                  int(a["head_dim"]), a["scale"], int(a["sliding_window"]), sinks=ws[0])]
    else:
        raise NotImplementedError(n.op)
    return outs
