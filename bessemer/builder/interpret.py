"""Reference interpreter: runs a Graph with NumPy (plugins/ops.py references).

The oracle for passes (the graph before and after a pass must compute the same logits)
and a second opinion on the C++ executor. One sequence, whole prompt, no KV cache.
"""

from __future__ import annotations

import numpy as np

from bessemer.builder.graph import Graph, infer_shapes
from bessemer.plugins import ops


def interpret(graph: Graph, weights, token_ids: list[int]) -> np.ndarray:
    """Returns logits [len(token_ids), vocab]. `weights(name) -> fp32 array` (HF names or
    graph constants); fused weights are concatenated from their parts here."""
    graph = infer_shapes(graph) if not graph.values else graph
    ids = np.asarray(token_ids, dtype=np.int64)
    pos = np.arange(len(ids))
    env: dict[str, np.ndarray] = {}

    def w(ref):
        if ref is None:
            return None
        get = lambda name: graph.constants[name] if name in graph.constants else weights(name)
        return np.concatenate([get(p) for p in ref.parts], axis=0)

    for n in graph.nodes:
        a = n.attrs
        x = [env[i] for i in n.inputs]
        ws = [w(r) for r in n.weights]
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
        else:
            raise NotImplementedError(n.op)
        for name, value in zip(n.outputs, outs):
            env[name] = value
    return env[graph.output]
