"""FP8 GEMM on Hopper's FP8 tensor cores: y[M, N] = (e4m3(x / s_x) @ decode(codes)^T) * s_x *
scales (+ bias), what linear_fp8 computes on the cpu target (format/plan.py, @1 and @2),
with the codes of quantization/formats.Fp8E4M3 stored row-major [N, K] (E4M3 bytes) and an
fp32 scale per output channel.

Activation scales: static (one calibrated s_x per linear, stored as <weight>.input_scale) or
dynamic (s_x[m] = max_k |x[m, k]| / 448 per row, 1 for an all-zero row). The dynamic scale
is a first pass over the tile's rows of x inside the GEMM, not a separate quantize kernel:
x is small next to the weights at decode, and from L2 at prefill, so reading it twice costs
less than a launch and a round trip of the codes through memory. The scales and codes come
from kernels/fp8_activations.py (IEEE divisions, cvt.rn.satfinite), shared with the fp8
experts: they are quantization/fp8.py's, bit for bit. The output
is not: the fp32 accumulation order (wgmma vs NumPy) and the epilogue's FMA contraction
differ by fp32 rounding, within the tests' stated tolerance (tests/cuda_interpreter/test_fp8.py).

The dot is E4M3 x E4M3 with fp32 accumulation. Hopper's FP8 wgmma accumulates in reduced
precision; max_num_imprecise_acc = BLOCK_K promotes the partial sums into the fp32
accumulator after every K block (what cuBLASLt does without FAST_ACCUM). K is summed in
the linear's K_PARTS parts (kernels/split_k.py); every part's program computes the row's
dynamic scale over all of K, so the codes are the same whichever part reads them.
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.fp8_activations import e4m3_row_scales, e4m3_rows
from bessemer.targets.cuda.kernels.gemm import output_tile, store_tile
from bessemer.targets.cuda.kernels.split_k import part_range, program_parts, split_k_done


@triton.jit
def gemm_fp8_kernel(x_ptr, codes_ptr, scales_ptr, input_scale_ptr, bias_ptr, y_ptr, partials_ptr, counters_ptr, M,
                    N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                    DYNAMIC: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) activations; codes fp8e4nv [N, K]; scales fp32 [N]; input_scale fp32 [1]
    (read unless DYNAMIC); partials / counters: the split-K workspace (read when SPLIT_K > 1);
    SPLIT_K is K_PARTS or 1. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = codes_ptr + rn.to(tl.int64)[None, :] * K
    if DYNAMIC:
        s_x = e4m3_row_scales(x_rows, m_ok, K, BLOCK_K)  # (BLOCK_M,)
    else:
        s_x = tl.zeros([BLOCK_M], tl.float32) + tl.load(input_scale_ptr)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first, stop = program_parts(SPLIT_K, K_PARTS)
    for part in range(first, stop):  # each part from zero, in the order split_k_done sums them
        k_start, k_stop = part_range(part, K, K_PARTS)
        part_acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for k0 in range(k_start, k_stop, BLOCK_K):
            k = k0 + rk
            x = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
            a = e4m3_rows(x, s_x)  # (BLOCK_M, BLOCK_K)
            b = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k[:, None] < K), other=0.0)
            part_acc = tl.dot(a, b, part_acc, max_num_imprecise_acc=BLOCK_K)
        acc += part_acc
    acc, done = split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    if done:
        acc *= s_x[:, None] * tl.load(scales_ptr + rn, mask=n_ok, other=0.0)[None, :]
        store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE, HAS_BIAS)
