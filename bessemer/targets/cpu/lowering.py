"""Lowering for the cpu target: the dtype and layout every weight is stored in, and the
C++ kernel (op@version) that runs every node.

- Linear weights: panel16 in the build dtype (what the GEMM/GEMV kernels read); quantized
  ones in their stored format's parts (int8 panel16, int4 panel16_int4_k8, int8 vnni16, ...).
- An embedding table shared with lm_head (tied) is stored once, panel16 (int8 panel16 when
  lm_head is quantized); the embedding kernel gathers its rows with stride 16.
- Norms, biases, constants: fp32 row-major.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph, GraphError, Node, WeightRef
from bessemer.builder.lower import TensorSpec, plan_calls, plan_memory
from bessemer.format.plan import ExecutionPlan
from bessemer.plugins.ops import OPS
from bessemer.quantization.formats import Fp8E4M3, Int4Group, Int8PerChannel, W8A8

@dataclass(frozen=True)
class QuantKernel:
    """The cpu kernel that reads weights of one stored format, and its parts' layouts."""

    op: str
    version: int
    layouts: dict  # part role -> layout; parts not named are row_major
    attrs: dict = field(default_factory=dict)


def _int4(fmt: Int4Group, shape) -> QuantKernel:
    # codes as linear_w4a16 reads them fastest: panel16_int4_k8 (two instructions per 32
    # weights) when K % 8 == 0, else panel16_int4; @3 reads symmetric codes (no offsets)
    codes = "panel16_int4_k8" if shape[1] % 8 == 0 else "panel16_int4"
    return QuantKernel("linear_w4a16", 2 if fmt.zero_point else 3,
                       {"codes": codes, "scales": "panel16", "offsets": "panel16"}, {"group_size": fmt.group_size})


# (graph op, stored format) -> the kernel reading it. A tied embedding table quantized with
# lm_head is gathered by embedding_w8a16 from the same int8 panel16 tensors.
QUANT_KERNELS = {
    ("linear", Int8PerChannel): lambda fmt, shape: QuantKernel("linear_w8a16", 1, {"codes": "panel16"}),
    ("linear", Int4Group): _int4,
    ("linear", W8A8): lambda fmt, shape: QuantKernel("linear_w8a8", 1, {"codes": "vnni16"},
                                                     {"has_smooth": 1} if fmt.smooth else {}),
    # @2: dynamic per-token activation scales computed in the kernel; @1: the stored static one
    ("linear", Fp8E4M3): lambda fmt, shape: QuantKernel("linear_fp8", 2 if fmt.dynamic else 1, {"codes": "panel16"}),
    ("embedding", Int8PerChannel): lambda fmt, shape: QuantKernel("embedding_w8a16", 1, {"codes": "panel16"}),
}


def quant_kernel(node: Node, ref: WeightRef) -> QuantKernel:
    choose = QUANT_KERNELS.get((node.op, type(ref.quant)))
    if choose is None:
        raise GraphError(f"{node.name}: the cpu target has no {node.op} kernel for {ref.quant.describe()} weights")
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
    """(op, version, weight tensor names, attrs) of the kernel that runs node n."""
    weights, attrs = [w.name for w in n.weights if w is not None], dict(n.attrs)
    ref = n.weights[0] if n.weights else None
    if ref is None or ref.quant is None:
        return n.op, OPS[n.op].version, weights, attrs
    k = quant_kernel(n, ref)
    names = [ref.name + p.suffix for p in ref.quant.parts(ref.shape)]
    return k.op, k.version, names + weights[1:], dict(attrs, **k.attrs)


def lower(graph: Graph, build: BuildConfig, kv_cache: dict) -> tuple[ExecutionPlan, list[TensorSpec]]:
    specs = select_storage(graph, build)
    view, buffers = plan_memory(graph)
    steps = plan_calls(graph, view, choose_kernel)
    plan = ExecutionPlan(tuple(buffers), tuple(steps), dict(kv_cache), view[graph.output],
                         graph.values[graph.output].width)
    return plan, specs
