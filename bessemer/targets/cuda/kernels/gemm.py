"""Dense GEMM / GEMV: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), w stored bf16/fp16 [N, K]
row-major (the layout cuBLASLt's TN GEMM and FP8 need too), fp32 accumulation.

One kernel, instantiated per (N, K, strides, tile config): the lowering picks a tile
config per bucket of M (the rows of the step) and the launcher chooses the bucket at run
time, so decode (M of a few rows) and prefill (M in the thousands) each get tiles that fit.
Programs are grouped GROUP_M tiles high so neighbouring programs share weight tiles in L2.
K is summed in K_PARTS parts (kernels/split_k.py): the decode bucket's tiles take one program
a part, so that a decode step's few output tiles still keep every SM streaming weights.
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.split_k import part_range, program_parts, split_k_done


@triton.jit
def output_tile(M, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(rows, columns) of this program's output tile; programs are grouped GROUP_M tiles high
    (shared by the quantized GEMMs)."""
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    group_rows = tl.minimum(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    tile_m = first_m + (pid % group) % group_rows
    tile_n = (pid % group) // group_rows
    return tile_m * BLOCK_M + tl.arange(0, BLOCK_M), tile_n * BLOCK_N + tl.arange(0, BLOCK_N)


@triton.jit
def weight_operand(w_cols, k, n_ok, K: tl.constexpr, dtype: tl.constexpr):
    """The weights of output columns w_cols ([1, BLOCK_N] row pointers) at input rows k
    ([BLOCK_K]) as a [BLOCK_K, BLOCK_N] dot operand of dtype: stored in dtype, or int8 codes
    (|code| <= 127 is exact in bf16 and fp16, so the dot is of x and the codes and the
    channel scale multiplies its result; shared with the quantized GEMMs)."""
    b = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k[:, None] < K), other=0)
    if w_cols.dtype.element_ty == tl.int8:
        b = b.to(tl.float32).to(dtype)
    return b


@triton.jit
def gemm_part(x_rows, w_cols, m_ok, n_ok, k_part, K: tl.constexpr, K_PARTS: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """x @ w^T over part `k_part` of K (fp32, (BLOCK_M, BLOCK_N)), from zero: x_rows
    [BLOCK_M, 1] and w_cols [1, BLOCK_N] row pointers; w as weight_operand reads it."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    k_start, k_stop = part_range(k_part, K, K_PARTS)
    for k0 in range(k_start, k_stop, BLOCK_K):
        k = k0 + rk
        a = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        acc = tl.dot(a, weight_operand(w_cols, k, n_ok, K, a.dtype), acc)
    return acc


@triton.jit
def store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y[rm, rn] = acc (+ bias[rn], fp32), in y's dtype (shared by every linear's GEMM)."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :]
    y = y_ptr + rm.to(tl.int64)[:, None] * Y_STRIDE + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def gemm_tile(x_ptr, w_ptr, partials_ptr, counters_ptr, M, N: tl.constexpr, K: tl.constexpr,
              X_STRIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """This program's output tile of x @ w^T (w as weight_operand reads it, [N, K]):
    (acc (BLOCK_M, BLOCK_N) fp32, done, rm, rn, m_ok, n_ok); acc is the sum over all of K
    where done (the tile's last program with split K, split_k_done), zeros elsewhere."""
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    m_ok, n_ok = rm < M, rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    first, stop = program_parts(SPLIT_K, K_PARTS)
    for part in range(first, stop):  # in the order split_k_done sums the parts
        acc += gemm_part(x_rows, w_cols, m_ok, n_ok, part, K, K_PARTS, BLOCK_M, BLOCK_N, BLOCK_K)
    acc, done = split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M, BLOCK_N, SPLIT_K)
    return acc, done, rm, rn, m_ok, n_ok


@triton.jit
def gemm_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, partials_ptr, counters_ptr, M,
                N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """x: (M, K) with row stride X_STRIDE; y: (M, N) with row stride Y_STRIDE, in y's dtype
    (the activation dtype, or fp32 for logits); bias: fp32 [N], read when HAS_BIAS;
    partials / counters: the split-K workspace (read when SPLIT_K > 1); SPLIT_K is K_PARTS
    or 1. Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K)."""
    acc, done, rm, rn, m_ok, n_ok = gemm_tile(x_ptr, w_ptr, partials_ptr, counters_ptr, M, N, K, X_STRIDE, BLOCK_M,
                                              BLOCK_N, BLOCK_K, GROUP_M, SPLIT_K, K_PARTS)
    if done:
        store_tile(y_ptr, acc, bias_ptr, rm, rn, m_ok, n_ok, Y_STRIDE, HAS_BIAS)
