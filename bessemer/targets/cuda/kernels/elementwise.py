"""Elementwise ops over token rows: the gated-MLP activation and the residual add."""

import triton
import triton.language as tl


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr,
                    WIDTH: tl.constexpr, GATE_STRIDE: tl.constexpr, UP_STRIDE: tl.constexpr,
                    OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = silu(gate) * up, in fp32. Grid: (T, cdiv(WIDTH, BLOCK))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    g = tl.load(gate_ptr + row * GATE_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * UP_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * OUT_STRIDE + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr,
               WIDTH: tl.constexpr, A_STRIDE: tl.constexpr, B_STRIDE: tl.constexpr,
               OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = a + b (out may be a). Grid: (T, cdiv(WIDTH, BLOCK))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    a = tl.load(a_ptr + row * A_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * B_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * OUT_STRIDE + cols, (a + b).to(out_ptr.dtype.element_ty), mask=mask)
