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

The dequantizing steps (int8_codes, int4_x_planes, int4_group_block) are shared with the
quantized expert GEMMs (kernels/moe_grouped.py). Tiles per bucket of M as the dense GEMM
(lowering: GEMM_CONFIGS), K blocks of at most 64.

Split-K (decode): with a few rows there are too few output tiles to keep every SM streaming
weights, so the K range is cut into K_PARTS parts; with SPLIT_K = K_PARTS (grid axis 1) each
program streams its part of the codes once and stores its fp32 partial tile; the last program
of a tile to arrive (a counter per tile) sums the partials in part order and writes y. The
sum's order is fixed, so results do not depend on which program finishes first (CUDA-graph
replays and eager steps stay bit-equal). The counters (int32, zero at load) are reset by that
last program, ready for the next linear that uses them. K_PARTS is a function of the linear's
shape, not of the step's rows: the instantiations for more rows (SPLIT_K = 1) compute the same
parts one after the other in one program and sum them in the same order, so a row's result
does not depend on the bucket its step falls in.
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.gemm import output_tile


@triton.jit
def int8_codes(w_cols, k, n_ok, K: tl.constexpr, dtype: tl.constexpr):
    """The int8 codes of output columns w_cols ([1, BLOCK_N] row pointers) at input rows k
    ([BLOCK_K]) as a [BLOCK_K, BLOCK_N] dot operand of dtype: |code| <= 127 is exact in bf16
    and fp16, so the dot is of x and the codes and the channel scale multiplies its result."""
    b = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k[:, None] < K), other=0)
    return b.to(tl.float32).to(dtype)


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
def int4_group_block(acc, x_even, x_odd, w_cols, p_cols, n_ok, scales_ptr, offsets_ptr, k0, j, K: tl.constexpr,
                     GROUP: tl.constexpr, SYMMETRIC: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] + one K block [k0, k0 + 2 HALF) of x W^T for int4 codes: w_cols
    [1, BLOCK_N] pointers to each output row's code bytes, p_cols [BLOCK_N] the row's first
    group parameter; the block lies inside group k0 // GROUP."""
    k_even = k0 + 2 * j
    b = tl.load(w_cols + (k0 // 2 + j)[:, None], mask=n_ok[None, :] & (k_even[:, None] < K), other=0)
    lo = (b & 15).to(tl.float32)
    hi = (b >> 4).to(tl.float32)
    if SYMMETRIC:  # c - 8 in -8..7: exact in bf16
        lo -= 8.0
        hi -= 8.0
    part = tl.dot(x_even, lo.to(x_even.dtype))
    part = tl.dot(x_odd, hi.to(x_odd.dtype), part)
    g = k0 // GROUP
    s = tl.load(scales_ptr + p_cols + g, mask=n_ok, other=0.0).to(tl.float32)
    acc += part * s[None, :]
    if not SYMMETRIC:
        o = tl.load(offsets_ptr + p_cols + g, mask=n_ok, other=0.0).to(tl.float32)
        x_sum = tl.sum(x_even.to(tl.float32), axis=1) + tl.sum(x_odd.to(tl.float32), axis=1)
        acc += x_sum[:, None] * o[None, :]
    return acc


@triton.jit
def _part_range(k_part, K: tl.constexpr, K_PARTS: tl.constexpr):
    """[k_start, k_stop) of part `k_part` of K; K_PARTS divides K."""
    size: tl.constexpr = K // K_PARTS
    return k_part * size, k_part * size + size


@triton.jit
def _split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  SPLIT_K: tl.constexpr):
    """SPLIT_K == 1: (acc, true). Else stores this split's partial tile and returns (the sum
    of every split's partial in split order, true) in the tile's last program to arrive,
    (zeros, false) in the others. partials: fp32 [tiles, SPLIT_K, BLOCK_M, BLOCK_N];
    counters: int32 [tiles]."""
    if SPLIT_K == 1:
        total = acc
        last = tl.program_id(1) == 0  # always: the one split
    else:
        tile = tl.program_id(0).to(tl.int64)
        cells = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mine = partials_ptr + tile * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(mine + tl.program_id(1) * (BLOCK_M * BLOCK_N) + cells, acc)
        tl.debug_barrier()  # every thread's part of the tile is stored before the counter moves
        arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel")
        last = arrived == SPLIT_K - 1
        total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if last:
            for j in range(SPLIT_K):  # the same order whichever program arrives last
                total += tl.load(mine + j * (BLOCK_M * BLOCK_N) + cells, cache_modifier=".cg")
            tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed")
    return total, last


@triton.jit
def _w8_part(x_rows, w_cols, m_ok, n_ok, k_part, K: tl.constexpr, K_PARTS: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x @ codes^T over part `k_part` of K (fp32, (BLOCK_M, BLOCK_N)), from zero."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start, k_stop = _part_range(k_part, K, K_PARTS)
    for k0 in range(k_start, k_stop, BLOCK_K):
        k = k0 + rk
        a = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        acc = tl.dot(a, int8_codes(w_cols, k, n_ok, K, a.dtype), acc)
    return acc


@triton.jit
def gemm_w8_kernel(x_ptr, codes_ptr, scales_ptr, bias_ptr, y_ptr, partials_ptr, counters_ptr, M,
                   N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) activations; codes int8 [N, K]; scales fp32 [N]; y = (x @ codes^T) * scales
    (+ bias); partials / counters: the split-K workspace (read when SPLIT_K > 1); SPLIT_K is
    K_PARTS or 1. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = codes_ptr + rn.to(tl.int64)[None, :] * K
    if SPLIT_K == K_PARTS:  # one part a program (the only one when K_PARTS == 1)
        acc = _w8_part(x_rows, w_cols, m_ok, n_ok, tl.program_id(1), K, K_PARTS, BLOCK_M, BLOCK_N, BLOCK_K)
        acc, done = _split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    else:  # every part here, summed in the order _split_k_done sums them
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for part in range(K_PARTS):
            acc += _w8_part(x_rows, w_cols, m_ok, n_ok, part, K, K_PARTS, BLOCK_M, BLOCK_N, BLOCK_K)
        done = True
    if done:
        acc *= tl.load(scales_ptr + rn, mask=n_ok, other=0.0)[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :]
        y = y_ptr + rm.to(tl.int64)[:, None] * Y_STRIDE + rn[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


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
    if SPLIT_K == K_PARTS:  # one part a program (the only one when K_PARTS == 1)
        acc = _w4_part(x_rows, w_cols, p_cols, scales_ptr, offsets_ptr, m_ok, n_ok, tl.program_id(1), K, GROUP,
                       K_PARTS, SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K)
        acc, done = _split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    else:  # every part here, summed in the order _split_k_done sums them
        acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for part in range(K_PARTS):
            acc += _w4_part(x_rows, w_cols, p_cols, scales_ptr, offsets_ptr, m_ok, n_ok, part, K, GROUP, K_PARTS,
                            SYMMETRIC, BLOCK_M, BLOCK_N, BLOCK_K)
        done = True
    if done:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :]
        y = y_ptr + rm.to(tl.int64)[:, None] * Y_STRIDE + rn[None, :]
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _w4_part(x_rows, w_cols, p_cols, scales_ptr, offsets_ptr, m_ok, n_ok, k_part, K: tl.constexpr,
             GROUP: tl.constexpr, K_PARTS: tl.constexpr, SYMMETRIC: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x @ W^T over part `k_part` of K (fp32, (BLOCK_M, BLOCK_N)), from zero."""
    HALF: tl.constexpr = BLOCK_K // 2
    j = tl.arange(0, HALF)  # byte j of the block: k0 + 2j (low nibble) and k0 + 2j + 1 (high)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start, k_stop = _part_range(k_part, K, K_PARTS)
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
