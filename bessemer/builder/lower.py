"""Lowering, the target-neutral part: what every target's lowering shares.

- TensorSpec: a tensor of the rank file and where its bytes come from.
- plan_memory: assigns every value a view of an activation buffer. `split` outputs become
  column views of their input (no copy), ops that declare in-place outputs reuse an input's
  view when that input dies there, and buffers whose values are dead are reused by later
  values of the same rows kind and width.
- plan_calls: one KernelCall per node (split is a view, not a call), with the kernel a
  target chooses for it.
- keep_shipped_experts: experts a checkpoint ships in MXFP4 stay MXFP4 (both targets read them).

What is stored in which dtype and layout, and which kernel runs a node, is the target's
choice (targets/<name>/lowering.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from bessemer.ir.graph import Graph, GraphError, Node
from bessemer.format.plan import Buffer, KernelCall, View
from bessemer.plugins.ops import OPS
from bessemer.quantization.formats import Mxfp4Experts

# Kernels that only rotate/overwrite their inputs; the plan lists no outputs for them.
IN_PLACE_ONLY = {"rope"}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the rank file: its HF parts (concatenated on axis 0) or a graph constant;
    for a quantized weight, one of its stored parts (`role`: codes, scales or offsets)."""

    name: str
    parts: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    layout: str
    quant: object = None  # the stored format (WeightRef.quant) of the weight this tensor is part of
    role: str = "data"  # data, or the format's part: codes | scales | offsets | wsum | smooth | input_scale
    source: str = ""  # the (fp32) weight a quantized part is derived from
    slices: tuple = ()  # WeightRef.slices: this rank's range of each part (tensor parallelism)


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for i, n in enumerate(graph.nodes):
        for v in n.inputs:
            last[v] = i
    return last


def plan_memory(graph: Graph) -> tuple[dict[str, View], list[Buffer]]:
    values = graph.values
    last = _last_uses(graph)
    last[graph.output] = len(graph.nodes)  # the logits live to the end
    view: dict[str, View] = {}
    buffers: list[Buffer] = []
    live: dict[int, set[str]] = {}  # buffer id -> live values viewing it
    free: list[int] = []

    def acquire(rows: str, width: int) -> View:
        for i, b in enumerate(free):
            if buffers[b].rows == rows and buffers[b].width == width:
                return View(free.pop(i), 0, width)
        buffers.append(Buffer(len(buffers), width, rows))
        return View(len(buffers) - 1, 0, width)

    def bind(value: str, v: View) -> None:
        view[value] = v
        live.setdefault(v.buffer, set()).add(value)

    def release(value: str) -> None:
        b = view[value].buffer
        live[b].discard(value)
        if not live[b]:
            free.append(b)

    def overwritable(value: str, i: int) -> bool:
        """In place over `value` is safe if it dies at node i and no other live value
        overlaps its columns (rope rotates the q and k columns of the qkv buffer while
        the v columns stay live)."""
        v = view[value]
        return last.get(value) == i and not any(
            other != value and view[other].col < v.col + v.width and v.col < view[other].col + view[other].width
            for other in live[v.buffer])

    for i, n in enumerate(graph.nodes):
        decl = OPS[n.op]
        if n.op == "split":
            src, col = view[n.inputs[0]], 0
            for out in n.outputs:
                width = values[out].width
                bind(out, View(src.buffer, src.col + col, width))
                col += width
        else:
            for k, out in enumerate(n.outputs):
                src = decl.inplace.get(k)
                if src is not None and overwritable(n.inputs[src], i):
                    bind(out, view[n.inputs[src]])
                else:
                    bind(out, acquire(values[out].rows, values[out].width))
        for v in set(n.inputs):
            if last.get(v) == i:
                release(v)
        for out in n.outputs:
            if out not in last:  # produced but never read
                release(out)
    return view, buffers


# node -> (op, version, weight tensor names, attrs) of the kernel that runs it
KernelChoice = Callable[[Node], tuple[str, int, list[str], dict]]


def plan_calls(graph: Graph, view: dict[str, View], choose: KernelChoice) -> list[KernelCall]:
    calls = []
    for n in graph.nodes:
        if n.op == "split":
            continue
        ins, outs = tuple(view[v] for v in n.inputs), tuple(view[v] for v in n.outputs)
        if n.op in IN_PLACE_ONLY:
            if outs != ins:
                raise GraphError(f"{n.name}: {n.op} works in place, but its inputs are still read later")
            outs = ()
        op, version, weights, attrs = choose(n)
        calls.append(KernelCall(op=op, version=version, node=n.name, ins=ins, outs=outs, weights=tuple(weights),
                                attrs={k: float(v) for k, v in attrs.items()}))
    return calls


def keep_shipped_experts(graph: Graph) -> Graph:
    """Experts the checkpoint ships in MXFP4 (moe attr mxfp4_experts, models/gpt_oss.py) and
    no --quant requantized stay MXFP4 (cpu: moe_mxfp4; cuda: the grouped expert GEMMs); a
    tensor-parallel rank holds whole experts of them: the shipped bytes of its experts."""
    def keep(n: Node) -> Node:
        gate_up, down = n.weights[:2]
        if gate_up.quant is not None:
            return n
        return replace(n, weights=tuple(replace(w, quant=Mxfp4Experts()) for w in (gate_up, down)) + n.weights[2:])

    return replace(graph, nodes=tuple(keep(n) if n.op == "moe" and n.attrs.get("mxfp4_experts") else n
                                      for n in graph.nodes))
