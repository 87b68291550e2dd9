"""fuse_add_rmsnorm: `r = add(a, x); y = rms_norm(r)` -> `y, r = add_rms_norm(a, x)`.

The residual stream is read and written once instead of three times per layer; the
kernel writes the sum in place over the old residual when that value dies there.
"""

from dataclasses import replace

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, Node


def fuse_add_rmsnorm(graph: Graph, build: BuildConfig) -> Graph:
    producers = graph.producers()
    fused_adds: dict[str, Node] = {}
    skip: set[str] = set()
    for n in graph.nodes:
        if n.op != "rms_norm":
            continue
        add = producers.get(n.inputs[0])
        if add is None or add.op != "add" or add.name in fused_adds:
            continue
        # emitted where the add stood: the norm reads nothing else, so order is kept
        fused_adds[add.name] = Node(n.name, "add_rms_norm", add.inputs, (n.outputs[0], add.outputs[0]),
                                    n.weights, dict(n.attrs))
        skip.add(n.name)
    nodes = []
    for n in graph.nodes:
        if n.name in skip:
            continue
        nodes.append(fused_adds.get(n.name, n))
    return replace(graph, nodes=tuple(nodes), values={})
