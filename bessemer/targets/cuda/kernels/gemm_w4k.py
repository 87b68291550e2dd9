"""Two-level 4-bit GEMM / GEMV (w4k, w4k-gptq: quantization/formats.Int4SuperBlock):
y[M, N] = x[M, K] @ W[N, K]^T (+ bias), the codes dequantized in registers inside the K loop,
bf16 / fp16 tensor-core dots with fp32 accumulation.

Stored row-major as the format's parts: codes [N, K] two per byte (k even in the low nibble),
uint8 sub-block scale codes sc and minimum codes m [N, K / SUB_BLOCK], fp16 super-scales d and
super-minimums dmin [N, K / SUPER_BLOCK]. Per sub-block of SUB_BLOCK (32) columns

    W = s c + o,   s = fp32(d sc),   o = fp32(-(dmin m))

each rounded once, as quantization/superblock.expand and the cpu kernels compute them, so
sum_k x W = s sum_k x c + o sum_k x: one K block is one sub-block, its codes' dot (exact
codes, kernels/gemm_quant.int4_codes_dot) scaled by s, plus o times the block's sum of x.
A super-block is a whole number of sub-blocks, so a K block never straddles two.

Tiles per bucket of M and split-K as the other quantized GEMMs (lowering: GEMM_CONFIGS and
split_k, K blocks of SUB_BLOCK; kernels/split_k.py).
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.gemm import output_tile, store_tile
from bessemer.targets.cuda.kernels.gemm_quant import int4_codes_dot, int4_x_planes
from bessemer.targets.cuda.kernels.split_k import part_range, program_parts, split_k_done


@triton.jit
def gemm_w4k_kernel(x_ptr, codes_ptr, scales_ptr, offsets_ptr, super_scales_ptr, super_offsets_ptr, bias_ptr, y_ptr,
                    partials_ptr, counters_ptr, M, N: tl.constexpr, K: tl.constexpr, SUB_BLOCK: tl.constexpr,
                    SUPER_BLOCK: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) activations; codes [N, K / 2] bytes; scales, offsets uint8 [N, K / SUB_BLOCK];
    super_scales, super_offsets fp16 [N, K / SUPER_BLOCK]; BLOCK_K == SUB_BLOCK; partials /
    counters: the split-K workspace; SPLIT_K is K_PARTS or 1.
    Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    tl.static_assert(BLOCK_K == SUB_BLOCK, "a K block is one sub-block")
    tl.static_assert(SUPER_BLOCK % SUB_BLOCK == 0, "a super-block is whole sub-blocks")
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = codes_ptr + rn.to(tl.int64)[None, :] * (K // 2)
    sub_rows = rn.to(tl.int64) * (K // SUB_BLOCK)  # [BLOCK_N] each row's first sub-block parameter
    super_rows = rn.to(tl.int64) * (K // SUPER_BLOCK)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first, stop = program_parts(SPLIT_K, K_PARTS)
    for part in range(first, stop):  # in the order split_k_done sums the parts
        acc += _w4k_part(x_rows, w_cols, sub_rows, super_rows, scales_ptr, offsets_ptr, super_scales_ptr,
                         super_offsets_ptr, m_ok, n_ok, part, K, SUB_BLOCK, SUPER_BLOCK, K_PARTS, BLOCK_M, BLOCK_N,
                         BLOCK_K)
    acc, done = split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    if done:
        store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE, HAS_BIAS)


@triton.jit
def _w4k_part(x_rows, w_cols, sub_rows, super_rows, scales_ptr, offsets_ptr, super_scales_ptr, super_offsets_ptr,
              m_ok, n_ok, k_part, K: tl.constexpr, SUB_BLOCK: tl.constexpr, SUPER_BLOCK: tl.constexpr,
              K_PARTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x @ W^T over part `k_part` of K (fp32, (BLOCK_M, BLOCK_N)), from zero."""
    HALF: tl.constexpr = BLOCK_K // 2
    j = tl.arange(0, HALF)  # byte j of the block: k0 + 2j (low nibble) and k0 + 2j + 1 (high)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start, k_stop = part_range(k_part, K, K_PARTS)
    for k0 in range(k_start, k_stop, BLOCK_K):
        x_even, x_odd = int4_x_planes(x_rows, m_ok, k0, j, K)
        dot = int4_codes_dot(x_even, x_odd, w_cols, n_ok, k0, j, K, False)
        sub, sup = k0 // SUB_BLOCK, k0 // SUPER_BLOCK
        sc = tl.load(scales_ptr + sub_rows + sub, mask=n_ok, other=0).to(tl.float32)
        m = tl.load(offsets_ptr + sub_rows + sub, mask=n_ok, other=0).to(tl.float32)
        d = tl.load(super_scales_ptr + super_rows + sup, mask=n_ok, other=0.0).to(tl.float32)
        dmin = tl.load(super_offsets_ptr + super_rows + sup, mask=n_ok, other=0.0).to(tl.float32)
        s = d * sc  # [BLOCK_N], one fp32 rounding each, as the reference's expand
        o = -(dmin * m)
        x_sum = tl.sum(x_even.to(tl.float32), axis=1) + tl.sum(x_odd.to(tl.float32), axis=1)
        acc += dot * s[None, :]
        acc += x_sum[:, None] * o[None, :]
    return acc
