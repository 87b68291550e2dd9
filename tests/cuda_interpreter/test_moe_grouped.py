"""The quantized expert kernels (kernels/moe_grouped.py) under the Triton interpreter, each
launch against its own NumPy reference on the same inputs:
- moe_sort_kernel: exactly a stable argsort of the routed experts and their row starts;
- moe_gate_up_grouped_kernel: h = act(gate_e x, up_e x) on the dequantized ExpertStack codes
  (int8 per channel; int4 per group, symmetric and asymmetric; E4M3 per channel) or MXFP4
  experts (E2M1 codes, E8M0 scales), within one output rounding;
- moe_down_grouped_kernel + moe_combine_kernel: y = sum_j w_j down_e h (the kernel's own h,
  so that both bounds are one rounding each), within one output rounding.
E4M3 experts multiply each matmul input row as moe_fp8@1 reads it (plugins/ops.ref_moe's
matmul_input in tests/test_moe_fp8.py): e4m3(x[t] / s_x[t]) * s_x[t], s_x[t] = max|x[t]| / 448,
rounded exactly as quantization/fp8.py rounds; the references apply the same rounding, and
the same references without it are far off (the test sees the E4M3 step).
Both row orders (per-expert [gate; up] blocks; gpt-oss's interleaved input-major experts with
biases and the clamped SwiGLU). 40 tokens top-2 over 5 experts, one never routed: experts of
several 16-row tiles, partial tiles, and more tiles than programs (each program loops). And
batch invariance: a token's output alone equals, bit for bit, its output in the batch."""

import numpy as np
import pytest

from interp_support import assert_rounded_close, device_tensor, host, torch

from bessemer.format import layouts
from bessemer.plugins import ops
from bessemer.quantization import fp8
from bessemer.quantization.formats import (ExpertStack, Fp8E4M3, Int4Group, Int8PerChannel, Mxfp4Experts,
                                           WeightCalibration)
from bessemer.targets.cuda.kernels import moe_grouped

HIDDEN, SIZE, EXPERTS, TOP_K, BLOCK_M = 64, 32, 5, 2, 16


def _stored(w: np.ndarray, fmt) -> tuple[list, np.ndarray]:
    """(codes, scales, offsets as the kernel reads them: row-major, int4 two a byte), the
    dequantized (E*N, K) rows they stand for."""
    q, _ = fmt.store(w, WeightCalibration())
    if isinstance(fmt, Mxfp4Experts):  # uint8 codes and E8M0 scales, as shipped
        parts = [torch.from_numpy(q["codes"]), torch.from_numpy(q["scales"]), torch.empty(0)]
    elif isinstance(fmt.inner, Fp8E4M3):  # E4M3 bytes, read as fp8 by the kernel
        parts = [torch.from_numpy(q["codes"]).view(torch.float8_e4m3fn), torch.from_numpy(q["scales"]),
                 torch.empty(0)]
    elif fmt.inner.bits == 8:
        parts = [torch.from_numpy(q["codes"]), torch.from_numpy(q["scales"]), torch.empty(0)]
    else:
        codes = layouts.pack_int4_row_major(q["codes"]).reshape(len(q["codes"]), -1)
        bf16 = [torch.from_numpy(np.asarray(q[r], np.float32)).bfloat16() for r in ("scales", "offsets") if r in q]
        parts = [torch.from_numpy(codes), bf16[0], bf16[1] if len(bf16) > 1 else torch.empty(0, dtype=torch.bfloat16)]
    return parts, fmt.dequantize(q)


def _route(rng, t):
    """Distinct experts per token among the first EXPERTS - 1 (the last is never routed)."""
    experts = np.stack([rng.permutation(EXPERTS - 1)[:TOP_K] for _ in range(t)]).astype(np.int32)
    weights = rng.uniform(0.1, 1.0, size=(t, TOP_K)).astype(np.float32)
    return experts, weights


def _run(x, experts, weights, gate_up, down, biases, layout, activation, bits, group, symmetric, mxfp4=False,
         e4m3=False):
    """The four launches of the grouped moe; returns (sorted, starts, h, y)."""
    t = len(x)
    slots = t * TOP_K
    experts_t = torch.from_numpy(experts.ravel().copy())
    sorted_t = torch.full((slots,), -1, dtype=torch.int32)
    starts = torch.full((EXPERTS + 1,), -1, dtype=torch.int32)
    moe_grouped.moe_sort_kernel[(1,)](experts_t, sorted_t, starts, t, TOP_K=TOP_K, NUM_EXPERTS=EXPERTS, BLOCK=16,
                                      BLOCK_E=8)
    h = torch.full((slots, SIZE), float("nan"), dtype=x.dtype)
    out = torch.full((slots, HIDDEN), float("nan"))
    y = torch.zeros(t, HIDDEN, dtype=x.dtype)
    quant = dict(BITS=bits, MXFP4=mxfp4, FP8=e4m3, GROUP=group, SYMMETRIC=symmetric, BLOCK_M=BLOCK_M,
                 BLOCK_K=min(64, group), BLOCK_E=8)
    programs = -(-t // BLOCK_M) * TOP_K
    rows = dict(ROW_STRIDE=2, UP_OFFSET=1) if layout == 1 else dict(ROW_STRIDE=1, UP_OFFSET=SIZE)
    no_bias = torch.empty(0)
    moe_grouped.moe_gate_up_grouped_kernel[(programs, 2)](
        x, sorted_t, starts, *gate_up, biases[0] if biases else no_bias, h, X_STRIDE=HIDDEN, HIDDEN=HIDDEN,
        EXPERT_SIZE=SIZE, TOP_K=TOP_K, NUM_EXPERTS=EXPERTS, HAS_BIAS=bool(biases), ACTIVATION=activation,
        BLOCK_N=16, **rows, **quant)
    moe_grouped.moe_down_grouped_kernel[(programs, 2)](
        h, sorted_t, starts, *down, biases[1] if biases else no_bias, out, HIDDEN=HIDDEN, EXPERT_SIZE=SIZE,
        NUM_EXPERTS=EXPERTS, HAS_BIAS=bool(biases), BLOCK_N=32, **quant)
    moe_grouped.moe_combine_kernel[(t, 2)](out, torch.from_numpy(weights.ravel().copy()), y, Y_STRIDE=HIDDEN,
                                           HIDDEN=HIDDEN, TOP_K=TOP_K, BLOCK_H=32)
    return sorted_t.numpy(), starts.numpy(), h, y


FP8_BITS = -8  # E4M3 codes (bits 8, FP8=True)
CASES = [  # (bits, zero_point, layout, activation, biases); bits 0: MXFP4, FP8_BITS: E4M3
    (8, False, 0, 0, False),  # w8a16: Mixtral, Qwen-MoE rows
    (4, False, 0, 0, False),  # w4a16 symmetric
    (4, True, 1, 1, True),    # w4a16 asymmetric, gpt-oss's experts
    (8, False, 1, 1, True),
    (0, False, 1, 1, True),   # gpt-oss's experts as shipped
    (FP8_BITS, False, 0, 0, False),  # fp8: Mixtral, Qwen-MoE rows
    (FP8_BITS, False, 1, 1, True),   # fp8, gpt-oss's experts
]


def _e4m3_per_token(rows: np.ndarray) -> np.ndarray:
    """What an E4M3 expert's dot multiplies: each row rounded with its own max|row| / 448."""
    rows = np.asarray(rows, np.float32)
    return fp8.fake_quant_activation(rows, fp8.token_scales(rows)).astype(np.float64)


def _inner(bits: int, zero_point: bool):
    return {8: Int8PerChannel(), FP8_BITS: Fp8E4M3(dynamic=True)}.get(bits) or Int4Group(32, zero_point)


CODES = {8: "int8", 4: "int4", 0: "mxfp4", FP8_BITS: "fp8"}


@pytest.mark.parametrize("bits,zero_point,layout,activation,biases", CASES,
                         ids=[f"{CODES[c[0]]}{'-asym' * c[1]}-layout{c[2]}" for c in CASES])
def test_grouped_quantized_experts_match_reference(bits, zero_point, layout, activation, biases):
    rng = np.random.default_rng(20 + abs(bits) + layout)
    t, dtype = 40, "bfloat16"
    x = device_tensor(rng.normal(size=(t, HIDDEN)), dtype)
    experts, weights = _route(rng, t)
    shapes = ops.moe_weight_shapes(dict(num_experts=EXPERTS, expert_size=SIZE, layout=layout), HIDDEN)
    ws = [(rng.normal(size=s) / np.sqrt(s[-2] if layout == 1 else s[-1])).astype(np.float32) for s in shapes[:2]]
    stored, values = [], []
    for w in ws:
        fmt = Mxfp4Experts() if bits == 0 else ExpertStack(_inner(bits, zero_point), EXPERTS, layout == 1)
        parts, rows = _stored(w, fmt)
        stored.append(parts)
        values.append(rows.astype(np.float64))  # (E*N, K) output rows in the kernels' order
    bias = [torch.from_numpy(rng.normal(size=s).astype(np.float32).ravel()) for s in shapes[2:]] if biases else []
    e4m3 = bits == FP8_BITS
    group = 64 if abs(bits) == 8 else 32  # int8 / E4M3: GROUP unused, BLOCK_K = 64; MXFP4: blocks of 32
    codes = dict(bits=abs(bits) or 4, group=group, symmetric=not zero_point, mxfp4=bits == 0, e4m3=e4m3)
    sorted_rows, starts, h, y = _run(x, experts, weights, *stored, bias, layout, activation, **codes)
    matmul_input = _e4m3_per_token if e4m3 else (lambda rows: np.asarray(rows, np.float64))

    flat = experts.ravel()
    np.testing.assert_array_equal(sorted_rows, np.argsort(flat, kind="stable"))
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=EXPERTS))]))

    gu_rows, down_rows = values
    up_offset, stride = (1, 2) if layout == 1 else (SIZE, 1)

    def gate_up_reference(x_in):
        h_ref = np.zeros((t * TOP_K, SIZE))
        for slot, e in enumerate(flat):
            gate_idx = e * 2 * SIZE + np.arange(SIZE) * stride
            gu = [gu_rows[gate_idx] @ x_in[slot // TOP_K], gu_rows[gate_idx + up_offset] @ x_in[slot // TOP_K]]
            if biases:
                gu = [gu[0] + host(bias[0])[gate_idx], gu[1] + host(bias[0])[gate_idx + up_offset]]
            h_ref[slot] = ops._expert_act(gu[0], gu[1], activation)
        return h_ref

    def down_reference(h_in):
        y_ref = np.zeros((t, HIDDEN))
        for slot, e in enumerate(flat):
            part = down_rows[e * HIDDEN:(e + 1) * HIDDEN] @ h_in[slot]
            if biases:
                part += host(bias[1])[e * HIDDEN:(e + 1) * HIDDEN]
            y_ref[slot // TOP_K] += weights.ravel()[slot] * part
        return y_ref

    h_ref = gate_up_reference(matmul_input(host(x)))
    assert_rounded_close(host(h), h_ref, dtype, f"gate/up w{bits}")
    y_ref = down_reference(matmul_input(host(h)))
    assert_rounded_close(host(y), y_ref, dtype, f"down w{bits}")
    if e4m3:  # without the activations' E4M3 rounding the same references are far off
        plains = (gate_up_reference(host(x)), down_reference(host(h)))
        for got, want, plain in zip((host(h), host(y)), (h_ref, y_ref), plains):
            print(f"E4M3 rows: {np.abs(got - plain).max() / np.abs(got - want).max():.1f}x closer than plain")
            assert np.abs(got - plain).max() > 4 * np.abs(got - want).max()

    # batch invariance: token 3 alone (one tile per expert, one program) gives the same bits
    _, _, _, alone = _run(x[3:4].clone(), experts[3:4], weights[3:4], *stored, bias, layout, activation, **codes)
    assert torch.equal(alone[0], y[3])
