"""Elementwise ops over token rows: the gated-MLP activations (silu, Gemma's gelu-tanh),
the residual add and a constant factor (Gemma's embedding scale, Granite's multipliers)."""

import triton
import triton.language as tl


@triton.jit
def _gated_activation(gate_ptr, up_ptr, out_ptr, WIDTH: tl.constexpr, GATE_STRIDE: tl.constexpr,
                      UP_STRIDE: tl.constexpr, OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr,
                      GELU_TANH: tl.constexpr):
    """out = act(gate) * up in fp32, act silu or (GELU_TANH) gelu_tanh, for this program's
    row and column block."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    g = tl.load(gate_ptr + row * GATE_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * UP_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    if GELU_TANH:
        inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)  # sqrt(2 / pi) (g + 0.044715 g^3)
        # 0.5 (1 + tanh(a)) = sigmoid(2a): no tanh instruction needed, exact where tanh saturates
        h = g * tl.sigmoid(2.0 * inner) * u
    else:
        h = g * tl.sigmoid(g) * u
    tl.store(out_ptr + row * OUT_STRIDE + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr,
                    WIDTH: tl.constexpr, GATE_STRIDE: tl.constexpr, UP_STRIDE: tl.constexpr,
                    OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = silu(gate) * up, in fp32. Grid: (T, cdiv(WIDTH, BLOCK))."""
    _gated_activation(gate_ptr, up_ptr, out_ptr, WIDTH, GATE_STRIDE, UP_STRIDE, OUT_STRIDE, BLOCK, False)


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


@triton.jit
def gelu_tanh_mul_kernel(gate_ptr, up_ptr, out_ptr,
                         WIDTH: tl.constexpr, GATE_STRIDE: tl.constexpr, UP_STRIDE: tl.constexpr,
                         OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = gelu_tanh(gate) * up, in fp32 (HF's gelu_pytorch_tanh). Grid: (T, cdiv(WIDTH, BLOCK))."""
    _gated_activation(gate_ptr, up_ptr, out_ptr, WIDTH, GATE_STRIDE, UP_STRIDE, OUT_STRIDE, BLOCK, True)


@triton.jit
def scale_kernel(x_ptr, out_ptr, factor,
                 WIDTH: tl.constexpr, X_STRIDE: tl.constexpr, OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = x * factor in fp32 (out may be x). Grid: (T, cdiv(WIDTH, BLOCK))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    x = tl.load(x_ptr + row * X_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * OUT_STRIDE + cols, (x * factor).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def sigmoid_gate_mul_kernel(y_ptr, gate_ptr, out_ptr,
                            WIDTH: tl.constexpr, Y_STRIDE: tl.constexpr, GATE_STRIDE: tl.constexpr,
                            OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out = y * sigmoid(gate), gate one column per row (Qwen2-MoE's shared-expert gate), in
    fp32 (out may be y). Grid: (T, cdiv(WIDTH, BLOCK))."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    y = tl.load(y_ptr + row * Y_STRIDE + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(gate_ptr + row * GATE_STRIDE).to(tl.float32)
    tl.store(out_ptr + row * OUT_STRIDE + cols, (y * tl.sigmoid(g)).to(out_ptr.dtype.element_ty), mask=mask)
