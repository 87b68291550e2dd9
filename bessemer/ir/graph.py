"""The layer-graph IR: a closed op set (plugins/ops.py), SSA values, HF-path node names.

A Graph is immutable: passes return new graphs (dataclasses.replace). Node names keep HF
module paths (`model.layers.3.self_attn.q_proj`) so any node can be compared with a HF
forward hook, and weights are referenced by their HF tensor names; a fused weight is the
concatenation of several HF tensors along the output axis (`WeightRef.parts`).

Every value is a matrix: (rows, width) where rows are the step's tokens or the rows
selected for logits; its dtype is float32 (activations are fp32 on the cpu target).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from bessemer.ir.roles import LinearRole
from bessemer.plugins.ops import OPS


@dataclass(frozen=True)
class WeightRef:
    """A weight: HF tensor names concatenated along axis 0 (or one graph constant).

    `name` is the tensor's name in the engine: the HF name for a single part, the fused
    module's name (e.g. `...self_attn.qkv_proj.weight`) for a concatenation.
    """

    name: str
    parts: tuple[str, ...]
    shape: tuple[int, ...]
    # How the stored weight is quantized, set by the quantize pass: its stored format
    # (quantization/formats.py, e.g. Int4Group(group_size=64, zero_point=False)); None = not.
    quant: object = None
    # Which bytes of each part this rank stores, set by shard_tensor_parallel: one
    # (row_start, row_stop, col_start, col_stop) per part (cols ignored for a 1-D part);
    # () = every part whole. The weight source reads only these ranges.
    slices: tuple = ()

    def part_shapes(self, full: dict) -> list[tuple[int, ...]]:
        """Shape of each part as stored (after its slice); `full`: name -> checkpoint shape."""
        shapes = []
        for i, p in enumerate(self.parts):
            shape = tuple(full[p])
            if self.slices:
                r0, r1, c0, c1 = self.slices[i]
                shape = (r1 - r0,) + ((c1 - c0,) + shape[2:] if len(shape) > 1 else ())
            shapes.append(shape)
        return shapes

    @staticmethod
    def single(name: str, shape: tuple[int, ...]) -> "WeightRef":
        return WeightRef(name, (name,), tuple(shape))


@dataclass(frozen=True)
class Node:
    name: str  # HF module path
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    weights: tuple[WeightRef | None, ...] = ()  # by the op's weight roles; None = absent optional
    attrs: dict = field(default_factory=dict)
    # What a linear is in its model (ir/roles.py), set by the model file; passes that
    # split or fuse linears read it instead of the node's name.
    role: LinearRole | None = None


@dataclass(frozen=True)
class Value:
    name: str
    rows: str
    width: int
    dtype: str = "float32"


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    output: str  # the logits value
    values: dict = field(default_factory=dict)  # name -> Value, filled by infer_shapes
    constants: dict = field(default_factory=dict)  # name -> np.ndarray (e.g. rope inv_freq)
    weight_shapes: dict = field(default_factory=dict)  # HF/constant name -> shape

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                users.setdefault(i, []).append(n)
        return users

    def weight_names(self) -> list[str]:
        seen: dict[str, None] = {}
        for n in self.nodes:
            for w in n.weights:
                if w is not None:
                    seen.setdefault(w.name)
        return list(seen)


class GraphError(ValueError):
    pass


def infer_shapes(graph: Graph) -> Graph:
    """Returns the graph with `values` filled in; raises GraphError on any inconsistency."""
    values: dict[str, Value] = {}
    for node in graph.nodes:
        decl = OPS.get(node.op)
        if decl is None:
            raise GraphError(f"{node.name}: op {node.op!r} is not in the closed op set")
        if len(node.inputs) != decl.num_ins:
            raise GraphError(f"{node.name}: {node.op} takes {decl.num_ins} inputs, got {len(node.inputs)}")
        missing = [i for i in node.inputs if i not in values]
        if missing:
            raise GraphError(f"{node.name}: input {missing[0]!r} is not defined before use")
        required = [r for r in decl.weight_roles if not r.endswith("?")]
        if not (len(required) <= len(node.weights) <= len(decl.weight_roles)):
            raise GraphError(f"{node.name}: {node.op} takes weights {decl.weight_roles}, got {len(node.weights)}")
        ins = [values[i] for i in node.inputs]
        shapes = [w.shape for w in node.weights if w is not None]
        try:
            widths = decl.infer([v.width for v in ins], node.attrs, shapes)
        except (ValueError, KeyError) as e:
            raise GraphError(f"{node.name}: {node.op}: {e}") from None
        if decl.num_outs >= 0 and len(node.outputs) != decl.num_outs:
            raise GraphError(f"{node.name}: {node.op} has {decl.num_outs} outputs, got {len(node.outputs)}")
        if len(widths) != len(node.outputs):
            raise GraphError(f"{node.name}: {node.op} produces {len(widths)} values, names {len(node.outputs)}")
        if ins and len({v.rows for v in ins}) != 1:
            raise GraphError(f"{node.name}: inputs mix token rows and selected rows")
        rows = decl.rows or ins[0].rows
        for out, width in zip(node.outputs, widths):
            if out in values:
                raise GraphError(f"{node.name}: value {out!r} is defined twice")
            values[out] = Value(out, rows, width)
    if graph.output not in values:
        raise GraphError(f"graph output {graph.output!r} is never produced")
    return replace(graph, values=values)


def verify(graph: Graph) -> Graph:
    """The verifier run after every pass: SSA, closed ops, shapes, weights known, no dead nodes."""
    graph = infer_shapes(graph)
    names = [n.name for n in graph.nodes]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise GraphError(f"node name {dup!r} is used twice")
    for n in graph.nodes:
        for w in n.weights:
            if w is None:
                continue
            for part in w.parts:
                if part not in graph.weight_shapes:
                    raise GraphError(f"{n.name}: weight {part!r} is not in the checkpoint")
            if w.slices and (len(w.slices) != len(w.parts) or not all(
                    _slice_fits(s, graph.weight_shapes[p]) for p, s in zip(w.parts, w.slices))):
                raise GraphError(f"{n.name}: weight {w.name} slices {w.slices} fall outside its parts")
            shapes = w.part_shapes(graph.weight_shapes)
            concat = sum(s[0] for s in shapes)
            if concat != w.shape[0] or any(s[1:] != tuple(w.shape[1:]) for s in shapes):
                raise GraphError(f"{n.name}: weight {w.name} shape {w.shape} does not match its parts")
        if n.role is not None and (n.op != "linear" or (
                n.role.shards and any(len(n.role.shards) != len(w.parts) for w in n.weights if w is not None))):
            raise GraphError(f"{n.name}: role {n.role.text()} does not fit a {n.op} with these weight parts")
    users = graph.consumers()
    for n in graph.nodes:
        if not any(o in users or o == graph.output for o in n.outputs):
            raise GraphError(f"{n.name}: dead node (no output is used)")
    return graph


def _slice_fits(sl: tuple, shape: tuple) -> bool:
    r0, r1, c0, c1 = sl
    return 0 <= r0 < r1 <= shape[0] and (len(shape) < 2 or 0 <= c0 < c1 <= shape[1])


def format_graph(graph: Graph) -> str:
    """Readable text form, one node a line: `%out:[rows,width] = op(%in, ...) {weights} attrs  # name`."""
    graph = infer_shapes(graph) if not graph.values else graph
    lines = [f"# {len(graph.nodes)} nodes, output %{graph.output}"]
    for n in graph.nodes:
        outs = ", ".join(f"%{o}:[{graph.values[o].rows},{graph.values[o].width}]" for o in n.outputs)
        ins = ", ".join(f"%{i}" for i in n.inputs)
        ws = " ".join(f"{{{w.name} {list(w.shape)}{' quant ' + w.quant.describe() if w.quant else ''}"
                      f"{' slices' + str(list(w.slices)) if w.slices else ''}}}"
                      for w in n.weights if w is not None)
        attrs = " ".join(f"{k}={v}" for k, v in sorted(n.attrs.items()))
        if n.role:
            attrs += f" [{n.role.text()}]"
        lines.append(f"{outs} = {n.op}({ins}) {ws} {attrs}  # {n.name}".replace("  ", " "))
    return "\n".join(lines) + "\n"


def constant_shape(arr: np.ndarray) -> tuple[int, ...]:
    return tuple(int(s) for s in arr.shape)
