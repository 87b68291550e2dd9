"""Dense GEMM / GEMV: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), w stored bf16/fp16 [N, K]
row-major (the layout cuBLASLt's TN GEMM and FP8 need too), fp32 accumulation.

One kernel, instantiated per (N, K, strides, tile config): the lowering picks a tile
config per bucket of M (the rows of the step) and the launcher chooses the bucket at run
time, so decode (M of a few rows) and prefill (M in the thousands) each get tiles that fit.
Programs are grouped GROUP_M tiles high so neighbouring programs share weight tiles in L2.
"""

import triton
import triton.language as tl


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
def gemm_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M,
                N: tl.constexpr, K: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """x: (M, K) with row stride X_STRIDE; y: (M, N) with row stride Y_STRIDE, in y's dtype
    (the activation dtype, or fp32 for logits); bias: fp32 [N], read when HAS_BIAS.
    Grid: (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N),)."""
    rm, rn = output_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    n_ok = rn < N
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * X_STRIDE
    w_cols = w_ptr + rn.to(tl.int64)[None, :] * K
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + rk
        a = tl.load(x_rows + k[None, :], mask=m_ok[:, None] & (k[None, :] < K), other=0.0)
        b = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0)[None, :]
    y = y_ptr + rm.to(tl.int64)[:, None] * Y_STRIDE + rn[None, :]
    tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
