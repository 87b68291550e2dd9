"""Weight-only quantized GEMM / GEMV: y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W stored as
integer codes, dequantized in registers inside the K loop (never a bf16 copy in memory), bf16
tensor-core dots with fp32 accumulation. The codes are the target-neutral formats'
(quantization/formats.py), stored row-major:

- int8 per output channel (w8a16, the int8 lm_head): codes int8 [N, K], scales fp32 [N];
  W = scales[n] * codes. The codes are exact in bf16, so the dot is of x and the codes and
  the scale multiplies the accumulator once.
- int4 per group of K (w4a16*): codes [N, K] two per byte (k even in the low nibble, k odd in
  the high one), scales (and, asymmetric, offsets) bf16 [N, K / GROUP]. Symmetric: W = s (c - 8);
  asymmetric: W = s c + o, so sum_k x W = s sum_k x c + o sum_k x. A K block lies inside one
  group (BLOCK_K <= GROUP), whose scale multiplies that block's partial dot. A byte holds an
  even and an odd k: the x tile is read as its even and its odd columns and the two nibble
  planes each take one dot.

The dequantizing steps (gemm.weight_operand for int8, int4_x_planes, int4_codes_dot, int4_group_block) are
shared with the quantized expert GEMMs (kernels/moe_grouped.py). Tiles per bucket of M as the
dense GEMM (lowering: GEMM_CONFIGS), K blocks of at most 64.

Split-K: K is summed in the linear's K_PARTS parts, one program a part in the decode bucket
(kernels/split_k.py), as the dense and fp8 GEMMs do; the x @ codes^T of the int8 kernel is the
dense GEMM's tile (gemm.gemm_tile reads int8 codes).
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.gemm import gemm_tile, output_tile, store_tile
from bessemer.targets.cuda.kernels.split_k import part_range, program_parts, split_k_done


@triton.jit
def int4_x_planes(x_rows, m_ok, k0, j, K: tl.constexpr):
    """x's even and odd columns k0 + 2j and k0 + 2j + 1 ([BLOCK_M, HALF] each) of the rows at
    x_rows ([BLOCK_M, 1] pointers): the operands of one K block's two nibble-plane dots."""
    k_even = k0 + 2 * j
    x_mask = m_ok[:, None] & (k_even[None, :] < K)
    x_even = tl.load(x_rows + k_even[None, :], mask=x_mask, other=0.0)
    x_odd = tl.load(x_rows + k_even[None, :] + 1, mask=x_mask, other=0.0)
    return x_even, x_odd


@triton.jit
def int4_codes_dot(x_even, x_odd, w_cols, n_ok, k0, j, K: tl.constexpr, SYMMETRIC: tl.constexpr):
    """x [k0, k0 + 2 HALF) @ codes^T ([BLOCK_M, BLOCK_N] fp32) of one K block of int4 codes,
    c - 8 when SYMMETRIC: w_cols [1, BLOCK_N] pointers to each output row's code bytes. The
    codes are exact in bf16 and fp16, so the caller scales the result (shared with
    kernels/gemm_w4k.py)."""
    k_even = k0 + 2 * j
    b = tl.load(w_cols + (k0 // 2 + j)[:, None], mask=n_ok[None, :] & (k_even[:, None] < K), other=0)
    lo = (b & 15).to(tl.float32)
    hi = (b >> 4).to(tl.float32)
    if SYMMETRIC:  # c - 8 in -8..7: exact in bf16
        lo -= 8.0
        hi -= 8.0
    part = tl.dot(x_even, lo.to(x_even.dtype))
    return tl.dot(x_odd, hi.to(x_odd.dtype), part)


@triton.jit
def int4_group_block(acc, x_even, x_odd, w_cols, p_cols, n_ok, scales_ptr, offsets_ptr, k0, j, K: tl.constexpr,
                     GROUP: tl.constexpr, SYMMETRIC: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] + one K block [k0, k0 + 2 HALF) of x W^T for int4 codes: w_cols
    [1, BLOCK_N] pointers to each output row's code bytes, p_cols [BLOCK_N] the row's first
    group parameter; the block lies inside group k0 // GROUP."""
    part = int4_codes_dot(x_even, x_odd, w_cols, n_ok, k0, j, K, SYMMETRIC)
    g = k0 // GROUP
    s = tl.load(scales_ptr + p_cols + g, mask=n_ok, other=0.0).to(tl.float32)
    acc += part * s[None, :]
    if not SYMMETRIC:
        o = tl.load(offsets_ptr + p_cols + g, mask=n_ok, other=0.0).to(tl.float32)
        x_sum = tl.sum(x_even.to(tl.float32), axis=1) + tl.sum(x_odd.to(tl.float32), axis=1)
        acc += x_sum[:, None] * o[None, :]
    return acc


@triton.jit
def gemm_w8_kernel(x_ptr, codes_ptr, scales_ptr, bias_ptr, y_ptr, partials_ptr, counters_ptr, M,
                   N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) activations; codes int8 [N, K]; scales fp32 [N]; y = (x @ codes^T) * scales
    (+ bias); partials / counters: the split-K workspace (read when SPLIT_K > 1); SPLIT_K is
    K_PARTS or 1. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    acc, done, rm, rn, m_ok, n_ok = gemm_tile(x_ptr, codes_ptr, partials_ptr, counters_ptr, M, N, K, X_STRIDE,
                                              BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, K_PARTS)
    if done:
        acc *= tl.load(scales_ptr + rn, mask=n_ok, other=0.0)[None, :]
        store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE, HAS_BIAS)


@triton.jit
def gemm_w4_kernel(x_ptr, codes_ptr, scales_ptr, offsets_ptr, bias_ptr, y_ptr, partials_ptr, counters_ptr, M,
                   N: tl.constexpr, K: tl.constexpr, GROUP: tl.constexpr, X_STRIDE: tl.constexpr,
                   Y_STRIDE: tl.constexpr, SYMMETRIC: tl.constexpr, HAS_BIAS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) activations; codes [N, K / 2] bytes; scales (offsets unless SYMMETRIC) bf16
    [N, K / GROUP]; BLOCK_K divides GROUP; partials / counters: the split-K workspace; SPLIT_K
    is K_PARTS or 1. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = codes_ptr + rn.to(tl.int64)[None, :] * (K // 2)
    p_cols = rn.to(tl.int64) * (K // GROUP)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first, stop = program_parts(SPLIT_K, K_PARTS)
    for part in range(first, stop):  # in the order split_k_done sums the parts
        acc += _w4_part(x_rows, w_cols, p_cols, scales_ptr, offsets_ptr, m_ok, n_ok, part, K, GROUP, K_PARTS,
                        SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K)
    acc, done = split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    if done:
        store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE, HAS_BIAS)


@triton.jit
def _w4_part(x_rows, w_cols, p_cols, scales_ptr, offsets_ptr, m_ok, n_ok, k_part, K: tl.constexpr,
             GROUP: tl.constexpr, K_PARTS: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x @ W^T over part `k_part` of K (fp32, (BLOCK_M, BLOCK_N)), from zero."""
    HALF: tl.constexpr = BLOCK_K // 2
    j = tl.arange(0, HALF)  # byte j of the block: k0 + 2j (low nibble) and k0 + 2j + 1 (high)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start, k_stop = part_range(k_part, K, K_PARTS)
    for k0 in range(k_start, k_stop, BLOCK_K):
        x_even, x_odd = int4_x_planes(x_rows, m_ok, k0, j, K)
        acc = int4_group_block(acc, x_even, x_odd, w_cols, p_cols, n_ok, scales_ptr, offsets_ptr, k0, j, K, GROUP,
                               SYMMETRIC)
    return acc


@triton.jit
def embedding_w8_kernel(token_ids_ptr, codes_ptr, scales_ptr, out_ptr,
                        HIDDEN: tl.constexpr, OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out[t] = codes[token_ids[t]] * scales[token_ids[t]]: the int8 table a tied lm_head
    shares with the embedding. Grid: (T, cdiv(HIDDEN, BLOCK))."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    row = tl.load(token_ids_ptr + t).to(tl.int64)
    c = tl.load(codes_ptr + row * HIDDEN + cols, mask=mask, other=0).to(tl.float32)
    s = tl.load(scales_ptr + row)
    tl.store(out_ptr + t * OUT_STRIDE + cols, (c * s).to(out_ptr.dtype.element_ty), mask=mask)
