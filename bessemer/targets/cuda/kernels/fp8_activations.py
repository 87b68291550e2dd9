"""Dynamic per-token E4M3 activations (linear_fp8@2 / moe_fp8@1, format/plan.py): each row
x[t] of a matmul input is fed to an E4M3 x E4M3 dot as e4m3(x[t] / s_x[t]), with
s_x[t] = max_k |x[t, k]| / 448 (1 for an all-zero row) and its result multiplied by s_x[t],
as quantization/fp8.token_scales and quantize_activation define it.

Both divisions are correctly rounded (div.rn.f32): Triton's fp32 `/` is div.full.f32 (within
2 ulp), which would move a quotient across an E4M3 rounding boundary now and then, and the
cpu target and the references divide exactly. fp32 -> E4M3 is cvt.rn.satfinite (nearest
even, saturating at +-448).
"""

import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def e4m3_row_scales(x_rows, r_ok, K: tl.constexpr, BLOCK_K: tl.constexpr):
    """s_x [BLOCK_M] fp32 of the rows at x_rows ([BLOCK_M, 1] pointers, K columns each);
    1 for an all-zero row and for rows outside r_ok. A first pass over the rows: they are
    small next to the weights the dot streams."""
    amax = tl.zeros(r_ok.shape, tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + k[None, :], mask=r_ok[:, None] & (k[None, :] < K), other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.max(tl.abs(x), axis=1))
    return tl.where(amax > 0.0, tl.math.div_rn(amax, tl.full(amax.shape, E4M3_MAX, tl.float32)), 1.0)


@triton.jit
def e4m3_rows(x, s_x):
    """x [BLOCK_M, BLOCK_K] (any float dtype) divided by its row's scale s_x [BLOCK_M] and
    rounded to E4M3: the dot operand."""
    x = x.to(tl.float32)
    return tl.math.div_rn(x, tl.broadcast_to(s_x[:, None], x.shape)).to(tl.float8e4nv)
