"""Lowering: a verified Graph -> one rank's ExecutionPlan plus the tensors to pack.

Two steps, each a plain function:
- select_storage: the dtype and layout each weight is stored in for the cpu kernels.
- plan_memory: assigns every value a view of an activation buffer. `split` outputs become
  column views of their input (no copy), ops that declare in-place outputs reuse an input's
  view when that input dies there, and buffers whose values are dead are reused by later
  values of the same rows kind and width.
"""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph, GraphError, WeightRef
from bessemer.format.kv import kv_cache_section
from bessemer.format.plan import Buffer, ExecutionPlan, KernelCall, View
from bessemer.plugins.ops import OPS
from bessemer.quantization.primitives import GROUP_PARAM_DTYPE


# Kernels that only rotate/overwrite their inputs; the plan lists no outputs for them.
IN_PLACE_ONLY = {"rope"}
# Kernels that implement a graph op for a stored format other than the op's own.
KERNEL_VERSIONS = {"linear_w8a16": 1, "linear_w4a16": 2, "linear_w8a8": 1, "linear_fp8": 1, "embedding_w8a16": 1}
# Stored parts of a quantized weight besides its codes, in plan order.
QUANT_PARTS = ("scales", "offsets", "wsum", "smooth", "input_scale")


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the rank file: its HF parts (concatenated on axis 0) or a graph constant;
    for a quantized weight, one of its stored parts (`role`: codes, scales or offsets)."""

    name: str
    parts: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    layout: str
    quant: tuple = ()  # WeightRef.quant of the weight this tensor stores
    role: str = "data"  # data | codes | scales | offsets | wsum | smooth | input_scale
    source: str = ""  # the (fp32) weight a quantized part is derived from
    slices: tuple = ()  # WeightRef.slices: this rank's range of each part (tensor parallelism)


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


def lower(graph: Graph, build: BuildConfig, model_kv: dict) -> tuple[ExecutionPlan, list[TensorSpec]]:
    specs = select_storage(graph, build)
    view, buffers = plan_memory(graph)
    steps = []
    for n in graph.nodes:
        if n.op == "split":
            continue
        decl = OPS[n.op]
        ins, outs = tuple(view[v] for v in n.inputs), tuple(view[v] for v in n.outputs)
        if n.op in IN_PLACE_ONLY:
            if outs != ins:
                raise GraphError(f"{n.name}: {n.op} works in place, but its inputs are still read later")
            outs = ()
        op, weights, attrs = n.op, [w.name for w in n.weights if w is not None], dict(n.attrs)
        if n.op == "linear":
            op, names, extra = linear_kernel(n.weights[0])
            weights = names + weights[1:]
            attrs.update(extra)
        elif n.op == "embedding":
            op, weights = embedding_kernel(n.weights[0])
        steps.append(KernelCall(
            op=op, version=KERNEL_VERSIONS.get(op, decl.version), node=n.name, ins=ins, outs=outs,
            weights=tuple(weights), attrs={k: float(v) for k, v in attrs.items()}))
    vocab = graph.values[graph.output].width
    kv = kv_cache_section(model_kv["num_layers"], model_kv["num_kv_heads"], model_kv["head_dim"],
                          build.resolved_kv_dtype)
    plan = ExecutionPlan(tuple(buffers), tuple(steps), kv, view[graph.output], vocab)
    return plan, list(specs.values())
