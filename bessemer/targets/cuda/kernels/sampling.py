"""The logits path's last step on the device: greedy argmax, or temperature + top-k +
top-p sampling, one program per selected row, so a decode step copies L token ids to the
host instead of L x vocab logits.

No sort: the top-k and top-p thresholds are found by bisection over the logits' int32
order keys (fp32 bits mapped so that integer order is float order), each step one pass
over the row, which stays in L2. Exact, ties included: top-k keeps every token whose logit
is >= the k-th largest; top-p keeps the tokens >= the largest threshold whose kept mass
reaches top_p. The draw walks the kept tokens in vocabulary order: the first token whose
cumulative (unnormalized) probability exceeds uniform * kept mass. ops.ref_sample_rows is
the reference. Greedy rows and the top-k set are exact on the GPU too (integer keys); the
probabilities are not: 1 / T is div.full.f32 and exp ex2.approx there, a few fp32 ulp from
NumPy's, so a top-p cut or a draw that falls within that of a boundary may take the
neighbouring token (the interpreter's draws are the reference's, token for token).
"""

import triton
import triton.language as tl


@triton.jit
def _order_key(x):
    """fp32 -> int32 with the same order (for non-NaN values)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _count_at_least(row_ptr, threshold, V: tl.constexpr, BLOCK: tl.constexpr):
    """Number of logits whose order key is >= threshold."""
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    for c in range(0, V, BLOCK):
        ok = c + offs < V
        key = _order_key(tl.load(row_ptr + c + offs, mask=ok, other=0.0).to(tl.float32))
        count += (ok & (key >= threshold)).to(tl.int32)
    return tl.sum(count, axis=0)


@triton.jit
def _mass_at_least(row_ptr, threshold, x_max, inv_temperature, V: tl.constexpr, BLOCK: tl.constexpr):
    """Sum of exp((x - x_max) / T) over the logits whose order key is >= threshold."""
    offs = tl.arange(0, BLOCK)
    mass = tl.zeros([BLOCK], tl.float32)
    for c in range(0, V, BLOCK):
        ok = c + offs < V
        x = tl.load(row_ptr + c + offs, mask=ok, other=0.0).to(tl.float32)
        keep = ok & (_order_key(x) >= threshold)
        mass += tl.where(keep, tl.exp((x - x_max) * inv_temperature), 0.0)
    return tl.sum(mass, axis=0)


@triton.jit
def sample_kernel(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, uniform_ptr, tokens_ptr,
                  V: tl.constexpr, LOGITS_STRIDE: tl.constexpr, BLOCK: tl.constexpr,
                  SEARCH_STEPS: tl.constexpr):
    """tokens[r] for logits row r (fp32, row stride LOGITS_STRIDE): argmax (first index)
    when temperature[r] <= 0, else a draw with uniform[r] in [0, 1) from the tokens that
    top_k[r] (<= 0 or >= V: all) and top_p[r] (1: all) keep. Grid: (L,)."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * LOGITS_STRIDE
    offs = tl.arange(0, BLOCK)
    # per lane: max, first index of it, min over the chunks
    lane_max = tl.full([BLOCK], float("-inf"), tl.float32)
    lane_arg = tl.zeros([BLOCK], tl.int32)
    lane_min = tl.full([BLOCK], float("inf"), tl.float32)
    for c in range(0, V, BLOCK):
        ok = c + offs < V
        x = tl.load(row_ptr + c + offs, mask=ok, other=float("-inf")).to(tl.float32)
        better = x > lane_max
        lane_arg = tl.where(better, c + offs, lane_arg)
        lane_max = tl.where(better, x, lane_max)
        lane_min = tl.minimum(lane_min, tl.where(ok, x, float("inf")))
    x_max = tl.max(lane_max, axis=0)
    token = tl.min(tl.where(lane_max == x_max, lane_arg, V), axis=0)

    temperature = tl.load(temperature_ptr + row)
    if temperature > 0.0:
        inv_temperature = 1.0 / temperature
        key_max = _order_key(x_max).to(tl.int64)
        threshold = _order_key(tl.min(lane_min, axis=0)).to(tl.int64)  # keeps every token
        top_k = tl.load(top_k_ptr + row)
        if (top_k > 0) & (top_k < V):
            # largest key t with count(key >= t) >= top_k: the k-th largest logit
            lo = threshold
            hi = key_max
            for _ in range(SEARCH_STEPS):
                mid = lo + (hi - lo + 1) // 2
                enough = _count_at_least(row_ptr, mid.to(tl.int32), V, BLOCK) >= top_k
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid - 1)
            threshold = lo
        top_p = tl.load(top_p_ptr + row)
        if top_p < 1.0:
            target = top_p * _mass_at_least(row_ptr, threshold.to(tl.int32), x_max, inv_temperature, V, BLOCK)
            lo = threshold
            hi = key_max
            for _ in range(SEARCH_STEPS):
                mid = lo + (hi - lo + 1) // 2
                enough = _mass_at_least(row_ptr, mid.to(tl.int32), x_max, inv_temperature, V, BLOCK) >= target
                lo = tl.where(enough, mid, lo)
                hi = tl.where(enough, hi, mid - 1)
            threshold = lo
        kept_mass = _mass_at_least(row_ptr, threshold.to(tl.int32), x_max, inv_temperature, V, BLOCK)
        draw = tl.load(uniform_ptr + row) * kept_mass
        running = tl.zeros([BLOCK], tl.float32)
        lane_hit = tl.full([BLOCK], V, tl.int32)
        lane_last = tl.full([BLOCK], -1, tl.int32)
        for c in range(0, V, BLOCK):
            ok = c + offs < V
            x = tl.load(row_ptr + c + offs, mask=ok, other=0.0).to(tl.float32)
            keep = ok & (_order_key(x) >= threshold.to(tl.int32))
            w = tl.where(keep, tl.exp((x - x_max) * inv_temperature), 0.0)
            hit = keep & (running + tl.cumsum(w, axis=0) > draw)
            lane_hit = tl.minimum(lane_hit, tl.where(hit, c + offs, V))
            lane_last = tl.maximum(lane_last, tl.where(keep, c + offs, -1))
            running += tl.sum(w, axis=0)
        hit = tl.min(lane_hit, axis=0)
        # a draw past the summed mass (rounding) takes the last kept token
        token = tl.where(hit < V, hit, tl.max(lane_last, axis=0))
    tl.store(tokens_ptr + row, token)
