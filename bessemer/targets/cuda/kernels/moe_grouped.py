"""Quantized mixture of experts (moe@1 with ExpertStack experts: int8 per channel, int4 per
group, E4M3 per channel as moe_fp8@1; or Mxfp4Experts, gpt-oss's as shipped; plugins/ops.ref_moe
on the dequantized values is the reference): the step's tokens grouped by routed expert, then
one GEMM per active expert over its tokens, so an expert's codes are read once per N tile for
all the tokens routed to it, never per token.

After moe.moe_route_kernel (experts, weights [T, TOP_K]), four launches:
1. moe_sort_kernel, one program: the T * TOP_K routed slots (slot = t * TOP_K + j) sorted by
   expert, stable (within an expert, in slot order): sorted [T * TOP_K] and the experts' row
   starts [NUM_EXPERTS + 1] in it. The same routing always gives the same order.
2. moe_gate_up_grouped_kernel, grid (programs, N tiles of the expert size): program p takes
   the expert tiles p, p + programs, ... (a tile: BLOCK_M sorted rows of one expert; an expert
   with n rows has cdiv(n, BLOCK_M) tiles, so there are at most cdiv(T TOP_K, BLOCK_M) +
   NUM_EXPERTS of them) and stores h[slot] = act(gate_e x_t, up_e x_t) in the activation dtype.
3. moe_down_grouped_kernel, the same grid over the hidden size: out[slot] = down_e h[slot]
   (+ bias), fp32.
4. moe_combine_kernel, per (token, block of hidden): y = sum over the slots, in slot order, of
   weight * out[slot].
A decode step routes its few tokens to a few experts: only those experts' tiles exist, so
only the routed experts' rows are read.

Batch invariance: one tile config per weight shape (never per row count), each output element
is one program's dot over K in BLOCK_K order, and the combine sums slots in slot order, so a
token's result does not depend on the other tokens of the step or on program order.

Stored codes (ExpertStack: each expert's (N, K) in its inner format, stacked as (E*N, K) rows,
row-major): gate_up rows e * 2I + i * ROW_STRIDE (gate) and UP_OFFSET further (up): per-expert
[gate; up] blocks (ROW_STRIDE 1, UP_OFFSET I) or gpt-oss's interleaved pairs (2, 1); down rows
e * H + n. The int8 / int4 dequantizing steps are the dense GEMMs'
(kernels/gemm.py, kernels/gemm_quant.py). MXFP4 (MXFP4=True): the same rows, E2M1 codes two a byte (k even
low) and one E8M0 scale byte per 32 of K. fp8 (FP8=True, BITS=8): E4M3 codes and an fp32
scale per row; each matmul input row (x[t] for gate/up, h[slot] for down) is scaled by its
own max |row| / 448 and rounded to E4M3 (kernels/fp8_activations.py, as the dense fp8 GEMM
and the cpu's moe_fp8 do), and the dot is E4M3 x E4M3 with fp32 accumulation (on sm_90's
16-row mma.sync tiles Triton widens both operands to fp16, which holds every E4M3 value
exactly: the same products).
"""

import triton
import triton.language as tl

from bessemer.targets.cuda.kernels.fp8_activations import e4m3_row_scales, e4m3_rows
from bessemer.targets.cuda.kernels.gemm import weight_operand
from bessemer.targets.cuda.kernels.gemm_quant import int4_group_block, int4_x_planes
from bessemer.targets.cuda.kernels.moe import expert_activation


@triton.jit
def moe_sort_kernel(experts_ptr, sorted_ptr, starts_ptr, T, TOP_K: tl.constexpr, NUM_EXPERTS: tl.constexpr,
                    BLOCK: tl.constexpr, BLOCK_E: tl.constexpr):
    """experts: int32 [T * TOP_K]; sorted: int32 [T * TOP_K] slots by expert; starts: int32
    [NUM_EXPERTS + 1], expert e's rows are sorted[starts[e]:starts[e + 1]]. Grid: (1,)."""
    slots = T * TOP_K
    e = tl.arange(0, BLOCK_E)
    counts = tl.zeros([BLOCK_E], tl.int32)
    for s0 in range(0, slots, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        ex = tl.load(experts_ptr + s, mask=s < slots, other=BLOCK_E)  # past the end: no expert
        counts += tl.sum((ex[:, None] == e[None, :]).to(tl.int32), axis=0)
    start = tl.cumsum(counts, 0) - counts
    tl.store(starts_ptr + e, start, mask=e < NUM_EXPERTS)
    tl.store(starts_ptr + NUM_EXPERTS, slots)
    placed = start  # per expert: where its next slot goes
    for s0 in range(0, slots, BLOCK):
        s = s0 + tl.arange(0, BLOCK)
        ex = tl.load(experts_ptr + s, mask=s < slots, other=BLOCK_E)
        hit = (ex[:, None] == e[None, :]).to(tl.int32)  # (BLOCK, BLOCK_E)
        before = tl.cumsum(hit, 0) - hit  # the same expert's slots earlier in this block
        position = tl.sum(hit * (placed[None, :] + before), axis=1)
        tl.store(sorted_ptr + position, s, mask=s < slots)
        placed += tl.sum(hit, axis=0)


@triton.jit
def _tile_table(starts_ptr, NUM_EXPERTS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """Per expert ([BLOCK_E]): its first sorted row, its end, its tiles, the running end of
    the tiles; and the tiles in all."""
    e = tl.arange(0, BLOCK_E)
    ok = e < NUM_EXPERTS
    start = tl.load(starts_ptr + e, mask=ok, other=0)
    end = tl.load(starts_ptr + e + 1, mask=ok, other=0)
    tiles = (end - start + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, 0)
    return start, end, tiles, tile_end, tl.sum(tiles, axis=0)


@triton.jit
def _tile_rows(tile, start, end, tiles, tile_end, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """(expert, sorted row indices [BLOCK_M], which of them are the expert's) of one tile."""
    e = tl.arange(0, BLOCK_E)
    expert = tl.sum((tile_end <= tile).to(tl.int32), axis=0)
    mine = e == expert
    first = tl.sum(tl.where(mine, start + (tile - (tile_end - tiles)) * BLOCK_M, 0), axis=0)
    stop = tl.sum(tl.where(mine, end, 0), axis=0)
    rows = first + tl.arange(0, BLOCK_M)
    return expert, rows, rows < stop


@triton.jit
def _e2m1(c):
    """E2M1 codes (0..15: sign bit 3, exponent bits 2-1, mantissa bit 0) -> their values
    (0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives), fp32; exact in bf16 and fp16."""
    e = (c >> 1) & 3
    m = (c & 1).to(tl.float32)
    power = (1 << tl.maximum(e - 1, 0).to(tl.int32)).to(tl.float32)
    magnitude = tl.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * power)
    return tl.where((c & 8) != 0, -magnitude, magnitude)


@triton.jit
def _mxfp4_block(acc, x_even, x_odd, w_cols, s_cols, n_ok, k0, j, K: tl.constexpr):
    """acc + one 32-wide K block [k0, k0 + 32) of x W^T for MXFP4 codes (two a byte, k even in
    the low nibble) and E8M0 scales (uint8 e: 2^(e - 127)) per block of 32: the codes' values
    take the dots (exact in the activation dtype), the block's power of two scales the result."""
    k_even = k0 + 2 * j
    b = tl.load(w_cols + (k0 // 2 + j)[:, None], mask=n_ok[None, :] & (k_even[:, None] < K), other=0).to(tl.int32)
    part = tl.dot(x_even, _e2m1(b & 15).to(x_even.dtype))
    part = tl.dot(x_odd, _e2m1(b >> 4).to(x_odd.dtype), part)
    e8 = tl.load(s_cols + k0 // 32, mask=n_ok, other=127).to(tl.int32)
    scale = (e8 << 23).to(tl.float32, bitcast=True)  # 2^(e - 127) exactly (e = 0: 0, not 2^-127)
    return acc + part * scale[None, :]


@triton.jit
def _row_scales(x_rows, r_ok, K: tl.constexpr, FP8: tl.constexpr, BLOCK_K: tl.constexpr):
    """E4M3 experts: each x row's E4M3 scale [BLOCK_M] (read by both of gate/up's dots);
    other formats: ones, unused."""
    if FP8:
        s_x = e4m3_row_scales(x_rows, r_ok, K, BLOCK_K)
    else:
        s_x = tl.full(r_ok.shape, 1.0, tl.float32)
    return s_x


@triton.jit
def _expert_dot(acc, x_rows, r_ok, s_x, codes_ptr, scales_ptr, offsets_ptr, w_rows, n_ok, K: tl.constexpr,
                BITS: tl.constexpr, MXFP4: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr,
                SYMMETRIC: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] + x W^T over all of K for the stored rows w_rows ([BLOCK_N],
    int64) of an ExpertStack or Mxfp4Experts: x rows at x_rows ([BLOCK_M, 1] pointers,
    activation dtype), s_x their _row_scales."""
    if MXFP4:  # BLOCK_K = 32: one scale per row and block
        j = tl.arange(0, 16)
        w_cols = codes_ptr + w_rows[None, :] * (K // 2)
        s_cols = scales_ptr + w_rows * (K // 32)
        for k0 in range(0, K, 32):
            x_even, x_odd = int4_x_planes(x_rows, r_ok, k0, j, K)
            acc = _mxfp4_block(acc, x_even, x_odd, w_cols, s_cols, n_ok, k0, j, K)
    elif BITS == 8:  # a code a byte and a scale per row: int8, or E4M3 (FP8)
        w_cols = codes_ptr + w_rows[None, :] * K
        part = tl.zeros(acc.shape, tl.float32)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_rows + k[None, :], mask=r_ok[:, None] & (k[None, :] < K), other=0.0)
            if FP8:  # E4M3 x E4M3 (on a wgmma tile its partial sums join fp32 every K block)
                b = tl.load(w_cols + k[:, None], mask=n_ok[None, :] & (k[:, None] < K), other=0.0)
                part = tl.dot(e4m3_rows(a, s_x), b, part, max_num_imprecise_acc=BLOCK_K)
            else:
                part = tl.dot(a, weight_operand(w_cols, k, n_ok, K, a.dtype), part)
        # s_x: each row's E4M3 scale, or ones (exact) for int8
        acc += part * (s_x[:, None] * tl.load(scales_ptr + w_rows, mask=n_ok, other=0.0)[None, :])
    else:
        HALF: tl.constexpr = BLOCK_K // 2
        j = tl.arange(0, HALF)
        w_cols = codes_ptr + w_rows[None, :] * (K // 2)
        p_cols = w_rows * (K // GROUP)
        for k0 in range(0, K, BLOCK_K):
            x_even, x_odd = int4_x_planes(x_rows, r_ok, k0, j, K)
            acc = int4_group_block(acc, x_even, x_odd, w_cols, p_cols, n_ok, scales_ptr, offsets_ptr, k0, j, K,
                                   GROUP, SYMMETRIC)
    return acc


@triton.jit
def moe_gate_up_grouped_kernel(x_ptr, sorted_ptr, starts_ptr, codes_ptr, scales_ptr, offsets_ptr, bias_ptr, h_ptr,
                               X_STRIDE: tl.constexpr, HIDDEN: tl.constexpr, EXPERT_SIZE: tl.constexpr,
                               TOP_K: tl.constexpr, NUM_EXPERTS: tl.constexpr, ROW_STRIDE: tl.constexpr,
                               UP_OFFSET: tl.constexpr, BITS: tl.constexpr, MXFP4: tl.constexpr,
                               FP8: tl.constexpr, GROUP: tl.constexpr, SYMMETRIC: tl.constexpr,
                               HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               BLOCK_E: tl.constexpr):
    """x: (T, HIDDEN) activations; codes / scales / offsets: gate_up's stored parts
    (E * 2 EXPERT_SIZE rows of K = HIDDEN); bias fp32 [E * 2 EXPERT_SIZE] (the rows' order);
    h: (T * TOP_K, EXPERT_SIZE) activation dtype, by slot. ACTIVATION as moe.moe_gate_up_kernel.
    Grid: (programs, cdiv(EXPERT_SIZE, BLOCK_N))."""
    start, end, tiles, tile_end, num_tiles = _tile_table(starts_ptr, NUM_EXPERTS, BLOCK_M, BLOCK_E)
    i = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    i_ok = i < EXPERT_SIZE
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        expert, rows, r_ok = _tile_rows(tile, start, end, tiles, tile_end, BLOCK_M, BLOCK_E)
        slot = tl.load(sorted_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        x_rows = x_ptr + (slot // TOP_K)[:, None] * X_STRIDE
        gate_rows = expert.to(tl.int64) * (2 * EXPERT_SIZE) + i * ROW_STRIDE
        up_rows = gate_rows + UP_OFFSET
        zero = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        s_x = _row_scales(x_rows, r_ok, HIDDEN, FP8, BLOCK_K)
        gate = _expert_dot(zero, x_rows, r_ok, s_x, codes_ptr, scales_ptr, offsets_ptr, gate_rows, i_ok, HIDDEN, BITS,
                           MXFP4, FP8, GROUP, SYMMETRIC, BLOCK_K)
        up = _expert_dot(zero, x_rows, r_ok, s_x, codes_ptr, scales_ptr, offsets_ptr, up_rows, i_ok, HIDDEN, BITS,
                         MXFP4, FP8, GROUP, SYMMETRIC, BLOCK_K)
        if HAS_BIAS:
            gate += tl.load(bias_ptr + gate_rows, mask=i_ok, other=0.0)[None, :]
            up += tl.load(bias_ptr + up_rows, mask=i_ok, other=0.0)[None, :]
        h = expert_activation(gate, up, ACTIVATION)
        tl.store(h_ptr + slot[:, None] * EXPERT_SIZE + i[None, :], h.to(h_ptr.dtype.element_ty),
                 mask=r_ok[:, None] & i_ok[None, :])


@triton.jit
def moe_down_grouped_kernel(h_ptr, sorted_ptr, starts_ptr, codes_ptr, scales_ptr, offsets_ptr, bias_ptr, out_ptr,
                            HIDDEN: tl.constexpr, EXPERT_SIZE: tl.constexpr, NUM_EXPERTS: tl.constexpr,
                            BITS: tl.constexpr, MXFP4: tl.constexpr, FP8: tl.constexpr, GROUP: tl.constexpr,
                            SYMMETRIC: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr):
    """h: (T * TOP_K, EXPERT_SIZE) by slot; codes / scales / offsets: down's stored parts
    (E * HIDDEN rows of K = EXPERT_SIZE); bias fp32 [E * HIDDEN]; out: fp32 (T * TOP_K, HIDDEN)
    by slot. Grid: (programs, cdiv(HIDDEN, BLOCK_N))."""
    start, end, tiles, tile_end, num_tiles = _tile_table(starts_ptr, NUM_EXPERTS, BLOCK_M, BLOCK_E)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = n < HIDDEN
    for tile in range(tl.program_id(0), num_tiles, tl.num_programs(0)):
        expert, rows, r_ok = _tile_rows(tile, start, end, tiles, tile_end, BLOCK_M, BLOCK_E)
        slot = tl.load(sorted_ptr + rows, mask=r_ok, other=0).to(tl.int64)
        w_rows = expert.to(tl.int64) * HIDDEN + n
        h_rows = h_ptr + slot[:, None] * EXPERT_SIZE
        s_h = _row_scales(h_rows, r_ok, EXPERT_SIZE, FP8, BLOCK_K)
        y = _expert_dot(tl.zeros([BLOCK_M, BLOCK_N], tl.float32), h_rows, r_ok, s_h, codes_ptr, scales_ptr,
                        offsets_ptr, w_rows, n_ok, EXPERT_SIZE, BITS, MXFP4, FP8, GROUP, SYMMETRIC, BLOCK_K)
        if HAS_BIAS:
            y += tl.load(bias_ptr + w_rows, mask=n_ok, other=0.0)[None, :]
        tl.store(out_ptr + slot[:, None] * HIDDEN + n[None, :], y, mask=r_ok[:, None] & n_ok[None, :])


@triton.jit
def moe_combine_kernel(out_ptr, weights_ptr, y_ptr, Y_STRIDE: tl.constexpr, HIDDEN: tl.constexpr,
                       TOP_K: tl.constexpr, BLOCK_H: tl.constexpr):
    """y[t] = sum_j weights[t, j] * out[t * TOP_K + j], in slot order. Grid: (T, cdiv(HIDDEN, BLOCK_H))."""
    t = tl.program_id(0).to(tl.int64)
    n = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    n_ok = n < HIDDEN
    y = tl.zeros([BLOCK_H], tl.float32)
    for j in range(TOP_K):
        part = tl.load(out_ptr + (t * TOP_K + j) * HIDDEN + n, mask=n_ok, other=0.0)
        y += tl.load(weights_ptr + t * TOP_K + j) * part
    tl.store(y_ptr + t * Y_STRIDE + n, y.to(y_ptr.dtype.element_ty), mask=n_ok)
