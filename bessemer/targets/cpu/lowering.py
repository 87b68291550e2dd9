"""Lowering for the cpu target: the dtype and layout every weight is stored in, and the
C++ kernel (op@version) that runs every node.

- Linear weights: panel16 in the build dtype (what the GEMM/GEMV kernels read); quantized
  ones in their stored format's parts (int8 panel16, int4 panel16_int4_k8, int8 vnni16, ...).
- An embedding table shared with lm_head (tied) is stored once, panel16 (int8 panel16 when
  lm_head is quantized); the embedding kernel gathers its rows with stride 16.
- Experts (moe): fp32 row-major; quantized ones (ExpertStack) in their inner format's parts
  and layouts, one expert's panels after another; MXFP4 as shipped (row-major codes/scales).
- Norms, biases, constants: fp32 row-major.
"""

from __future__ import annotations

from dataclasses import replace

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError, Node, WeightRef
from bessemer.builder.lower import TensorSpec, keep_shipped_experts, plan_calls, plan_memory
from bessemer.errors import InvalidOptionError
from bessemer.format.plan import ExecutionPlan
from bessemer.plugins.ops import OPS
from bessemer.targets.cpu import TARGET
from bessemer.targets.cpu.kernel_table import QuantKernel


def quant_kernel(node: Node, ref: WeightRef) -> QuantKernel:
    """The kernel that reads `ref`'s stored format for `node` (kernel_table.QUANT_KERNELS)."""
    try:
        choose = TARGET.quant_kernel(node.op, type(ref.quant))
    except InvalidOptionError as e:
        raise GraphError(f"{node.name}: {e}") from None
    return choose(ref.quant, ref.shape)


def quantized_specs(node: Node, ref: WeightRef) -> list[TensorSpec]:
    """The stored parts of a quantized weight, in the layouts its cpu kernel reads."""
    layouts = quant_kernel(node, ref).layouts
    return [TensorSpec(ref.name + p.suffix, ref.parts, p.shape, p.dtype, layouts.get(p.role, "row_major"),
                       quant=ref.quant, role=p.role, source=ref.name, slices=ref.slices)
            for p in ref.quant.parts(ref.shape)]


def select_storage(graph: Graph, build: BuildConfig) -> list[TensorSpec]:
    """Every weight's tensors, in plan order (a quantized weight's parts follow its codes)."""
    specs: dict[str, list[TensorSpec]] = {}

    def put(ref: WeightRef, dtype: str, layout: str) -> None:
        if ref.name not in specs or layout == "panel16":  # a tied table: the lm_head's panel16 wins
            specs[ref.name] = [TensorSpec(ref.name, ref.parts, ref.shape, dtype, layout, slices=ref.slices)]

    for n in graph.nodes:
        for role, ref in zip(OPS[n.op].weight_roles, n.weights):
            if ref is None:
                continue
            if ref.quant is not None:
                specs[ref.name] = quantized_specs(n, ref)
            elif n.op == "linear" and role == "weight":
                put(ref, build.dtype, "panel16")
            elif n.op == "embedding":
                put(ref, build.dtype, "row_major")
            else:
                put(ref, "float32", "row_major")
    return [spec for name in graph.weight_names() for spec in specs[name]]


def choose_kernel(n: Node) -> tuple[str, int, list[str], dict]:
    """(op, version, weight tensor names, attrs) of the kernel that runs node n: the first
    weight's stored format picks it; every quantized weight passes its parts in order (a
    linear's weight; a moe node's gate_up and down)."""
    attrs = dict(n.attrs)
    ref = n.weights[0] if n.weights else None
    names = [part for w in n.weights if w is not None
             for part in ([w.name + p.suffix for p in w.quant.parts(w.shape)] if w.quant is not None else [w.name])]
    if ref is None or ref.quant is None:
        return n.op, OPS[n.op].version, names, attrs
    k = quant_kernel(n, ref)
    return k.op, k.version, names, dict(attrs, **k.attrs)


def lower(graph: Graph, build: BuildConfig, kv_cache: dict) -> tuple[ExecutionPlan, list[TensorSpec]]:
    graph = keep_shipped_experts(graph)
    specs = select_storage(graph, build)
    view, buffers = plan_memory(graph)
    steps = plan_calls(graph, view, choose_kernel)
    plan = ExecutionPlan(tuple(buffers), tuple(steps), dict(kv_cache), view[graph.output],
                         graph.values[graph.output].width)
    return plan, specs
