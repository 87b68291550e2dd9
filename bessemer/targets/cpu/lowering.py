"""Lowering for the cpu target: the dtype and layout every weight is stored in, and the
C++ kernel (op@version) that runs every node.

- Linear weights: panel16 in the build dtype (what the GEMM/GEMV kernels read); quantized
  ones in their stored format's parts (int8 panel16, int4 panel16_int4_k8, int8 vnni16, ...).
- An embedding table shared with lm_head (tied) is stored once, panel16 (int8 panel16 when
  lm_head is quantized); the embedding kernel gathers its rows with stride 16.
- Norms, biases, constants: fp32 row-major.
"""

from __future__ import annotations

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph, GraphError, Node, WeightRef
from bessemer.builder.lower import TensorSpec, plan_calls, plan_memory
from bessemer.format.plan import ExecutionPlan
from bessemer.plugins.ops import OPS
from bessemer.quantization.primitives import GROUP_PARAM_DTYPE

# Kernels that implement a graph op for a stored format other than the op's own.
KERNEL_VERSIONS = {"linear_w8a16": 1, "linear_w4a16": 2, "linear_w8a8": 1, "linear_fp8": 1, "embedding_w8a16": 1}
# Stored parts of a quantized weight besides its codes, in plan order.
QUANT_PARTS = ("scales", "offsets", "wsum", "smooth", "input_scale")


def int4_codes_layout(k: int) -> str:
    """Layout int4 codes of a K-column matrix are stored in (what linear_w4a16@2 reads fastest)."""
    return "panel16_int4_k8" if k % 8 == 0 else "panel16_int4"


def quantized_specs(ref: WeightRef) -> list[TensorSpec]:
    """Stored parts of a quantized linear weight (layouts: format/layouts.py)."""
    q = dict(ref.quant)
    n, k = ref.shape
    common = dict(parts=ref.parts, quant=ref.quant, source=ref.name, slices=ref.slices)
    if q.get("act_bits") == 8:
        specs = [TensorSpec(ref.name, shape=(n, k), dtype="int8", layout="vnni16", role="codes", **common),
                 TensorSpec(f"{ref.name}.scales", shape=(n,), dtype="float32", layout="row_major",
                            role="scales", **common),
                 TensorSpec(f"{ref.name}.wsum", shape=(n,), dtype="int32", layout="row_major", role="wsum", **common)]
        if q["smooth"]:
            specs.append(TensorSpec(f"{ref.name}.smooth", shape=(k,), dtype="float32", layout="row_major",
                                    role="smooth", **common))
        return specs
    if q.get("dtype") == "float8_e4m3":  # + the static activation scale of this input
        return [TensorSpec(ref.name, shape=(n, k), dtype="float8_e4m3", layout="panel16", role="codes", **common),
                TensorSpec(f"{ref.name}.scales", shape=(n,), dtype="float32", layout="row_major",
                           role="scales", **common),
                TensorSpec(f"{ref.name}.input_scale", shape=(1,), dtype="float32", layout="row_major",
                           role="input_scale", **common)]
    if q["bits"] == 8:
        return [TensorSpec(ref.name, shape=(n, k), dtype="int8", layout="panel16", role="codes", **common),
                TensorSpec(f"{ref.name}.scales", shape=(n,), dtype="float32", layout="row_major",
                           role="scales", **common)]
    groups = k // q["group_size"]
    return [TensorSpec(ref.name, shape=(n, k), dtype="int4", layout=int4_codes_layout(k), role="codes", **common),
            TensorSpec(f"{ref.name}.scales", shape=(n, groups), dtype=GROUP_PARAM_DTYPE, layout="panel16",
                       role="scales", **common),
            TensorSpec(f"{ref.name}.offsets", shape=(n, groups), dtype=GROUP_PARAM_DTYPE, layout="panel16",
                       role="offsets", **common)]


def linear_kernel(ref: WeightRef) -> tuple[str, list[str], dict]:
    """(op, weight tensor names, extra attrs) of the kernel that reads `ref` as stored."""
    if not ref.quant:
        return "linear", [ref.name], {}
    q = dict(ref.quant)
    if q.get("act_bits") == 8:
        names = [ref.name, f"{ref.name}.scales", f"{ref.name}.wsum"] + ([f"{ref.name}.smooth"] if q["smooth"] else [])
        return "linear_w8a8", names, {"has_smooth": 1} if q["smooth"] else {}
    if q.get("dtype") == "float8_e4m3":
        return "linear_fp8", [ref.name, f"{ref.name}.scales", f"{ref.name}.input_scale"], {}
    if q["bits"] == 8:
        return "linear_w8a16", [ref.name, f"{ref.name}.scales"], {}
    return "linear_w4a16", [ref.name, f"{ref.name}.scales", f"{ref.name}.offsets"], {"group_size": q["group_size"]}


def embedding_kernel(ref: WeightRef) -> tuple[str, list[str]]:
    """(op, weight tensor names) of the kernel that gathers rows of `ref` as stored; a
    quantized table is the int8 one of a tied lm_head (passes/quantize.py)."""
    if not ref.quant:
        return "embedding", [ref.name]
    if dict(ref.quant)["bits"] != 8:
        raise GraphError(f"{ref.name}: the embedding reads int8 tables only, not {dict(ref.quant)['bits']}-bit")
    return "embedding_w8a16", [ref.name, f"{ref.name}.scales"]


def select_storage(graph: Graph, build: BuildConfig) -> dict[str, TensorSpec]:
    """Linear weights: panel16 in the build dtype (what the GEMM/GEMV kernels read).
    An embedding table shared with lm_head (tied) is stored once, panel16 (int8 panel16 when
    lm_head is quantized); the embedding kernel gathers its rows with stride 16. Norms,
    biases, constants: fp32 row-major."""
    specs: dict[str, TensorSpec] = {}

    def put(ref: WeightRef, dtype: str, layout: str) -> None:
        if ref.name not in specs or layout == "panel16":
            specs[ref.name] = TensorSpec(ref.name, ref.parts, ref.shape, dtype, layout, slices=ref.slices)

    for n in graph.nodes:
        for role, ref in zip(OPS[n.op].weight_roles, n.weights):
            if ref is None:
                continue
            if n.op in ("linear", "embedding") and ref.quant:
                for spec in quantized_specs(ref):
                    specs[spec.name] = spec
            elif n.op == "linear" and role == "weight":
                put(ref, build.dtype, "panel16")
            elif n.op == "embedding":
                put(ref, build.dtype, "row_major")
            else:
                put(ref, "float32", "row_major")
    # plan order; the parts of a quantized weight follow it
    order = graph.weight_names()
    ordered = {}
    for name in order:
        for key in (name,) + tuple(f"{name}.{part}" for part in QUANT_PARTS):
            if key in specs:
                ordered[key] = specs[key]
    return ordered


def choose_kernel(n: Node) -> tuple[str, int, list[str], dict]:
    op, weights, attrs = n.op, [w.name for w in n.weights if w is not None], dict(n.attrs)
    if n.op == "linear":
        op, names, extra = linear_kernel(n.weights[0])
        weights = names + weights[1:]
        attrs.update(extra)
    elif n.op == "embedding":
        op, weights = embedding_kernel(n.weights[0])
    return op, KERNEL_VERSIONS.get(op, OPS[n.op].version), weights, attrs


def lower(graph: Graph, build: BuildConfig, kv_cache: dict) -> tuple[ExecutionPlan, list[TensorSpec]]:
    specs = select_storage(graph, build)
    view, buffers = plan_memory(graph)
    steps = plan_calls(graph, view, choose_kernel)
    plan = ExecutionPlan(tuple(buffers), tuple(steps), dict(kv_cache), view[graph.output],
                         graph.values[graph.output].width)
    return plan, list(specs.values())
