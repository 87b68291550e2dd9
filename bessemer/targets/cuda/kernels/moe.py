"""Top-k mixture of experts (moe@1 of format/plan.py; plugins/ops.ref_moe is the reference):
three launches that read only the routed experts' weights.

1. moe_route_kernel, one program per token: the router logits' top-k experts and their
   weights, routed as transformers does (softmax over all experts then top-k, optionally
   renormalised; or softmax over the top-k logits), ties to the lower expert index.
2. moe_gate_up_kernel, per (token, routed slot, block of the expert's intermediate size):
   act(gate_e x, up_e x) into an fp32 workspace [T, top_k, expert_size].
3. moe_down_kernel, per (token, block of hidden): y = sum over the slots, in slot order, of
   weight * (down_e h (+ bias)), so that the result does not depend on program order.

Weight layouts (moe_weight_shapes): 0 = per-expert [gate; up] rows stacked (E*2I, H) and
down (E*H, I); 1 = gpt-oss's (E, H, 2I) with gate/up interleaved and (E, I, H). Both are read
through strides (constexprs), so one kernel serves both. Activation 0 = SiLU(gate) * up;
1 = gpt-oss's clamped SwiGLU. Expert weights are stored in the activation dtype; every
product accumulates in fp32. Per token these are GEMVs on CUDA cores: the expert weights a
token reads are read once for it (no batching of the tokens routed to one expert yet).
"""

import triton
import triton.language as tl


@triton.jit
def expert_activation(gate, up, ACTIVATION: tl.constexpr):
    """An expert's hidden activation from its gate and up projections (fp32): SwiGLU, or
    gpt-oss's (ACTIVATION 1) clamped (up + 1) * gate * sigmoid(1.702 gate)."""
    if ACTIVATION == 1:
        gate = tl.minimum(gate, 7.0)
        up = tl.minimum(tl.maximum(up, -7.0), 7.0)
        h = (up + 1.0) * gate / (1.0 + tl.exp(-1.702 * gate))
    else:
        h = gate / (1.0 + tl.exp(-gate)) * up
    return h


@triton.jit
def moe_route_kernel(logits_ptr, experts_ptr, weights_ptr, LOGITS_STRIDE: tl.constexpr,
                     NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr, SOFTMAX_AFTER_TOPK: tl.constexpr,
                     NORM_TOPK_PROB: tl.constexpr, BLOCK_E: tl.constexpr):
    """experts: int32 [T, TOP_K], weights: fp32 [T, TOP_K]. Grid: (T,)."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    z = tl.load(logits_ptr + t * LOGITS_STRIDE + e, mask=e < NUM_EXPERTS, other=float("-inf")).to(tl.float32)
    if SOFTMAX_AFTER_TOPK:
        p = z
    else:
        p = tl.exp(z - tl.max(z, axis=0))
        p = p / tl.sum(p, axis=0)
    top_max = tl.max(z, axis=0)
    # two passes over the same selection: the first sums the chosen weights (the
    # renormalisation's denominator), the second stores each expert and its weight
    total = 0.0
    left = p
    for j in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        index = tl.min(tl.where(left == best, e, BLOCK_E), axis=0)  # the lowest index among equals
        if SOFTMAX_AFTER_TOPK:
            total += tl.exp(best - top_max)
        else:
            total += best
        left = tl.where(e == index, float("-inf"), left)
    left = p
    for j in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        index = tl.min(tl.where(left == best, e, BLOCK_E), axis=0)
        if SOFTMAX_AFTER_TOPK:
            value = tl.exp(best - top_max) / total
        elif NORM_TOPK_PROB:
            value = best / total
        else:
            value = best
        tl.store(experts_ptr + t * TOP_K + j, index.to(tl.int32))
        tl.store(weights_ptr + t * TOP_K + j, value)
        left = tl.where(e == index, float("-inf"), left)


@triton.jit
def moe_gate_up_kernel(x_ptr, experts_ptr, gate_up_ptr, gate_up_bias_ptr, h_ptr, X_STRIDE: tl.constexpr,
                       HIDDEN: tl.constexpr, EXPERT_SIZE: tl.constexpr, TOP_K: tl.constexpr,
                       EXPERT_STRIDE: tl.constexpr, ROW_STRIDE: tl.constexpr, K_STRIDE: tl.constexpr,
                       UP_OFFSET: tl.constexpr, BIAS_ROW_STRIDE: tl.constexpr, BIAS_UP_OFFSET: tl.constexpr,
                       HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, BLOCK_I: tl.constexpr,
                       BLOCK_K: tl.constexpr):
    """h[t, j, i] = act(gate_e[i] . x[t] (+ b), up_e[i] . x[t] (+ b)) for the expert e of
    token t's slot j; gate_e[i, k] at e * EXPERT_STRIDE + i * ROW_STRIDE + k * K_STRIDE, up
    UP_OFFSET further. h: fp32 [T, TOP_K, EXPERT_SIZE]. Grid: (T, TOP_K, cdiv(EXPERT_SIZE, BLOCK_I))."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    i = tl.program_id(2) * BLOCK_I + tl.arange(0, BLOCK_I)
    i_ok = i < EXPERT_SIZE
    e = tl.load(experts_ptr + t * TOP_K + j).to(tl.int64)
    rows = gate_up_ptr + e * EXPERT_STRIDE + i[:, None] * ROW_STRIDE  # (BLOCK_I, 1)
    gate = tl.zeros([BLOCK_I], tl.float32)
    up = tl.zeros([BLOCK_I], tl.float32)
    for k0 in range(0, HIDDEN, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < HIDDEN
        x = tl.load(x_ptr + t * X_STRIDE + k, mask=k_ok, other=0.0).to(tl.float32)
        mask = i_ok[:, None] & k_ok[None, :]
        w_gate = tl.load(rows + k[None, :] * K_STRIDE, mask=mask, other=0.0).to(tl.float32)
        w_up = tl.load(rows + UP_OFFSET + k[None, :] * K_STRIDE, mask=mask, other=0.0).to(tl.float32)
        gate += tl.sum(w_gate * x[None, :], axis=1)
        up += tl.sum(w_up * x[None, :], axis=1)
    if HAS_BIAS:
        bias = gate_up_bias_ptr + e * (2 * EXPERT_SIZE) + i * BIAS_ROW_STRIDE
        gate += tl.load(bias, mask=i_ok, other=0.0).to(tl.float32)
        up += tl.load(bias + BIAS_UP_OFFSET, mask=i_ok, other=0.0).to(tl.float32)
    h = expert_activation(gate, up, ACTIVATION)
    tl.store(h_ptr + (t * TOP_K + j) * EXPERT_SIZE + i, h, mask=i_ok)


@triton.jit
def moe_down_kernel(h_ptr, experts_ptr, weights_ptr, down_ptr, down_bias_ptr, y_ptr, Y_STRIDE: tl.constexpr,
                    HIDDEN: tl.constexpr, EXPERT_SIZE: tl.constexpr, TOP_K: tl.constexpr,
                    EXPERT_STRIDE: tl.constexpr, OUT_STRIDE: tl.constexpr, I_STRIDE: tl.constexpr,
                    HAS_BIAS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_I: tl.constexpr):
    """y[t, n] = sum_j weights[t, j] * (down_e[n] . h[t, j] (+ bias_e[n])), down_e[n, i] at
    e * EXPERT_STRIDE + n * OUT_STRIDE + i * I_STRIDE. Grid: (T, cdiv(HIDDEN, BLOCK_H))."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    n_ok = n < HIDDEN
    y = tl.zeros([BLOCK_H], tl.float32)
    for j in range(TOP_K):  # slot order: the same sum whatever order programs run in
        e = tl.load(experts_ptr + t * TOP_K + j).to(tl.int64)
        rows = down_ptr + e * EXPERT_STRIDE + n[:, None] * OUT_STRIDE
        part = tl.zeros([BLOCK_H], tl.float32)
        for i0 in range(0, EXPERT_SIZE, BLOCK_I):
            i = i0 + tl.arange(0, BLOCK_I)
            i_ok = i < EXPERT_SIZE
            h = tl.load(h_ptr + (t * TOP_K + j) * EXPERT_SIZE + i, mask=i_ok, other=0.0)
            w = tl.load(rows + i[None, :] * I_STRIDE, mask=n_ok[:, None] & i_ok[None, :], other=0.0).to(tl.float32)
            part += tl.sum(w * h[None, :], axis=1)
        if HAS_BIAS:
            part += tl.load(down_bias_ptr + e * HIDDEN + n, mask=n_ok, other=0.0).to(tl.float32)
        y += tl.load(weights_ptr + t * TOP_K + j) * part
    tl.store(y_ptr + t * Y_STRIDE + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)
