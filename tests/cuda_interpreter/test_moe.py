"""The moe kernels (route, gate/up, down) under the Triton interpreter vs plugins/ops.ref_moe:
both weight layouts (per-expert stacked rows; gpt-oss's interleaved, input-major tensors
with biases and the clamped SwiGLU), the three routings (softmax then top-k with and without
renormalisation, softmax over the top-k logits), and a router tie (the lower expert wins, as
the reference's stable sort). Expert weights in the activation dtype, as the cuda plan
stores them; the reference gets the same rounded weights. Bound: one output rounding plus
fp32 arithmetic (the hidden state h stays fp32)."""

import numpy as np
import pytest

from interp_support import assert_rounded_close, device_tensor, host, torch

from bessemer.plugins import ops
from bessemer.targets.cuda.kernels import moe

CASES = [  # (layout, activation, softmax_after_topk, norm_topk_prob, bias)
    (0, 0, 0, 1, False),  # Mixtral, Qwen3-MoE
    (0, 0, 0, 0, False),  # Qwen2-MoE
    (1, 1, 1, 0, True),   # gpt-oss
]


@pytest.mark.parametrize("layout,activation,after,norm,bias", CASES)
def test_moe_matches_reference(layout, activation, after, norm, bias):
    rng = np.random.default_rng(10 + layout + norm)
    t, hidden, size, experts, top_k = 6, 48, 40, 5, 2
    x = device_tensor(rng.normal(size=(t, hidden)), "bfloat16")
    logits = device_tensor(rng.normal(size=(t, experts)), "bfloat16")
    logits[2, 1] = logits[2, 3] = logits[2].max() + 1  # a tie: expert 1 before expert 3
    attrs = dict(num_experts=experts, top_k=top_k, expert_size=size, layout=layout)
    shapes = ops.moe_weight_shapes(attrs, hidden)
    weights = [device_tensor(rng.normal(size=s) / np.sqrt(s[-1] if len(s) > 1 else 1), "bfloat16")
               for s in shapes[:4 if bias else 2]]
    count = t * top_k
    experts_t, weights_t = torch.zeros(count, dtype=torch.int32), torch.zeros(count)
    h = torch.full((count * size,), float("nan"))
    y = torch.zeros(t, hidden, dtype=torch.bfloat16)
    moe.moe_route_kernel[(t,)](logits, experts_t, weights_t, LOGITS_STRIDE=experts, NUM_EXPERTS=experts,
                               TOP_K=top_k, SOFTMAX_AFTER_TOPK=bool(after), NORM_TOPK_PROB=bool(norm), BLOCK_E=8)
    if layout == 1:
        gu = dict(EXPERT_STRIDE=hidden * 2 * size, ROW_STRIDE=2, K_STRIDE=2 * size, UP_OFFSET=1, BIAS_ROW_STRIDE=2,
                  BIAS_UP_OFFSET=1)
        dn = dict(EXPERT_STRIDE=size * hidden, OUT_STRIDE=1, I_STRIDE=hidden)
    else:
        gu = dict(EXPERT_STRIDE=2 * size * hidden, ROW_STRIDE=hidden, K_STRIDE=1, UP_OFFSET=size * hidden,
                  BIAS_ROW_STRIDE=1, BIAS_UP_OFFSET=size)
        dn = dict(EXPERT_STRIDE=hidden * size, OUT_STRIDE=size, I_STRIDE=1)
    no_bias = torch.empty(0, dtype=torch.bfloat16)
    moe.moe_gate_up_kernel[(t, top_k, 3)](
        x, experts_t, weights[0], weights[2] if bias else no_bias, h, X_STRIDE=hidden, HIDDEN=hidden,
        EXPERT_SIZE=size, TOP_K=top_k, HAS_BIAS=bias, ACTIVATION=activation, BLOCK_I=16, BLOCK_K=32, **gu)
    moe.moe_down_kernel[(t, 2)](h, experts_t, weights_t, weights[1], weights[3] if bias else no_bias, y,
                                Y_STRIDE=hidden, HIDDEN=hidden, EXPERT_SIZE=size, TOP_K=top_k, HAS_BIAS=bias,
                                BLOCK_H=32, BLOCK_I=16, **dn)
    top, probs = ops.ref_moe_routing(host(logits), top_k, after, norm)
    assert experts_t.numpy().reshape(t, top_k).tolist() == top.tolist()
    assert top[2].tolist() == [1, 3]
    np.testing.assert_allclose(weights_t.numpy().reshape(t, top_k), probs, rtol=1e-6)
    ref = ops.ref_moe(host(x), host(logits), [host(w) for w in weights], experts, top_k, size, after, norm,
                      layout=layout, activation=activation)
    assert_rounded_close(host(y), ref, "bfloat16", "moe")
