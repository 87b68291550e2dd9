"""Paged attention over the KV cache: a flash-attention prefill kernel and a split-K
decode kernel (plus the reduction of its splits).

The step's rows of sequence s are cu_seqlens[s] .. cu_seqlens[s+1]-1, at the consecutive
positions context_lens[s] - n_s .. context_lens[s] - 1 (n_s rows); their keys and values
are already in the cache (rope_kv_write_kernel runs first), as are those of every earlier
position, cached blocks of a shared prefix included. Row t at position p attends to the
positions j <= p (and j > p - SLIDING_WINDOW when the window is > 0) of its sequence.

GQA: query head h reads KV head h // G (G = NUM_HEADS // NUM_KV_HEADS). A program owns
one KV head and all G query heads that share it, so every K/V tile is loaded once for G
heads: in prefill the G heads of TILE_TOKENS tokens are the rows of one tile
(row m = token m // G, head m % G); in decode they are the rows of the score tile.

Scores and the softmax are fp32 (exp2 with the log2(e) folded into the scale); the
probabilities are rounded to the activation dtype for the P.V tensor-core product, as
flash-attention does; the output accumulates in fp32.
"""

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _kv_rows(block_tables_ptr, seq, keys, key_mask, kv_head, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
             KV_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_STRIDE: tl.constexpr, KV_CODES: tl.constexpr):
    """(offset of the first element of each key's row of `kv_head` in the cache, index of
    its scale in the cache viewed as fp32; unused without codes), int64, 0 where masked.
    The cache layout: kernels/__init__.py."""
    block = tl.load(block_tables_ptr + seq * BLOCK_TABLE_STRIDE + keys // KV_BLOCK_SIZE, mask=key_mask, other=0)
    block = block.to(tl.int64)
    row = (keys % KV_BLOCK_SIZE) * NUM_KV_HEADS + kv_head  # the (token, head) row in its block
    BLOCK_BYTES: tl.constexpr = KV_BLOCK_SIZE * NUM_KV_HEADS * (HEAD_DIM + 4)
    CODE_BYTES: tl.constexpr = KV_BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM
    if KV_CODES == 0:
        first = ((block * KV_BLOCK_SIZE + keys % KV_BLOCK_SIZE) * NUM_KV_HEADS + kv_head) * HEAD_DIM
        scale = first  # no scales: unused (the same type as the other branch's)
    else:
        first = block * BLOCK_BYTES + row * HEAD_DIM
        scale = block * (BLOCK_BYTES // 4) + CODE_BYTES // 4 + row
    return first, scale


@triton.jit
def _scores(q, k, k_scales_ptr, kv_scale, key_ok, KV_CODES: tl.constexpr):
    """q @ k (fp32, (rows, keys)); k: (D, keys) as cached. Codes (int8 or E4M3, exact in the
    activation dtype) take the tensor-core dot as they are and each key's scale multiplies
    its column of scores."""
    if KV_CODES == 0:
        return tl.dot(q, k)
    s = tl.dot(q, k.to(tl.float32).to(q.dtype))
    return s * tl.load(k_scales_ptr + kv_scale, mask=key_ok, other=0.0)[None, :]


@triton.jit
def _weighted_values(p, v, v_scales_ptr, kv_scale, key_ok, act_dtype: tl.constexpr, KV_CODES: tl.constexpr):
    """p @ v (fp32, (rows, D)); p: (rows, keys) fp32 probabilities, v: (keys, D) as cached.
    Codes: each key's scale multiplies its column of p before p is rounded for the dot."""
    if KV_CODES == 0:
        return tl.dot(p.to(v.dtype), v)
    p = p * tl.load(v_scales_ptr + kv_scale, mask=key_ok, other=0.0)[None, :]
    return tl.dot(p.to(act_dtype), v.to(tl.float32).to(act_dtype))


@triton.jit
def attention_prefill_kernel(q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr,
                             cu_seqlens_ptr, context_lens_ptr, prefill_tiles_ptr, sinks_ptr, scale,
                             NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                             Q_STRIDE: tl.constexpr, OUT_STRIDE: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                             BLOCK_TABLE_STRIDE: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
                             TILE_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_D: tl.constexpr, KV_CODES: tl.constexpr, HAS_SINKS: tl.constexpr):
    """One tile of TILE_TOKENS query rows of one sequence x the G query heads of one KV head.
    prefill_tiles: [P, 2] int32 (sequence, first row of the tile within the sequence).
    Grid: (P, NUM_KV_HEADS)."""
    G: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(prefill_tiles_ptr + 2 * tile)
    q0 = tl.load(prefill_tiles_ptr + 2 * tile + 1)
    row0 = tl.load(cu_seqlens_ptr + seq)
    num_rows = tl.load(cu_seqlens_ptr + seq + 1) - row0
    first_pos = tl.load(context_lens_ptr + seq) - num_rows  # position of the sequence's row 0

    m = tl.arange(0, BLOCK_M)
    token = q0 + m // G
    head = kv_head * G + m % G
    row_ok = (m < TILE_TOKENS * G) & (token < num_rows)
    q_pos = first_pos + token
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    rows = (row0 + token).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * Q_STRIDE + head[:, None] * HEAD_DIM + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    hi = first_pos + tl.minimum(q0 + TILE_TOKENS, num_rows)  # one past the tile's last position
    lo = 0
    if SLIDING_WINDOW > 0:
        lo = tl.maximum(first_pos + q0 - SLIDING_WINDOW + 1, 0)
    qk_scale = scale * LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < hi
        kv, kv_scale = _kv_rows(block_tables_ptr, seq, keys, key_ok, kv_head, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE,
                                BLOCK_TABLE_STRIDE, KV_CODES)
        k = tl.load(k_cache_ptr + kv[None, :] + d[:, None], mask=key_ok[None, :] & d_ok[:, None], other=0.0)
        s = _scores(q, k, k_scales_ptr, kv_scale, key_ok, KV_CODES) * qk_scale  # (BLOCK_M, BLOCK_N), log2 units
        valid = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
        if SLIDING_WINDOW > 0:
            valid = valid & (keys[None, :] > q_pos[:, None] - SLIDING_WINDOW)
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_base = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        p = tl.exp2(s - m_base[:, None])
        alpha = tl.exp2(m_i - m_base)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv[:, None] + d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + _weighted_values(p, v, v_scales_ptr, kv_scale, key_ok, q.dtype, KV_CODES)
        m_i = m_new
    if HAS_SINKS:  # gpt-oss: each head's softmax also counts exp(sinks[h]), a logit with no value
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * LOG2E
        l_i += tl.exp2(sink - m_i)
    out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
    tl.store(out_ptr + rows[:, None] * OUT_STRIDE + head[:, None] * HEAD_DIM + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def attention_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr,
                            cu_seqlens_ptr, context_lens_ptr, decode_seqs_ptr, partials_ptr, scale,
                            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                            Q_STRIDE: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                            BLOCK_TABLE_STRIDE: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
                            NUM_SPLITS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr, KV_CODES: tl.constexpr):
    """The one row of a decode sequence, the G heads of one KV head, over one of NUM_SPLITS
    contiguous ranges of its keys. Writes unnormalized partials
    partials[i, kv_head, split, g, :] = (acc[0:HEAD_DIM], running max m, sum l), fp32, for
    attention_decode_reduce_kernel. decode_seqs: [D] int32.
    Grid: (D, NUM_KV_HEADS, NUM_SPLITS)."""
    G: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(decode_seqs_ptr + i)
    row = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    ctx = tl.load(context_lens_ptr + seq)  # the row is at position ctx - 1
    lo = 0
    if SLIDING_WINDOW > 0:
        lo = tl.maximum(ctx - SLIDING_WINDOW, 0)
    per_split = tl.cdiv(tl.cdiv(ctx - lo, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = lo + split * per_split
    end = tl.minimum(ctx, start + per_split)

    g = tl.arange(0, BLOCK_G)
    g_ok = g < G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + row * Q_STRIDE + (kv_head * G + g)[:, None] * HEAD_DIM + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    qk_scale = scale * LOG2E
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for block_start in range(start, end, BLOCK_N):
        keys = block_start + tl.arange(0, BLOCK_N)
        key_ok = keys < end
        kv, kv_scale = _kv_rows(block_tables_ptr, seq, keys, key_ok, kv_head, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE,
                                BLOCK_TABLE_STRIDE, KV_CODES)
        k = tl.load(k_cache_ptr + kv[None, :] + d[:, None], mask=key_ok[None, :] & d_ok[:, None], other=0.0)
        s = tl.where(key_ok[None, :], _scores(q, k, k_scales_ptr, kv_scale, key_ok, KV_CODES) * qk_scale,
                     float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])  # every block has a key, so m_new is finite
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + kv[:, None] + d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + _weighted_values(p, v, v_scales_ptr, kv_scale, key_ok, q.dtype, KV_CODES)
        m_i = m_new
    PARTIAL: tl.constexpr = HEAD_DIM + 2
    base = partials_ptr + (((i * NUM_KV_HEADS + kv_head) * NUM_SPLITS + split) * G + g).to(tl.int64) * PARTIAL
    tl.store(base[:, None] + d[None, :], acc, mask=g_ok[:, None] & d_ok[None, :])
    tl.store(base + HEAD_DIM, m_i, mask=g_ok)
    tl.store(base + HEAD_DIM + 1, l_i, mask=g_ok)


@triton.jit
def attention_decode_reduce_kernel(partials_ptr, cu_seqlens_ptr, decode_seqs_ptr, out_ptr, sinks_ptr,
                                   NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                                   HEAD_DIM: tl.constexpr, OUT_STRIDE: tl.constexpr,
                                   NUM_SPLITS: tl.constexpr, BLOCK_SPLITS: tl.constexpr,
                                   BLOCK_D: tl.constexpr, HAS_SINKS: tl.constexpr):
    """Combines the splits of one decode row and query head (log-sum-exp rescaling; an
    empty split has m = -inf, l = 0). Grid: (D, NUM_HEADS)."""
    G: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    PARTIAL: tl.constexpr = HEAD_DIM + 2
    i = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, BLOCK_SPLITS)
    sp_ok = sp < NUM_SPLITS
    base = partials_ptr + (((i * NUM_KV_HEADS + head // G) * NUM_SPLITS + sp) * G + head % G).to(tl.int64) * PARTIAL
    m = tl.load(base + HEAD_DIM, mask=sp_ok, other=float("-inf"))
    l = tl.load(base + HEAD_DIM + 1, mask=sp_ok, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_all))
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    acc = tl.load(base[:, None] + d[None, :], mask=sp_ok[:, None] & d_ok[None, :], other=0.0)
    denominator = tl.sum(l * w, axis=0)
    if HAS_SINKS:  # once, after the splits combine (m_all: the row's max, log2 units)
        denominator += tl.exp2(tl.load(sinks_ptr + head) * LOG2E - m_all)
    out = tl.sum(acc * w[:, None], axis=0) / denominator
    row = tl.load(cu_seqlens_ptr + tl.load(decode_seqs_ptr + i)).to(tl.int64)
    tl.store(out_ptr + row * OUT_STRIDE + head * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
