"""RMSNorm, the fused residual add + RMSNorm, and RMSNorm per head (Qwen3 / Gemma 3 q and k
norms), one program per row.

The row fits one block (BLOCK = next power of two >= N), so x is read once. The fused
kernel normalizes the residual sum as stored (rounded to the activation dtype), exactly
what the next layer reads back, like HF's bf16 models.
"""

import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, y_ptr, eps, weight_offset,
                    N: tl.constexpr, X_STRIDE: tl.constexpr, Y_STRIDE: tl.constexpr,
                    BLOCK: tl.constexpr):
    """y = x * rsqrt(mean(x^2) + eps) * (w + weight_offset); w: fp32 [N]. Grid: (rows,)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * X_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    tl.store(y_ptr + row * Y_STRIDE + cols, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, eps, weight_offset,
                        N: tl.constexpr, X_STRIDE: tl.constexpr, RES_STRIDE: tl.constexpr,
                        Y_STRIDE: tl.constexpr, RES_OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """res_out = x + res (may be res itself: each program reads its row before writing it);
    y = rms_norm(res_out). Grid: (rows,)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * X_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    r = x + tl.load(res_ptr + row * RES_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    r_stored = r.to(res_out_ptr.dtype.element_ty)
    tl.store(res_out_ptr + row * RES_OUT_STRIDE + cols, r_stored, mask=mask)
    r = r_stored.to(tl.float32)
    inv = tl.rsqrt(tl.sum(r * r, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    tl.store(y_ptr + row * Y_STRIDE + cols, (r * inv * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_heads_kernel(x_ptr, w_ptr, y_ptr, eps, weight_offset,
                          NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, X_STRIDE: tl.constexpr,
                          Y_STRIDE: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Each head h of a row (NUM_HEADS * HEAD_DIM columns): y[h] = x[h] * rsqrt(mean(x[h]^2)
    + eps) * (w + weight_offset), w: fp32 [HEAD_DIM] shared by the heads (y may be x).
    Grid: (rows,)."""
    row = tl.program_id(0).to(tl.int64)
    h = tl.arange(0, BLOCK_HEADS)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_HEADS) & (d < HEAD_DIM)
    x = tl.load(x_ptr + row * X_STRIDE + h * HEAD_DIM + d, mask=mask, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=1) / HEAD_DIM + eps)[:, None]  # (BLOCK_HEADS, 1)
    w = tl.load(w_ptr + d, mask=d < HEAD_DIM, other=0.0).to(tl.float32) + weight_offset
    tl.store(y_ptr + row * Y_STRIDE + h * HEAD_DIM + d, (x * inv * w).to(y_ptr.dtype.element_ty), mask=mask)
