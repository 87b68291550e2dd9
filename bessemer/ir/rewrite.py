"""Graph-rewrite helpers shared by the fusion passes."""

from __future__ import annotations

from dataclasses import replace

from bessemer.ir.graph import Graph, GraphError, Node, WeightRef
from bessemer.ir.roles import LinearRole


def _concat(name: str, refs: list[WeightRef], shapes: dict) -> WeightRef:
    """refs stacked on axis 0; row ranges of packed tensors (WeightRef.slices) are kept."""
    shape = (sum(r.shape[0] for r in refs),) + tuple(refs[0].shape[1:])
    slices = ()
    if any(r.slices for r in refs):
        slices = tuple(s for r in refs for s in (r.slices or [
            (0, shapes[p][0], 0, shapes[p][1] if len(shapes[p]) > 1 else 0) for p in r.parts]))
    return WeightRef(name, tuple(p for r in refs for p in r.parts), shape, slices=slices)


def fuse_sibling_linears(graph: Graph, kind: str) -> Graph:
    """Fuses the linears whose role names one fusion group of `kind` (ir/roles.py) and
    that read the same input into one linear named by the group, followed by a `split`
    whose outputs keep the members' value names; members in graph order are its parts.

    Consumers are untouched: they read the same value names, now views of one buffer.
    """
    groups: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op == "linear" and n.role is not None and n.role.fusion is not None and n.role.fusion.kind == kind:
            groups.setdefault(n.role.fusion.name, []).append(n)
    replaced: dict[str, list[Node]] = {}
    for name, group in groups.items():
        if len(group) < 2 or any(g.inputs != group[0].inputs for g in group):
            continue
        if len({g.role.split for g in group}) != 1:
            raise GraphError(f"{name}: fusion group mixes {sorted({g.role.split for g in group})} splits")
        has_bias = [len(g.weights) > 1 and g.weights[1] is not None for g in group]
        if any(has_bias) and not all(has_bias):
            continue  # a partial bias would need a zero tensor; leave such groups unfused
        weights = [_concat(f"{name}.weight", [g.weights[0] for g in group], graph.weight_shapes)]
        if all(has_bias):
            weights.append(_concat(f"{name}.bias", [g.weights[1] for g in group], graph.weight_shapes))
        widths = [g.weights[0].shape[0] for g in group]
        role = LinearRole(group[0].role.split, tuple(s for g in group for s in g.role.shards))
        fused_nodes = [Node(name, "linear", group[0].inputs, (name,), tuple(weights), {}, role),
                       Node(f"{name}.split", "split", (name,), tuple(g.outputs[0] for g in group),
                            (), {"sizes": widths})]
        replaced[group[-1].name] = fused_nodes  # emit where the last member stood
        for g in group[:-1]:
            replaced[g.name] = []
    nodes = []
    for n in graph.nodes:
        nodes.extend(replaced.get(n.name, [n]))
    return replace(graph, nodes=tuple(nodes), values={})
