"""Lowering for the cuda target: a verified Graph -> CudaPlan (plan.py) + the tensors to store.

Memory planning is the cpu target's (builder/lower.plan_memory: views of reused buffers,
split outputs as column views, in-place outputs); buffers hold the activation dtype, the
logits fp32. Each op becomes launches of the kernels in kernels/ with the sizes of this
model as constexprs; what differs from the cpu plan:
- rope writes the rotated K and V of every row into the paged cache (the cpu target does
  that inside attention), so attention reads K and V from the cache only;
- attention is a flash prefill launch over the step's prefill tiles plus a split-K decode
  launch and its reduction over the decode rows, which merge the same 64-key blocks in the
  same order (kernels/attention.py);
- linear is a RowSwitch: one GEMM instantiation per bucket of M (tile configs below), K summed
  in the parts split_k chooses from the linear's shape (one program a part for decode rows);
- the plan ends with the device sampler (sample launches).
"""

from __future__ import annotations

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError
from bessemer.builder.lower import TensorSpec, keep_shipped_experts, plan_memory
from bessemer.format.plan import ROWS_SELECTED
from bessemer.errors import InvalidOptionError
from bessemer.targets.cuda.compile import KernelSpec
from bessemer.targets.cuda.kernel_table import QuantKernel
from bessemer.targets.cuda.plan import CudaPlan, Launch, RowSwitch
from bessemer.targets.cuda.target import TARGET

K = "bessemer.targets.cuda.kernels."
TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int32": "i32", "int8": "i8", "int4": "u8",
                "uint8": "u8",
                "float8_e4m3": "fp8e4nv"}
ELEM_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4}
# GEMM tile configs by bucket of M (rows of the step), sm_90: (max rows, BLOCK_M, BLOCK_N,
# num_warps, num_stages). Decode rows get 16-row tiles (mma.sync); from 17 rows on the tiles
# are wgmma-sized (64 / 128 rows a warpgroup). Every bucket takes K in blocks of the same
# GEMM_BLOCK_K (or the format's cap): a row's sums over K must not depend on how many rows
# share its step.
GEMM_CONFIGS = ((16, 16, 64, 4, 3), (64, 64, 64, 4, 4), (None, 128, 128, 8, 3))
GEMM_BLOCK_K = 64
# split-K for every linear's decode tiles (dense, fp8, int8, int4: kernels/split_k.py): enough
# programs for two per SM of an H100/H200 (132 SMs), so that every SM streams weights while
# few output tiles exist
SPLIT_K_PROGRAMS = 264
SPLIT_K_MAX_ROWS = 16  # the decode bucket
ATTN_BLOCK_M, ATTN_BLOCK_N = 64, 64
# rows of a grouped expert GEMM tile (kernels/moe_grouped.py), whatever the step's rows: a
# decode step's few tokens per expert fill one 16-row mma.sync tile
MOE_BLOCK_M = 16
DECODE_MIN_KEYS_PER_SPLIT = 256  # decode splits: one per 256 positions of max_seq_len, <= 16
SAMPLE_SEARCH_STEPS = 32  # bisection steps over int32 order keys: exact
# one-byte KV caches (format/kv.py dtypes) -> the kernels' KV_CODES constexpr (0: activation dtype)
KV_CODES = {"int8": 1, "float8_e4m3": 2}
ATTENTION_OPS = ("attention", "attention_sinks")


def pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class _Lowering:
    """State of one lowering: views and buffers from the memory plan, the specs to store."""

    def __init__(self, graph: Graph, build: BuildConfig, kv_dtype: str):
        self.graph, self.build, self.act = graph, build, build.dtype
        self.view, buffers = plan_memory(graph)
        logits = self.view[graph.output]
        logits_buffer = logits.buffer
        # the logits buffer is fp32; only the logits themselves (and the values computed in
        # place into them: lm_head's output before Granite's logits scaling) may live there
        if any(v.buffer == logits_buffer and v != logits for name, v in self.view.items()):
            raise GraphError("the logits buffer is shared with another value; the cuda plan keeps it fp32")
        self.buffers = [{"id": b.id, "rows": b.rows, "width": b.width,
                         "dtype": "float32" if b.id == logits_buffer else self.act} for b in buffers]
        self.tensors: dict[str, list[TensorSpec]] = {}  # weight -> its tensors (a quantized one: codes, parts)
        self.split_k = {"partials": 0, "counters": 0}  # the split-K workspace's elements (max over linears)
        self.moe: dict[str, tuple[str, int]] = {}  # moe workspace array -> (dtype, elements: max over moe nodes)
        self.kv_dtype = kv_dtype
        self.kv_codes = KV_CODES[kv_dtype] if kv_dtype in KV_CODES else 0

    def kv_params(self, layer: int) -> list:
        """The cache parameters of a layer's kernels: K and V (elements, or one-byte codes) and,
        for codes, the same K and V regions viewed as fp32 for their scales (null otherwise)."""
        elem = "*" + TRITON_TYPES[self.kv_dtype]
        params = [("k_cache_ptr", elem, {"kv": "k", "layer": layer}, True),
                  ("v_cache_ptr", elem, {"kv": "v", "layer": layer}, True)]
        for kind in "kv":
            arg = {"kv": kind, "layer": layer} if self.kv_codes else {"null": True}
            params.append((f"{kind}_scales_ptr", "*fp32", arg, bool(self.kv_codes)))
        return params

    def kv_constexprs(self) -> dict:
        return dict(KV_BLOCK_SIZE=self.build.kv_block_size, KV_CODES=self.kv_codes)

    # ---- arguments ----
    def buf(self, value: str) -> tuple[dict, str, bool, int]:
        """(arg, Triton pointer type, 16-byte aligned, row stride) of a value's view."""
        v = self.view[value]
        b = self.buffers[v.buffer]
        return ({"buffer": v.buffer, "col": v.col}, "*" + TRITON_TYPES[b["dtype"]],
                v.col * ELEM_BYTES[b["dtype"]] % 16 == 0, b["width"])

    def rows(self, value: str) -> str:
        return "selected" if self.graph.values[value].rows == ROWS_SELECTED else "tokens"

    def weight(self, ref, dtype: str) -> dict:
        if ref.name not in self.tensors:
            self.tensors[ref.name] = [TensorSpec(ref.name, ref.parts, ref.shape, dtype, "row_major", slices=ref.slices)]
        return {"weight": ref.name}

    def quantized(self, ref) -> dict[str, tuple[dict, str]]:
        """A quantized weight's stored parts (row-major, as the format's parts): role ->
        (argument, Triton pointer type)."""
        parts = ref.quant.parts(ref.shape)
        if ref.name not in self.tensors:
            self.tensors[ref.name] = [TensorSpec(ref.name + p.suffix, ref.parts, p.shape, p.dtype, "row_major",
                                                 quant=ref.quant, role=p.role, source=ref.name, slices=ref.slices)
                                      for p in parts]
        return {p.role: ({"weight": ref.name + p.suffix}, "*" + TRITON_TYPES[p.dtype]) for p in parts}

    def quant_kernel(self, op: str, ref) -> tuple[QuantKernel, list]:
        """The kernel reading a quantized weight (kernel_table.QUANT_KERNELS) and its weight
        parameters: each part it reads, or a null pointer where the format stores none."""
        kernel = TARGET.quant_kernel(op, type(ref.quant))(ref.quant, ref.shape)
        q = self.quantized(ref)
        params = [(name, q[role][1], q[role][0], True) if role in q else
                  (name, "*" + TRITON_TYPES[null_dtype], {"null": True}, False)
                  for name, role, null_dtype in kernel.parts]
        return kernel, params

    # ---- one launch ----
    def launch(self, node, family: str, function: str, grid, params: list, constexprs: dict,
               num_warps: int = 4, num_stages: int = 2) -> Launch:
        """node: the graph node (or (name, op)); params: (name, Triton type, arg, aligned)
        per runtime parameter, in kernel order."""
        name, op = node if isinstance(node, tuple) else (node.name, node.op)
        spec = KernelSpec.make(K + family, function, [(n, t) for n, t, _, _ in params], constexprs,
                               [n for n, t, _, ok in params if ok and t.startswith("*")], num_warps, num_stages)
        return Launch(name, op, spec, tuple(grid), tuple(a for _, _, a, _ in params))

    def value_param(self, name: str, value: str):
        arg, ty, aligned, _ = self.buf(value)
        return (name, ty, arg, aligned)

    def stride(self, value: str) -> int:
        return self.buf(value)[3]


def _rows_grid(count: str, *rest) -> tuple:
    return ((count, 1, 1),) + tuple(rest) + (1,) * (2 - len(rest))


def _lower_embedding(lw: _Lowering, n) -> list:
    (out,), table = n.outputs, n.weights[0]
    hidden = table.shape[1]
    block = min(1024, pow2(hidden))
    if table.quant is not None:  # the int8 table a quantized tied lm_head shares
        kernel, weights = lw.quant_kernel(n.op, table)
        return [lw.launch(n, kernel.family, kernel.function, _rows_grid("tokens", cdiv(hidden, block)), [
            ("token_ids_ptr", "*i32", {"step": "token_ids"}, True), *weights, lw.value_param("out_ptr", out)],
            dict(HIDDEN=hidden, OUT_STRIDE=lw.stride(out), BLOCK=block, **kernel.constexprs))]
    return [lw.launch(n, "embedding", "embedding_kernel", _rows_grid("tokens", cdiv(hidden, block)), [
        ("token_ids_ptr", "*i32", {"step": "token_ids"}, True),
        ("table_ptr", "*" + TRITON_TYPES[lw.act], lw.weight(table, lw.act), True),
        lw.value_param("out_ptr", out)], dict(HIDDEN=hidden, OUT_STRIDE=lw.stride(out), BLOCK=block))]


def _norm_constants(n, width: int) -> tuple[list, int]:
    scalars = [("eps", "fp32", {"f32": float(n.attrs["eps"])}, False),
               ("weight_offset", "fp32", {"f32": float(n.attrs.get("weight_offset", 0.0))}, False)]
    return scalars, (8 if width > 4096 else 4)


def _lower_rms_norm(lw: _Lowering, n) -> list:
    (x,), (y,) = n.inputs, n.outputs
    width = lw.graph.values[x].width
    scalars, warps = _norm_constants(n, width)
    return [lw.launch(n, "norm", "rms_norm_kernel", _rows_grid(lw.rows(x)), [
        lw.value_param("x_ptr", x), ("w_ptr", "*fp32", lw.weight(n.weights[0], "float32"), True),
        lw.value_param("y_ptr", y), *scalars],
        dict(N=width, X_STRIDE=lw.stride(x), Y_STRIDE=lw.stride(y), BLOCK=pow2(width)), warps)]


def _lower_add_rms_norm(lw: _Lowering, n) -> list:
    (x, res), (y, res_out) = n.inputs, n.outputs
    width = lw.graph.values[x].width
    scalars, warps = _norm_constants(n, width)
    return [lw.launch(n, "norm", "add_rms_norm_kernel", _rows_grid(lw.rows(x)), [
        lw.value_param("x_ptr", x), lw.value_param("res_ptr", res),
        ("w_ptr", "*fp32", lw.weight(n.weights[0], "float32"), True),
        lw.value_param("y_ptr", y), lw.value_param("res_out_ptr", res_out), *scalars],
        dict(N=width, X_STRIDE=lw.stride(x), RES_STRIDE=lw.stride(res), Y_STRIDE=lw.stride(y),
             RES_OUT_STRIDE=lw.stride(res_out), BLOCK=pow2(width)), warps)]


def _lower_elementwise(lw: _Lowering, n) -> list:
    (a, b), (out,) = n.inputs, n.outputs
    width = lw.graph.values[out].width
    block = min(1024, pow2(width))
    names = ("a", "b") if n.op == "add" else ("gate", "up")  # add, or a gated activation
    return [lw.launch(n, "elementwise", f"{n.op}_kernel", _rows_grid(lw.rows(out), cdiv(width, block)), [
        lw.value_param(f"{names[0]}_ptr", a), lw.value_param(f"{names[1]}_ptr", b), lw.value_param("out_ptr", out)],
        {"WIDTH": width, f"{names[0].upper()}_STRIDE": lw.stride(a), f"{names[1].upper()}_STRIDE": lw.stride(b),
         "OUT_STRIDE": lw.stride(out), "BLOCK": block})]


def _lower_sigmoid_gate_mul(lw: _Lowering, n) -> list:
    (y, gate), (out,) = n.inputs, n.outputs
    width = lw.graph.values[out].width
    block = min(1024, pow2(width))
    return [lw.launch(n, "elementwise", "sigmoid_gate_mul_kernel", _rows_grid(lw.rows(out), cdiv(width, block)), [
        lw.value_param("y_ptr", y), lw.value_param("gate_ptr", gate), lw.value_param("out_ptr", out)],
        dict(WIDTH=width, Y_STRIDE=lw.stride(y), GATE_STRIDE=lw.stride(gate), OUT_STRIDE=lw.stride(out),
             BLOCK=block))]


def _lower_scale(lw: _Lowering, n) -> list:
    (x,), (out,) = n.inputs, n.outputs
    width = lw.graph.values[out].width
    block = min(1024, pow2(width))
    return [lw.launch(n, "elementwise", "scale_kernel", _rows_grid(lw.rows(out), cdiv(width, block)), [
        lw.value_param("x_ptr", x), lw.value_param("out_ptr", out), ("factor", "fp32", {"f32": float(n.attrs["factor"])}, False)],
        dict(WIDTH=width, X_STRIDE=lw.stride(x), OUT_STRIDE=lw.stride(out), BLOCK=block))]


def _lower_rms_norm_heads(lw: _Lowering, n) -> list:
    (x,), (y,) = n.inputs, n.outputs
    heads, d = int(n.attrs["num_heads"]), int(n.attrs["head_dim"])
    scalars, warps = _norm_constants(n, heads * d)
    return [lw.launch(n, "norm", "rms_norm_heads_kernel", _rows_grid(lw.rows(x)), [
        lw.value_param("x_ptr", x), ("w_ptr", "*fp32", lw.weight(n.weights[0], "float32"), True),
        lw.value_param("y_ptr", y), *scalars],
        dict(NUM_HEADS=heads, HEAD_DIM=d, X_STRIDE=lw.stride(x), Y_STRIDE=lw.stride(y), BLOCK_HEADS=pow2(heads),
             BLOCK_D=pow2(d)), warps)]


def _lower_gather_rows(lw: _Lowering, n) -> list:
    (x,), (y,) = n.inputs, n.outputs
    width = lw.graph.values[x].width
    block = min(1024, pow2(width))
    return [lw.launch(n, "embedding", "gather_rows_kernel", _rows_grid("selected", cdiv(width, block)), [
        ("indices_ptr", "*i32", {"step": "logits_indices"}, True), lw.value_param("x_ptr", x),
        lw.value_param("out_ptr", y)], dict(WIDTH=width, X_STRIDE=lw.stride(x), OUT_STRIDE=lw.stride(y), BLOCK=block))]


def _linear_kernel(lw: _Lowering, n, w) -> tuple[str, str, list, dict, tuple[int, int]]:
    """(family, function, weight params, constexprs, (largest BLOCK_N, largest BLOCK_K)) of
    the GEMM that reads `w` as stored: dense, or its format's row of kernel_table.QUANT_KERNELS."""
    if w.quant is None:
        return "gemm", "gemm_kernel", [("w_ptr", "*" + TRITON_TYPES[lw.act], lw.weight(w, lw.act), True)], {}, \
            (128, 128)
    kernel, weights = lw.quant_kernel(n.op, w)
    return kernel.family, kernel.function, weights, dict(kernel.constexprs), kernel.max_block


def split_k(tiles: int, k: int, block_k: int) -> int:
    """Parts of K of one linear, from its shape alone: the largest divisor of K's block count
    that keeps the decode bucket's tiles x parts within SPLIT_K_PROGRAMS. Every bucket sums K
    in these parts, in order: the decode bucket one program a part (the partials summed in
    split order), the others one program looping over the parts, so that a row's result is
    the same in every bucket."""
    if k % block_k:
        return 1
    blocks, want = k // block_k, max(1, SPLIT_K_PROGRAMS // tiles)
    return max(s for s in range(1, min(want, blocks) + 1) if blocks % s == 0)


def _lower_linear(lw: _Lowering, n) -> list:
    (x,), (y,) = n.inputs, n.outputs
    w = n.weights[0]
    bias = n.weights[1] if len(n.weights) > 1 else None
    big_n, big_k = w.shape
    count = lw.rows(x)
    family, function, weights, extra, (max_bn, max_bk) = _linear_kernel(lw, n, w)
    params = [lw.value_param("x_ptr", x), *weights,
              ("bias_ptr", "*fp32", lw.weight(bias, "float32") if bias else {"null": True}, bias is not None),
              lw.value_param("y_ptr", y)]
    cases = []
    bk = min(GEMM_BLOCK_K, max_bk)
    decode_rows, decode_bm, decode_bn = GEMM_CONFIGS[0][:3]
    k_parts = split_k(cdiv(decode_rows, decode_bm) * cdiv(big_n, min(decode_bn, max_bn)), big_k, bk)
    for max_rows, bm, bn, warps, stages in GEMM_CONFIGS:
        bn = min(bn, max_bn)
        tiles = cdiv(max_rows or 1, bm) * cdiv(big_n, bn)
        parts = k_parts if max_rows is not None and max_rows <= SPLIT_K_MAX_ROWS else 1  # programs along K
        lw.split_k["partials"] = max(lw.split_k["partials"], tiles * parts * bm * bn if parts > 1 else 0)
        lw.split_k["counters"] = max(lw.split_k["counters"], tiles if parts > 1 else 0)
        workspace = [(f"{array}_ptr", dtype, {"workspace": f"split_k_{array}"} if parts > 1 else {"null": True},
                      parts > 1) for array, dtype in (("partials", "*fp32"), ("counters", "*i32"))]
        grid = ((count, bm, cdiv(big_n, bn)), parts, 1)
        cases.append((max_rows, lw.launch(n, family, function, grid, params + workspace + [
            ("M", "i32", {"count": count}, False)], dict(
            N=big_n, K=big_k, X_STRIDE=lw.stride(x), Y_STRIDE=lw.stride(y), HAS_BIAS=bias is not None,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, **extra, SPLIT_K=parts, K_PARTS=k_parts),
            warps, stages)))
    return [RowSwitch(n.name, n.op, count, tuple(cases))]


def _lower_rope(lw: _Lowering, n, attention) -> list:
    """RoPE of q (in place) and k, with k and v written into the layer's cache."""
    q, k = n.inputs
    v = attention.inputs[2]
    a = n.attrs
    heads, kv_heads, d, r = (int(a[key]) for key in ("num_heads", "num_kv_heads", "head_dim", "rotary_dim"))
    layer = int(attention.attrs["layer"])
    return [lw.launch(n, "rope", "rope_kv_write_kernel", _rows_grid("tokens"), [
        lw.value_param("q_ptr", q), lw.value_param("k_ptr", k), lw.value_param("v_ptr", v),
        ("positions_ptr", "*i32", {"step": "positions"}, True),
        ("slot_mapping_ptr", "*i32", {"step": "slot_mapping"}, True),
        ("inv_freq_ptr", "*fp32", lw.weight(n.weights[0], "float32"), True), *lw.kv_params(layer),
        ("attention_scaling", "fp32", {"f32": float(a.get("attention_scaling", 1.0))}, False)],
        dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=d, ROTARY_DIM=r, Q_STRIDE=lw.stride(q),
             K_STRIDE=lw.stride(k), V_STRIDE=lw.stride(v), BLOCK_HEADS=pow2(heads), BLOCK_KV_HEADS=pow2(kv_heads),
             BLOCK_HALF=pow2(r // 2), BLOCK_D=pow2(d), **lw.kv_constexprs()))]


def _lower_kv_write(lw: _Lowering, attention) -> list:
    """The KV-cache write of an attention whose q and k are not rotated (no rope node)."""
    _, k, v = attention.inputs
    a = attention.attrs
    kv_heads, d, layer = int(a["num_kv_heads"]), int(a["head_dim"]), int(a["layer"])
    return [lw.launch((attention.name + ".kv_write", "kv_write"), "rope", "kv_write_kernel", _rows_grid("tokens"), [
        lw.value_param("k_ptr", k), lw.value_param("v_ptr", v),
        ("slot_mapping_ptr", "*i32", {"step": "slot_mapping"}, True), *lw.kv_params(layer)],
        dict(NUM_KV_HEADS=kv_heads, HEAD_DIM=d, K_STRIDE=lw.stride(k), V_STRIDE=lw.stride(v),
             BLOCK_KV_HEADS=pow2(kv_heads), BLOCK_D=pow2(d), **lw.kv_constexprs()))]


def attention_shape(n, build: BuildConfig) -> dict:
    """Tile sizes of the attention launches of one layer (shared by the plan-level limits)."""
    heads, kv_heads = int(n.attrs["num_heads"]), int(n.attrs["num_kv_heads"])
    group = heads // kv_heads
    block_m = max(ATTN_BLOCK_M, pow2(group))
    splits = max(1, min(16, cdiv(build.max_seq_len, DECODE_MIN_KEYS_PER_SPLIT)))
    return dict(group=group, block_m=block_m, tile_tokens=block_m // group, splits=splits,
                key_blocks=cdiv(build.max_seq_len, ATTN_BLOCK_N))


def _lower_attention(lw: _Lowering, n) -> list:
    q, out = n.inputs[0], n.outputs[0]  # k and v went into the cache with the rope launch
    a = n.attrs
    heads, kv_heads, d, layer = (int(a[key]) for key in ("num_heads", "num_kv_heads", "head_dim", "layer"))
    shape = attention_shape(n, lw.build)
    cache = [*lw.kv_params(layer), ("block_tables_ptr", "*i32", {"step": "block_tables"}, True),
             ("cu_seqlens_ptr", "*i32", {"step": "cu_seqlens"}, True),
             ("context_lens_ptr", "*i32", {"step": "context_lens"}, True)]
    scale = ("scale", "fp32", {"f32": float(a["scale"])}, False)
    sinks = n.op == "attention_sinks"
    sinks_param = ("sinks_ptr", "*fp32", lw.weight(n.weights[0], "float32") if sinks else {"null": True}, sinks)
    common = dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=d, Q_STRIDE=lw.stride(q),
                  KV_BLOCK_SIZE=lw.build.kv_block_size, BLOCK_TABLE_STRIDE=cdiv(lw.build.max_seq_len, lw.build.kv_block_size),
                  SLIDING_WINDOW=int(a.get("sliding_window", 0)), BLOCK_N=ATTN_BLOCK_N, BLOCK_D=pow2(d),
                  KV_CODES=lw.kv_codes)
    prefill = lw.launch(n, "attention", "attention_prefill_kernel", (("prefill_tiles", 1, 1), kv_heads, 1), [
        lw.value_param("q_ptr", q), lw.value_param("out_ptr", out), *cache,
        ("prefill_tiles_ptr", "*i32", {"step": "prefill_tiles"}, True), sinks_param, scale],
        dict(common, OUT_STRIDE=lw.stride(out), TILE_TOKENS=shape["tile_tokens"], BLOCK_M=shape["block_m"],
             HAS_SINKS=sinks))
    partials = ("partials_ptr", "*fp32", {"workspace": "attn_partials"}, True)
    decode = lw.launch(n, "attention", "attention_decode_kernel", (("decode_seqs", 1, 1), kv_heads, shape["splits"]), [
        lw.value_param("q_ptr", q), *cache, ("decode_seqs_ptr", "*i32", {"step": "decode_seqs"}, True), partials, scale],
        dict(common, NUM_SPLITS=shape["splits"], MAX_KEY_BLOCKS=shape["key_blocks"], BLOCK_G=shape["block_m"]),
        num_stages=3)
    reduce = lw.launch(n, "attention", "attention_decode_reduce_kernel", (("decode_seqs", 1, 1), heads, 1), [
        partials, ("cu_seqlens_ptr", "*i32", {"step": "cu_seqlens"}, True),
        ("context_lens_ptr", "*i32", {"step": "context_lens"}, True),
        ("decode_seqs_ptr", "*i32", {"step": "decode_seqs"}, True), lw.value_param("out_ptr", out), sinks_param],
        dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=d, OUT_STRIDE=lw.stride(out),
             SLIDING_WINDOW=common["SLIDING_WINDOW"], MAX_KEY_BLOCKS=shape["key_blocks"], BLOCK_N=ATTN_BLOCK_N,
             BLOCK_D=pow2(d), HAS_SINKS=sinks))
    return [prefill, decode, reduce]


def _sample_launch(lw: _Lowering, logits: str) -> Launch:
    vocab = lw.graph.values[logits].width
    block = min(4096, pow2(vocab))
    return lw.launch(("sampler", "sample"), "sampling", "sample_kernel", _rows_grid("selected"), [
        lw.value_param("logits_ptr", logits), ("temperature_ptr", "*fp32", {"step": "temperature"}, True),
        ("top_k_ptr", "*i32", {"step": "top_k"}, True), ("top_p_ptr", "*fp32", {"step": "top_p"}, True),
        ("uniform_ptr", "*fp32", {"step": "uniform"}, True), ("tokens_ptr", "*i32", {"step": "sampled_tokens"}, True)],
        dict(V=vocab, LOGITS_STRIDE=lw.stride(logits), BLOCK=block, SEARCH_STEPS=SAMPLE_SEARCH_STEPS),
        num_warps=8 if block >= 2048 else 4)


def _step_inputs(build: BuildConfig, tile_tokens: int) -> tuple:
    t, s = build.max_num_tokens, build.max_batch_size
    blocks = cdiv(build.max_seq_len, build.kv_block_size)
    sizes = [("token_ids", t), ("positions", t), ("slot_mapping", t), ("cu_seqlens", s + 1), ("context_lens", s),
             ("block_tables", s * blocks), ("logits_indices", t), ("prefill_tiles", 2 * (cdiv(t, tile_tokens) + s)),
             ("decode_seqs", s), ("temperature", t), ("top_k", t), ("top_p", t), ("uniform", t), ("sampled_tokens", t)]
    floats = {"temperature", "top_p", "uniform"}
    return tuple({"name": n, "dtype": "float32" if n in floats else "int32", "elems": e} for n, e in sizes)


def _moe_workspace(lw: _Lowering, *arrays: tuple[str, str, int]) -> dict:
    """Workspace arguments of a moe node's arrays (name, dtype, elements): each array is sized
    for the largest node that uses it."""
    for name, dtype, elems in arrays:
        lw.moe[name] = (dtype, max(lw.moe.get(name, (dtype, 0))[1], elems))
    return {name: {"workspace": name} for name, _, _ in arrays}


def _lower_moe(lw: _Lowering, n) -> list:
    """Routing, then the routed experts: per-token GEMVs over experts stored in the activation
    dtype (kernels/moe.py), or the tokens grouped by expert and one GEMM per active expert
    over quantized experts (kernels/moe_grouped.py), through a workspace of [tokens, top_k]
    experts, weights and intermediate activations."""
    (x, logits), (y,) = n.inputs, n.outputs
    a = n.attrs
    top_k, experts = int(a["top_k"]), int(a["num_experts"])
    if int(a.get("first_expert", 0)) or int(a.get("local_experts", experts)) != experts:
        raise GraphError(f"{n.name}: experts split across ranks; the cuda target builds one rank")
    count = lw.build.max_num_tokens * top_k
    work = _moe_workspace(lw, ("moe_experts", "int32", count), ("moe_weights", "float32", count))
    route = lw.launch((n.name + ".route", "moe"), "moe", "moe_route_kernel", _rows_grid("tokens"), [
        lw.value_param("logits_ptr", logits), ("experts_ptr", "*i32", work["moe_experts"], True),
        ("weights_ptr", "*fp32", work["moe_weights"], True)],
        dict(LOGITS_STRIDE=lw.stride(logits), NUM_EXPERTS=experts, TOP_K=top_k,
             SOFTMAX_AFTER_TOPK=bool(int(a["softmax_after_topk"])), NORM_TOPK_PROB=bool(int(a["norm_topk_prob"])),
             BLOCK_E=pow2(experts)))
    has_bias = len(n.weights) > 2
    biases = [lw.weight(w, "float32") if has_bias else {"null": True} for w in (n.weights[2:4] if has_bias else (None, None))]
    experts_of = _lower_moe_grouped if n.weights[0].quant is not None else _lower_moe_per_token
    return [route] + experts_of(lw, n, work, biases, has_bias)


def _lower_moe_per_token(lw: _Lowering, n, work: dict, biases: list, has_bias: bool) -> list:
    (x, _), (y,) = n.inputs, n.outputs
    a = n.attrs
    hidden, size, top_k = lw.graph.values[x].width, int(a["expert_size"]), int(a["top_k"])
    work = dict(work, **_moe_workspace(lw, ("moe_h", "float32", lw.build.max_num_tokens * top_k * size)))
    act = "*" + TRITON_TYPES[lw.act]
    gate_up, down = (lw.weight(w, lw.act) for w in n.weights[:2])
    if int(a.get("layout", 0)) == 1:  # (E, H, 2I) gate/up interleaved, (E, I, H)
        gu = dict(EXPERT_STRIDE=hidden * 2 * size, ROW_STRIDE=2, K_STRIDE=2 * size, UP_OFFSET=1,
                  BIAS_ROW_STRIDE=2, BIAS_UP_OFFSET=1)
        dn = dict(EXPERT_STRIDE=size * hidden, OUT_STRIDE=1, I_STRIDE=hidden)
    else:  # (E * 2I, H) [gate; up] per expert, (E * H, I)
        gu = dict(EXPERT_STRIDE=2 * size * hidden, ROW_STRIDE=hidden, K_STRIDE=1, UP_OFFSET=size * hidden,
                  BIAS_ROW_STRIDE=1, BIAS_UP_OFFSET=size)
        dn = dict(EXPERT_STRIDE=hidden * size, OUT_STRIDE=size, I_STRIDE=1)
    block_i, block_h = min(64, pow2(size)), min(64, pow2(hidden))
    gate_up_launch = lw.launch((n.name + ".gate_up", "moe"), "moe", "moe_gate_up_kernel",
                               (("tokens", 1, 1), top_k, cdiv(size, block_i)), [
        lw.value_param("x_ptr", x), ("experts_ptr", "*i32", work["moe_experts"], True),
        ("gate_up_ptr", act, gate_up, True), ("gate_up_bias_ptr", "*fp32", biases[0], has_bias),
        ("h_ptr", "*fp32", work["moe_h"], True)],
        dict(X_STRIDE=lw.stride(x), HIDDEN=hidden, EXPERT_SIZE=size, TOP_K=top_k, HAS_BIAS=has_bias,
             ACTIVATION=int(a.get("activation", 0)), BLOCK_I=block_i, BLOCK_K=min(64, pow2(hidden)), **gu))
    down_launch = lw.launch(n, "moe", "moe_down_kernel", _rows_grid("tokens", cdiv(hidden, block_h)), [
        ("h_ptr", "*fp32", work["moe_h"], True), ("experts_ptr", "*i32", work["moe_experts"], True),
        ("weights_ptr", "*fp32", work["moe_weights"], True), ("down_ptr", act, down, True),
        ("down_bias_ptr", "*fp32", biases[1], has_bias), lw.value_param("y_ptr", y)],
        dict(Y_STRIDE=lw.stride(y), HIDDEN=hidden, EXPERT_SIZE=size, TOP_K=top_k, HAS_BIAS=has_bias,
             BLOCK_H=block_h, BLOCK_I=block_i, **dn))
    return [gate_up_launch, down_launch]


def _lower_moe_grouped(lw: _Lowering, n, work: dict, biases: list, has_bias: bool) -> list:
    """Quantized experts (kernel_table.QUANT_KERNELS' moe rows): sort the routed slots by
    expert, then grouped gate/up and down GEMMs and the slot-ordered combine. One tile config
    per weight shape, whatever the step's rows (batch invariance: kernels/moe_grouped.py)."""
    (x, _), (y,) = n.inputs, n.outputs
    a = n.attrs
    hidden, size = lw.graph.values[x].width, int(a["expert_size"])
    top_k, experts = int(a["top_k"]), int(a["num_experts"])
    count = lw.build.max_num_tokens * top_k
    work = dict(work, **_moe_workspace(lw, ("moe_sorted", "int32", count), ("moe_starts", "int32", experts + 1),
                                       ("moe_h_grouped", lw.act, count * size),
                                       ("moe_out", "float32", count * hidden)))
    block_e = pow2(experts)
    # programs of the expert-tile axis: at least cdiv(T top_k, BLOCK_M); each loops over its
    # share of the (at most cdiv(T top_k, BLOCK_M) + E) tiles
    programs = ("tokens", MOE_BLOCK_M, top_k)
    sort = lw.launch((n.name + ".sort", "moe"), "moe_grouped", "moe_sort_kernel", (1, 1, 1), [
        ("experts_ptr", "*i32", work["moe_experts"], True), ("sorted_ptr", "*i32", work["moe_sorted"], True),
        ("starts_ptr", "*i32", work["moe_starts"], True), ("T", "i32", {"count": "tokens"}, False)],
        dict(TOP_K=top_k, NUM_EXPERTS=experts, BLOCK=max(16, 4096 // block_e), BLOCK_E=block_e))
    grouped = [("sorted_ptr", "*i32", work["moe_sorted"], True), ("starts_ptr", "*i32", work["moe_starts"], True)]
    h = ("h_ptr", "*" + TRITON_TYPES[lw.act], work["moe_h_grouped"], True)

    def gemm(w, n_out: int, bias) -> tuple:
        """(kernel, runtime parameters from the sorted rows to the bias, constexprs, grid) of
        the grouped GEMM reading w, whose experts have n_out output rows each."""
        kernel, weights = lw.quant_kernel(n.op, w)
        max_bn, max_bk = kernel.max_block
        tiles = dict(BLOCK_M=MOE_BLOCK_M, BLOCK_N=max(16, min(max_bn, pow2(n_out))), BLOCK_K=max_bk,
                     BLOCK_E=block_e, HAS_BIAS=has_bias, **kernel.constexprs)
        return (kernel, grouped + weights + [("bias_ptr", "*fp32", bias, has_bias)], tiles,
                (programs, cdiv(n_out, tiles["BLOCK_N"]), 1))

    kernel, params, tiles, grid = gemm(n.weights[0], size, biases[0])
    rows = dict(ROW_STRIDE=2, UP_OFFSET=1) if int(a.get("layout", 0)) == 1 else dict(ROW_STRIDE=1, UP_OFFSET=size)
    gate_up = lw.launch((n.name + ".gate_up", "moe"), kernel.family, kernel.function, grid, [
        lw.value_param("x_ptr", x), *params, h],
        dict(X_STRIDE=lw.stride(x), HIDDEN=hidden, EXPERT_SIZE=size, TOP_K=top_k, NUM_EXPERTS=experts,
             ACTIVATION=int(a.get("activation", 0)), **rows, **tiles))
    kernel, params, tiles, grid = gemm(n.weights[1], hidden, biases[1])
    down = lw.launch((n.name + ".down", "moe"), kernel.family, "moe_down_grouped_kernel", grid, [
        h, *params, ("out_ptr", "*fp32", work["moe_out"], True)],
        dict(HIDDEN=hidden, EXPERT_SIZE=size, NUM_EXPERTS=experts, **tiles))
    block_h = min(256, pow2(hidden))
    combine = lw.launch(n, "moe_grouped", "moe_combine_kernel", _rows_grid("tokens", cdiv(hidden, block_h)), [
        ("out_ptr", "*fp32", work["moe_out"], True), ("weights_ptr", "*fp32", work["moe_weights"], True),
        lw.value_param("y_ptr", y)], dict(Y_STRIDE=lw.stride(y), HIDDEN=hidden, TOP_K=top_k, BLOCK_H=block_h))
    return [sort, gate_up, down, combine]


LOWERINGS = {"embedding": _lower_embedding, "rms_norm": _lower_rms_norm, "add_rms_norm": _lower_add_rms_norm,
             "add": _lower_elementwise, "silu_mul": _lower_elementwise, "gelu_tanh_mul": _lower_elementwise,
             "scale": _lower_scale, "rms_norm_heads": _lower_rms_norm_heads, "gather_rows": _lower_gather_rows,
             "linear": _lower_linear, "attention": _lower_attention, "attention_sinks": _lower_attention,
             "moe": _lower_moe, "sigmoid_gate_mul": _lower_sigmoid_gate_mul}


def check_supported(graph: Graph) -> None:
    """Every op and every quantized weight has a kernel here (kernel_table.py), named with
    its node before anything is lowered."""
    for n in graph.nodes:
        if not TARGET.has_kernel(n.op):
            raise InvalidOptionError(f"{n.name}: op {n.op} has no cuda kernel yet; build this model with --target cpu")
        for w in n.weights:
            if w is not None and w.quant is not None:
                try:
                    TARGET.quant_kernel(n.op, type(w.quant))(w.quant, w.shape)
                except InvalidOptionError as e:
                    raise InvalidOptionError(f"{n.name}: {e}") from None


def lower_cuda(graph: Graph, build: BuildConfig, model_kv: dict) -> tuple[CudaPlan, list[TensorSpec]]:
    graph = keep_shipped_experts(graph)
    check_supported(graph)
    if model_kv["dtype"] in KV_CODES and model_kv["head_dim"] % 4:
        raise InvalidOptionError(f"--kv-cache-dtype {build.kv_cache_dtype} on the cuda target needs a head_dim "
                                 f"that is a multiple of 4 (its fp32 scales follow the codes), not "
                                 f"{model_kv['head_dim']}; drop --kv-cache-dtype")
    kv_dtype = model_kv["dtype"] if model_kv["dtype"] in KV_CODES else build.dtype
    lw = _Lowering(graph, build, kv_dtype)
    consumers = graph.consumers()
    attentions = [n for n in graph.nodes if n.op in ATTENTION_OPS]
    shapes = {tuple(sorted(attention_shape(n, build).items())) for n in attentions}
    if len(shapes) > 1:
        raise GraphError("attention layers differ in their head grouping; the cuda plan has one tile size")
    shape = attention_shape(attentions[0], build) if attentions else dict(tile_tokens=1, key_blocks=1, group=1)
    # the rope launch writes the KV cache; an attention without one (a NoPE layer) gets a plain write
    rope_users = {c.name for n in graph.nodes if n.op == "rope" for c in consumers[n.outputs[0]]}
    if lw.rows(graph.output) != "selected" or lw.view[graph.output].col != 0:
        raise GraphError("the logits must be a whole buffer of selected rows (gather_rows before lm_head)")
    forward = []
    for n in graph.nodes:
        if n.op == "rope":
            forward += _lower_rope(lw, n, consumers[n.outputs[0]][0])
        elif n.op in ATTENTION_OPS and n.name not in rope_users:
            forward += _lower_kv_write(lw, n) + _lower_attention(lw, n)
        elif n.op != "split":  # split outputs are column views: no launch
            forward += LOWERINGS[n.op](lw, n)
    kv_heads, d = model_kv["num_kv_heads"], model_kv["head_dim"]
    # every key block's partial of every decode row, fp32: about G / 64 of the bf16 keys and
    # values of the same positions in one layer's cache, reused by every layer
    workspace = ({"name": "attn_partials", "dtype": "float32",
                  "elems": build.max_batch_size * kv_heads * shape["key_blocks"] * shape["group"] * (d + 2)},)
    workspace += tuple({"name": name, "dtype": dtype, "elems": elems} for name, (dtype, elems) in lw.moe.items())
    if lw.split_k["counters"]:
        workspace += ({"name": "split_k_partials", "dtype": "float32", "elems": lw.split_k["partials"]},
                      {"name": "split_k_counters", "dtype": "int32", "elems": lw.split_k["counters"]})
    plan = CudaPlan(
        act_dtype=lw.act,
        limits={"max_num_tokens": build.max_num_tokens, "max_batch_size": build.max_batch_size,
                "max_blocks_per_seq": cdiv(build.max_seq_len, build.kv_block_size),
                "kv_block_size": build.kv_block_size},
        buffers=tuple(lw.buffers), workspace=workspace, step_inputs=_step_inputs(build, shape["tile_tokens"]),
        kv_cache=dict(model_kv, dtype=kv_dtype), attention={"tile_tokens": shape["tile_tokens"]},
        forward=tuple(forward), sample=(_sample_launch(lw, graph.output),),
        logits={"buffer": lw.view[graph.output].buffer, "width": graph.values[graph.output].width},
        vocab_size=graph.values[graph.output].width)
    order = graph.weight_names()
    return plan, [spec for name in order if name in lw.tensors for spec in lw.tensors[name]]
