"""ExecutionPlan: what one rank's runtime executes, step after step.

A plan is a flat list of kernel calls over activation buffers. It is stored in the rank
file's JSON header under "plan" and executed by a target's executor (the cpu one:
targets/cpu/csrc), which resolves every `op@version` to a kernel once at load time and
refuses unknown ones.

Plan JSON::

    {"buffers": [{"id": 0, "width": 576, "rows": "tokens"}, ...],
     "steps":   [{"op": "linear", "version": 1,
                  "ins":  [[buf, col, width], ...],     # operand views, see below
                  "outs": [[buf, col, width], ...],
                  "weights": ["model.layers.0.self_attn.qkv_proj.weight", ...],
                  "attrs": {"name": number, ...}}, ...],
     "kv_cache": {"num_layers": L, "num_kv_heads": Hkv, "head_dim": D, "dtype": "float32"},
     "logits": [buf, col, width],
     "vocab_size": V}

Buffers are matrices of the target's activation type (cpu: float32) with one row per token
of the step ("tokens": T rows) or one row per selected token ("selected": L rows, the rows
named by the step's logits_indices).
Their width is fixed; the executor grows their storage to the step's row count.
An operand view [buf, col, width] is the column range [col, col+width) of every row of
buffer `buf`; its row stride is the buffer's width. Views let the fused qkv output feed
rope and attention, and the fused gate_up output feed silu_mul, without copies.

Step inputs: the six int32 arrays of format/step.py (StepBatch: token_ids, positions,
cu_seqlens, context_lens, block_tables, logits_indices). Logits come back as float32 on
every target. How a target runs a step (threads, scratch, device memory) is its own: the
plan promises only the views, weights, attrs and the semantics below.

Kernels (attrs are numbers; weights are names in the rank file's tensor table):

    embedding@1    outs [x]; weights [table ([V, H] row_major or panel16; f32/bf16)]
                   x[t] = table[token_ids[t]]
    embedding_w8a16@1 outs [x]; weights [q (int8 panel16 [V, H]), scales (f32 row_major [V])]
                   x[t] = q[token_ids[t]] * scales[token_ids[t]]: the int8 table of a tied,
                   quantized lm_head (linear_w8a16 reads the same tensors)
    embedding_w4a16@1 outs [x]; weights [codes (int4 panel16_int4_k8 [V, H]), scales (bf16
                   panel16 [V, H / G])]; attrs group_size; x[t][k] = scale * (code - 8): the
                   symmetric int4 table of a tied lm_head stored for linear_w4a16@3
    rms_norm@1     ins [x]; outs [y]; weights [w]; attrs eps, weight_offset
                   y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset)
    add_rms_norm@1 ins [x, residual]; outs [y, residual_out]; weights [w]; attrs eps, weight_offset
                   residual_out = x + residual; y = rms_norm(residual_out)
                   (residual_out may be the same view as residual: in place)
    rms_norm_heads@1 ins [x]; outs [y]; weights [w ([head_dim])]; attrs num_heads, head_dim,
                   eps, weight_offset; each head's head_dim columns of x normalised as
                   rms_norm, one weight for every head (Qwen3, Gemma 3 q/k norms)
    add@1          ins [a, b]; outs [c]; c = a + b
    linear@1       ins [x]; outs [y]; weights [w ([N, K] panel16, f32 or bf16), bias?]
                   y = x @ w.T (+ bias, [N] row_major f32); rows = out's row kind
    linear_w8a16@1 ins [x]; outs [y]; weights [q (int8 panel16 [N, K]), scales (f32 row_major
                   [N]), bias?]; y = (x @ q.T) * scales (+ bias); fp32 activations, the int8
                   codes are converted in registers (never a dequantized copy in memory)
    linear_w4a16@1 ins [x]; outs [y]; weights [codes (int4 panel16_int4 [N, K]), scales,
                   offsets (f32 panel16 [N, K/G] each), bias?]; attrs group_size (G)
                   w[n, k] = scales[n, k/G] * codes[n, k] + offsets[n, k/G];
                   y = sum over groups g of scales[:, g] * (x_g @ codes_g.T) + offsets[:, g] *
                   sum(x_g) (+ bias): per group one integer-code dot product and one row sum
    linear_w4a16@2 as @1 with x rounded to bf16 (nearest even) first: bf16 x code dot
                   products (vdpbf16ps with AVX512_BF16, else @1's kernels on bf16(x));
                   group_size <= 4096. codes panel16_int4 or panel16_int4_k8 (K and G
                   multiples of 8; what the builder writes: its decode is two instructions
                   per 32 weights; re-laid once at load for @1's kernels on other CPUs);
                   scales and offsets f32 or bf16 (one dtype; the builder writes bf16: half
                   the parameter bytes; widened once at load for @1's kernels).
                   What the builder emits for asymmetric codes; @1 engines still run
    linear_w4a16@3 as @2 for symmetric codes: weights [codes, scales, bias?], no offsets;
                   w[n, k] = scales[n, k/G] * (codes[n, k] - 8), so y = sum over groups g of
                   scales[:, g] * (x_g @ codes_g.T - 8 * sum(x_g)) (+ bias). What the builder
                   emits for symmetric int4 (4 + 16/G bits per weight)
    linear_w4k@1   ins [x]; outs [y]; weights [codes (int4 panel16_int4_k8 [N, K]), scales,
                   offsets (uint8 panel16 [N, K/32]: sub-block scale and minimum codes),
                   super_scales, super_offsets (float16 panel16 [N, K/B]), bias?]; attrs
                   super_block (B, a multiple of 32 dividing K, <= 4096); per sub-block j of
                   32 columns in super-block b: s_j = float(d[n, b]) * sc[n, j], o_j =
                   -(float(dmin[n, b]) * m[n, j]) (fp32 products), w[n, k] = s_j * codes[n, k]
                   + o_j; x rounded to bf16 first and y as linear_w4a16@2 with group 32
                   (quantization/superblock.py; what the builder emits for --quant w4k)
    linear_w4a8@1  ins [x]; outs [y]; weights [codes (int4 panel16_int4_k8 [N, K]), scales
                   (bf16 or f32 panel16 [N, K/G]), bias?]; attrs group_size (G, a multiple
                   of 8 dividing K); w[n, k] = scales[n, k/G] * (codes[n, k] - 8) (@3's
                   weights); per row t and group g (dynamic, inside the kernel): a = max|x_g|,
                   xq = rint(x_g * 127 / a) (int8), xs = a / 127; y[t, n] = sum over g in
                   order of float(sum_k xq[k] * (codes[n, k] - 8)) * (xs * scales[n, g]) (an
                   fp32 FMA per group) (+ bias): int32 dot products (VNNI vpdpbusd: codes as
                   u8, activations as s8, minus 8 * sum(xq); AVX2 maddubs, exact in int16)
    linear_w8a8@1  ins [x]; outs [y]; weights [q (int8 vnni16 [N, K]), w_scales (f32 [N]),
                   wsum (int32 [N] = sum_k q[n, k]), smooth (f32 [K], only when attr
                   has_smooth = 1), bias?]; attrs has_smooth (0/absent or 1)
                   per row t: x' = x[t] (* smooth), a = max|x'|, xq = rint(x' * 127 / a)
                   (int8, dynamic per token, inside the kernel); y[t, n] = float(sum_k xq[k] *
                   q[n, k]) * (a / 127) * w_scales[n] (+ bias): int32 accumulation (VNNI
                   vpdpbusd with activations shifted by +128, minus 128 * wsum[n]; AVX2
                   |x| * sign(x) q, exact in int16)
    linear_fp8@1   ins [x]; outs [y]; weights [codes (float8_e4m3 panel16 [N, K]), scales (f32
                   row_major [N]), input_scale (f32 [1]: s_x, static, calibrated), bias?]
                   y = (e4m3(x / s_x) @ e4m3_decode(codes).T) * s_x * scales (+ bias); e4m3()
                   rounds to nearest even on the OCP E4M3FN grid and saturates at +-448
                   (quantization/fp8.py); fp32 accumulation of exact E4M3 products
    linear_fp8@2   as @1 with a dynamic scale per token: weights [codes, scales, bias?] (no
                   input_scale); s_x[t] = max_k |x[t, k]| / 448 (1 for an all-zero row),
                   computed in the kernel; y[t] = (e4m3(x[t] / s_x[t]) @ decode(codes).T) *
                   s_x[t] * scales (+ bias). What the builder emits for fp8 by default.
                   attrs act_group (0/absent, 16, 32, 64 or 128): columns [iG, (i+1)G) of row t
                   use s_x[t] * 2^-e[t, i] instead, e the largest integer in [0, 64] with
                   max|x[t, group i]| * 2^e <= max|x[t]| (quantization/fp8.py group_exponents)
    silu_mul@1     ins [gate, up]; outs [h]; h = silu(gate) * up
    gelu_tanh_mul@1 ins [gate, up]; outs [h]; h = gelu_tanh(gate) * up (Gemma's MLP)
    scale@1        ins [x]; outs [y]; attrs factor; y = x * factor (Gemma's embeddings, Granite)
    sigmoid_gate_mul@1 ins [y, g (one column)]; outs [o]; o = y * sigmoid(g) (Qwen2-MoE's shared expert)
    moe@1          ins [x, router_logits ([E] wide)]; outs [y]; weights [gate_up, down,
                   (gate_up_bias, down_bias)?] (f32 row_major, shapes by layout as
                   plugins/ops.py moe_weight_shapes); attrs num_experts, top_k, expert_size,
                   softmax_after_topk, norm_topk_prob, layout, activation, first_expert,
                   local_experts; per token the top_k experts (routed as transformers does)
                   y = sum_e p_e * down_e(act(gate_e x, up_e x)); only routed experts are read
                   (cpu: tokens grouped by expert, one GEMM per active expert and chunk of 64)
    moe_w8a16@1    moe@1 with experts stored as (E*N, K) output rows, each expert's (N, K) like
                   linear_w8a16's (int8 panel16 codes, f32 scales [E*N]); weights [gate_up codes,
                   scales, down codes, scales, (biases)?]; 2I and H multiples of 16
    moe_w4a16@1    likewise with linear_w4a16@2/@3's parts (int4 panel16_int4(_k8) codes, bf16
                   panel16 scales (E*N, K/G) and, attrs zero_point, offsets); x rounded to bf16
    moe_fp8@1      likewise with linear_fp8@2's parts (float8_e4m3 panel16 codes, f32 scales [E*N])
                   and its dynamic per-token activation scales (attrs act_group as linear_fp8@2's):
                   each matmul's input row x[t] is read as e4m3(x[t] / s_x[t]) * s_x[t]
    moe_mxfp4@1    moe@1 (layout 1) with experts in MXFP4: codes uint8 (E*N, K/2) (E2M1, element
                   2j in the low nibble of byte j), scales uint8 (E*N, K/32) (E8M0); row_major
    gather_rows@1  ins [x] (tokens rows); outs [y] (selected rows); y[i] = x[logits_indices[i]]
    rope@1         ins [q, k] (rotated in place); outs []; weights [inv_freq ([rotary_dim/2] f32)];
                   attrs num_heads, num_kv_heads, head_dim, rotary_dim, attention_scaling
                   rotate-half (GPT-NeoX/Llama) style on the first rotary_dim dims of each
                   head: f = positions[t] * inv_freq[i] (fp32), c = cos(f) * scaling,
                   s = sin(f) * scaling; (x_i, x_{i+r/2}) -> (x_i c - x_{i+r/2} s,
                   x_{i+r/2} c + x_i s)
    attention@1    ins [q, k, v]; outs [o]; attrs layer, num_heads, num_kv_heads, head_dim,
                   scale, sliding_window (0 = none)
                   writes k, v of every row into the paged cache of `layer` at its position,
                   then for each row t of sequence s at position p: o = softmax(scale *
                   q.K^T) V over cached positions j of s with j <= p (and j > p - window
                   when sliding_window > 0); query head h reads KV head
                   h // (num_heads / num_kv_heads)
    attention_sinks@1 as attention@1 with weights [sinks (f32 [num_heads])]: each head's
                   softmax denominator also counts exp(sinks[h]) (a logit with no value; gpt-oss)

    all_reduce@1   ins [x]; outs [y] (may be x's view: in place); attrs tp_rank, tp_size
                   y = sum of x over the tensor-parallel ranks, accumulated in fp32 in rank
                   order (bit-identical on every rank); after the row-split o_proj/down_proj
    all_gather@1   ins [x]; outs [y]; attrs tp_rank, tp_size, full_width (F)
                   x holds columns shard_range(F, tp_size, tp_rank) (ceil(F/tp_size) each,
                   the last may be shorter); y = every rank's columns side by side
                   (the vocab-parallel lm_head's logits)
                   Both run over the communicator attached to the executor
                   (targets/cpu/csrc/communicator.h on the cpu target); a failed peer fails the step.

The "logits" view (width vocab_size) is returned as the step's [L, V] result: rows 0..L-1
of its buffer when that buffer has "selected" rows, or the rows named by logits_indices
when it has "tokens" rows (the executor gathers them).

The KV cache of each layer is two arrays [num_blocks, block_size, num_kv_heads, head_dim]
(K and V) in kv_cache.dtype (float32, bfloat16, int8 or float8_e4m3), allocated by the
executor. The one-byte dtypes carry kv_cache.scales = "dynamic_per_token_head_float32": two
more arrays [num_blocks, block_size, num_kv_heads] float32 per layer (K and V scales), set
when attention@1 writes a row (quantization/kv_cache.py is the reference). Its bytes per
token: format/kv.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ROWS_TOKENS = "tokens"
ROWS_SELECTED = "selected"


@dataclass(frozen=True)
class View:
    buffer: int
    col: int
    width: int

    def to_json(self) -> list[int]:
        return [self.buffer, self.col, self.width]


@dataclass(frozen=True)
class Buffer:
    id: int
    width: int
    rows: str = ROWS_TOKENS

    def to_json(self) -> dict:
        return {"id": self.id, "width": self.width, "rows": self.rows}


@dataclass(frozen=True)
class KernelCall:
    op: str
    version: int
    ins: tuple[View, ...]
    outs: tuple[View, ...]
    weights: tuple[str, ...] = ()
    attrs: dict = field(default_factory=dict)
    node: str = ""  # graph node this call came from (HF module path), for inspect/debug

    @property
    def kernel(self) -> str:
        return f"{self.op}@{self.version}"

    def to_json(self) -> dict:
        return {"op": self.op, "version": self.version, "node": self.node,
                "ins": [v.to_json() for v in self.ins], "outs": [v.to_json() for v in self.outs],
                "weights": list(self.weights), "attrs": dict(sorted(self.attrs.items()))}


@dataclass(frozen=True)
class ExecutionPlan:
    buffers: tuple[Buffer, ...]
    steps: tuple[KernelCall, ...]
    kv_cache: dict
    logits: View
    vocab_size: int

    def kernels(self) -> list[str]:
        return sorted({s.kernel for s in self.steps})

    def to_json(self) -> dict:
        return {"buffers": [b.to_json() for b in self.buffers],
                "steps": [s.to_json() for s in self.steps],
                "kv_cache": dict(self.kv_cache), "logits": self.logits.to_json(),
                "vocab_size": self.vocab_size}
