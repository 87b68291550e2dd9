"""input_groups: the linears that share each input, and where a per-channel factor on that
input folds, read from a model's graph (before passes: weights are HF tensors).

Calibration records one set of statistics per group (under InputGroup.key), and AWQ and
SmoothQuant choose one factor s per group. The fold follows the graph's edges and the op
set's `channel_scale` rule of the producer (plugins/ops.py), never module names: for a
Llama layer that gives q/k/v <- input_layernorm's weight, gate/up <- the post-attention
norm's weight, down_proj <- up_proj's rows through silu_mul, and o_proj <- nothing
(attention has no per-channel producer). A fold is used only when it is exact: every
consumer of the value changed is a linear of the group (or the one gate on the way), and
no other node reads the folded rows.

Names are those of the checkpoint: a group's key and modules are the HF modules that own its
weight tensors, so a packed tensor (Phi-3's qkv_proj, read as q/k/v row ranges) is one
weight of its group, calibrated on its own HF module's input.
"""

from __future__ import annotations

from bessemer.ir.graph import Graph, GraphError, Node
from bessemer.plugins.ops import OPS
from bessemer.quantization.channel_scales import Fold, InputGroup


def input_groups(graph: Graph) -> list[InputGroup]:
    """One group per value read by linears, in graph order; the logits' linear (lm_head,
    quantized by its own scheme without calibration) is left out."""
    by_input: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op == "linear" and graph.output not in n.outputs:
            by_input.setdefault(n.inputs[0], []).append(n)
    producers, users = graph.producers(), graph.consumers()
    readers: dict[tuple, int] = {}  # (tensor, rows) -> number of nodes that read them
    for n in graph.nodes:
        for w in n.weights:
            for p, rows in (_part_rows(w, graph.weight_shapes) if w is not None else ()):
                readers[p, rows] = readers.get((p, rows), 0) + 1
    groups = []
    for value, linears in by_input.items():
        fold = _fold(value, linears, producers, users, graph.weight_shapes)
        if fold is not None and any(readers.get((t, r[:2] if r else None)) != 1
                                    for t, r in zip(fold.tensors, fold.rows or [None] * len(fold.tensors))):
            fold = None
        tensors = tuple(dict.fromkeys(p for n in linears for p in n.weights[0].parts))
        modules = tuple(t.rsplit(".", 1)[0] for t in tensors)
        groups.append(InputGroup(modules[0], modules, tensors, fold))
    owners: dict[str, str] = {}
    for g in groups:
        for t in g.weights:
            if owners.setdefault(t, g.key) != g.key:
                raise GraphError(f"tensor {t} is read by linears of two inputs ({owners[t]}, {g.key}); "
                                 "a per-input-channel scale cannot serve both")
    return groups


def linear_input_keys(groups: list[InputGroup]) -> dict[str, str]:
    """{HF linear module: the key its input's statistics are recorded under}."""
    return {name: g.key for g in groups for name in g.linears}


def _part_rows(ref, shapes: dict) -> list[tuple[str, tuple | None]]:
    """(tensor, (r0, r1) or None for all of it) of each part of a weight."""
    if not ref.slices:
        return [(p, None) for p in ref.parts]
    return [(p, None if (s[0], s[1]) == (0, shapes[p][0]) else (s[0], s[1])) for p, s in zip(ref.parts, ref.slices)]


def _fold(value: str, linears: list[Node], producers: dict, users: dict, shapes: dict) -> Fold | None:
    if len(users.get(value, ())) != len(linears):  # something besides these linears reads it
        return None
    node = producers.get(value)
    if node is not None and OPS[node.op].channel_scale == "input1" and node.outputs[0] == value:
        gated = node.inputs[1]  # h = act(g) * u: scaling u's channel j scales h's
        if len(users.get(gated, ())) != 1:
            return None
        node, value = producers.get(gated), gated
    if node is None or node.outputs[0] != value:
        return None
    rule = OPS[node.op].channel_scale
    if rule == "weight":
        return Fold(node.weights[0].parts, float(node.attrs.get("weight_offset", 0.0)))
    if rule == "rows":
        parts = [pr for w in node.weights if w is not None for pr in _part_rows(w, shapes)]
        rows = tuple(r + (shapes[p][0],) if r else None for p, r in parts)
        return Fold(tuple(p for p, _ in parts), rows=rows if any(rows) else ())
    return None
