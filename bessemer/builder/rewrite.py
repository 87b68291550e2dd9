"""Graph-rewrite helpers shared by the fusion passes."""

from __future__ import annotations

from dataclasses import replace

from bessemer.builder.graph import Graph, Node, WeightRef


def _concat(name: str, refs: list[WeightRef]) -> WeightRef:
    shape = (sum(r.shape[0] for r in refs),) + tuple(refs[0].shape[1:])
    return WeightRef(name, tuple(p for r in refs for p in r.parts), shape)


def fuse_sibling_linears(graph: Graph, members: tuple[str, ...], fused: str) -> Graph:
    """Fuses linears named `<parent>.<member>` that read the same input into one linear
    `<parent>.<fused>` followed by a `split` whose outputs keep the original value names.

    Consumers are untouched: they read the same value names, now views of one buffer.
    """
    by_name = {n.name: n for n in graph.nodes}
    replaced: dict[str, list[Node]] = {}
    for n in graph.nodes:
        if n.op != "linear" or not n.name.endswith("." + members[0]):
            continue
        parent = n.name[: -len(members[0]) - 1]
        group = [by_name.get(f"{parent}.{m}") for m in members]
        if any(g is None or g.op != "linear" or g.inputs != n.inputs for g in group):
            continue
        has_bias = [len(g.weights) > 1 and g.weights[1] is not None for g in group]
        if any(has_bias) and not all(has_bias):
            continue  # a partial bias would need a zero tensor; leave such groups unfused
        name = f"{parent}.{fused}"
        weights = [_concat(f"{name}.weight", [g.weights[0] for g in group])]
        if all(has_bias):
            weights.append(_concat(f"{name}.bias", [g.weights[1] for g in group]))
        widths = [g.weights[0].shape[0] for g in group]
        out = f"{name}"
        fused_nodes = [Node(name, "linear", n.inputs, (out,), tuple(weights), {}),
                       Node(f"{name}.split", "split", (out,), tuple(g.outputs[0] for g in group),
                            (), {"sizes": widths})]
        replaced[group[-1].name] = fused_nodes  # emit where the last member stood
        for g in group[:-1]:
            replaced[g.name] = []
    nodes = []
    for n in graph.nodes:
        nodes.extend(replaced.get(n.name, [n]))
    return replace(graph, nodes=tuple(nodes), values={})
