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

Batch invariance: a row's result does not depend on which kernel computes it (a prompt's
last token is a decode row after a prefix-cache hit or a chunk boundary, a prefill tile row
otherwise), on the other rows of its tile, or on the number of decode splits. Both kernels
cut the keys into blocks of BLOCK_N starting at absolute multiples of BLOCK_N, compute each
block's softmax alone (_block_partial, on tiles of the same shape) and merge the blocks in key
order with the same arithmetic (_merge): the prefill tile as it goes, the decode reduction
after the splits stored every block's partial. Blocks a row does not see merge as exact no-ops.
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
def _visible(keys, q_pos, key_ok, SLIDING_WINDOW: tl.constexpr):
    """(rows, keys) mask: key_ok, causal, and inside the window when there is one."""
    valid = key_ok[None, :] & (keys[None, :] <= q_pos[:, None])
    if SLIDING_WINDOW > 0:
        valid = valid & (keys[None, :] > q_pos[:, None] - SLIDING_WINDOW)
    return valid


@triton.jit
def _first_block_start(lo, BLOCK_N: tl.constexpr):
    """The first key block of a range starting at key `lo`: key blocks start at multiples of
    BLOCK_N whatever rows a tile holds, so a row meets the same blocks in every kernel."""
    return (lo // BLOCK_N) * BLOCK_N


@triton.jit
def _block_partial(q, q_pos, start, block_tables_ptr, seq, kv_head, k_cache_ptr, v_cache_ptr, k_scales_ptr,
                   v_scales_ptr, hi, qk_scale, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                   KV_BLOCK_SIZE: tl.constexpr, BLOCK_TABLE_STRIDE: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KV_CODES: tl.constexpr):
    """The softmax of the key block [start, start + BLOCK_N) alone (keys < hi): (its row max
    m_b (log2 units, -inf for a row that sees none of its keys), sum l_b of exp2(s - m_b), the
    unnormalized p @ v acc_b (rows, BLOCK_D)), fp32. Both kernels compute a block this way."""
    keys = start + tl.arange(0, BLOCK_N)
    key_ok = keys < hi
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    kv, kv_scale = _kv_rows(block_tables_ptr, seq, keys, key_ok, kv_head, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE,
                            BLOCK_TABLE_STRIDE, KV_CODES)
    k = tl.load(k_cache_ptr + kv[None, :] + d[:, None], mask=key_ok[None, :] & d_ok[:, None], other=0.0)
    s = _scores(q, k, k_scales_ptr, kv_scale, key_ok, KV_CODES) * qk_scale  # (rows, BLOCK_N), log2 units
    s = tl.where(_visible(keys, q_pos, key_ok, SLIDING_WINDOW), s, float("-inf"))
    m_b = tl.max(s, axis=1)
    p = tl.exp2(s - tl.where(m_b == float("-inf"), 0.0, m_b)[:, None])
    l_b = tl.sum(p, axis=1)
    v = tl.load(v_cache_ptr + kv[:, None] + d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
    return m_b, l_b, _weighted_values(p, v, v_scales_ptr, kv_scale, key_ok, q.dtype, KV_CODES)


@triton.jit
def _merge(m_i, l_i, m_b, l_b):
    """The running softmax (m_i, l_i) followed by one more key block's (m_b, l_b), each
    rescaled to their common max: (max, sum, the running acc's weight alpha, the block acc_b's
    weight beta); the caller forms acc * alpha + acc_b * beta. The prefill tile merges its blocks in key order with
    this, and so does the decode reduction with the decode splits' blocks: the same blocks
    merged in the same order give the same bits. A block a row does not see (m_b = -inf) is an
    exact no-op, so which extra blocks a tile spans does not matter. m, l: (rows,) or scalars."""
    m_new = tl.maximum(m_i, m_b)
    base = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key seen yet: both weights 0
    alpha = tl.exp2(m_i - base)
    beta = tl.exp2(m_b - base)
    return m_new, l_i * alpha + l_b * beta, alpha, beta


@triton.jit
def _finish(acc, m_i, l_i, sink_logit, HAS_SINKS: tl.constexpr):
    """acc / l (rows with no key: 0); with sinks (gpt-oss) the softmax also counts
    exp(sink), a logit with no value (sink_logit in log2 units)."""
    if HAS_SINKS:
        l_i += tl.exp2(sink_logit - m_i)
    return acc / tl.where(l_i > 0.0, l_i, 1.0)


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
    for start in range(_first_block_start(lo, BLOCK_N), hi, BLOCK_N):
        m_b, l_b, acc_b = _block_partial(q, q_pos, start, block_tables_ptr, seq, kv_head, k_cache_ptr, v_cache_ptr,
                                         k_scales_ptr, v_scales_ptr, hi, qk_scale, NUM_KV_HEADS, HEAD_DIM,
                                         KV_BLOCK_SIZE, BLOCK_TABLE_STRIDE, SLIDING_WINDOW, BLOCK_N, BLOCK_D, KV_CODES)
        m_i, l_i, alpha, beta = _merge(m_i, l_i, m_b, l_b)
        acc = acc * alpha[:, None] + acc_b * beta[:, None]
    sink = tl.zeros([BLOCK_M], tl.float32)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0) * LOG2E
    out = _finish(acc, m_i[:, None], l_i[:, None], sink[:, None], HAS_SINKS)
    tl.store(out_ptr + rows[:, None] * OUT_STRIDE + head[:, None] * HEAD_DIM + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.jit
def _decode_blocks(ctx, SLIDING_WINDOW: tl.constexpr, BLOCK_N: tl.constexpr):
    """(first, one past the last) key block index of a decode row at position ctx - 1."""
    lo = 0
    if SLIDING_WINDOW > 0:
        lo = tl.maximum(ctx - SLIDING_WINDOW, 0)
    return lo // BLOCK_N, tl.cdiv(ctx, BLOCK_N)


@triton.jit
def attention_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, block_tables_ptr,
                            cu_seqlens_ptr, context_lens_ptr, decode_seqs_ptr, partials_ptr, scale,
                            NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                            Q_STRIDE: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                            BLOCK_TABLE_STRIDE: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
                            NUM_SPLITS: tl.constexpr, MAX_KEY_BLOCKS: tl.constexpr, BLOCK_G: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, KV_CODES: tl.constexpr):
    """The one row of a decode sequence, the G heads of one KV head, over one of NUM_SPLITS
    contiguous runs of its BLOCK_N-key blocks (absolute multiples of BLOCK_N, as the prefill
    tiles'). Writes each block's softmax alone, unmerged:
    partials[i, kv_head, block, g, :] = (acc_b[0:HEAD_DIM], m_b, l_b), fp32, which
    attention_decode_reduce_kernel merges in key order as the prefill kernel does. BLOCK_G:
    the prefill tile's rows, so that both kernels' dots and row sums are the same shapes.
    decode_seqs: [D] int32. Grid: (D, NUM_KV_HEADS, NUM_SPLITS)."""
    G: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    i = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq = tl.load(decode_seqs_ptr + i)
    row = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    ctx = tl.load(context_lens_ptr + seq)  # the row is at position ctx - 1
    first, stop = _decode_blocks(ctx, SLIDING_WINDOW, BLOCK_N)
    per_split = tl.cdiv(stop - first, NUM_SPLITS)
    mine = first + split * per_split

    g = tl.arange(0, BLOCK_G)
    g_ok = g < G
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q = tl.load(q_ptr + row * Q_STRIDE + (kv_head * G + g)[:, None] * HEAD_DIM + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    q_pos = tl.zeros([BLOCK_G], tl.int32) + (ctx - 1)
    qk_scale = scale * LOG2E
    PARTIAL: tl.constexpr = HEAD_DIM + 2
    for block in range(mine, tl.minimum(mine + per_split, stop)):
        m_b, l_b, acc_b = _block_partial(q, q_pos, block * BLOCK_N, block_tables_ptr, seq, kv_head, k_cache_ptr,
                                         v_cache_ptr, k_scales_ptr, v_scales_ptr, ctx, qk_scale, NUM_KV_HEADS,
                                         HEAD_DIM, KV_BLOCK_SIZE, BLOCK_TABLE_STRIDE, SLIDING_WINDOW, BLOCK_N,
                                         BLOCK_D, KV_CODES)
        base = partials_ptr + (((i * NUM_KV_HEADS + kv_head) * MAX_KEY_BLOCKS + block) * G + g).to(tl.int64) * PARTIAL
        tl.store(base[:, None] + d[None, :], acc_b, mask=g_ok[:, None] & d_ok[None, :])
        tl.store(base + HEAD_DIM, m_b, mask=g_ok)
        tl.store(base + HEAD_DIM + 1, l_b, mask=g_ok)


@triton.jit
def attention_decode_reduce_kernel(partials_ptr, cu_seqlens_ptr, context_lens_ptr, decode_seqs_ptr, out_ptr,
                                   sinks_ptr, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                                   HEAD_DIM: tl.constexpr, OUT_STRIDE: tl.constexpr, SLIDING_WINDOW: tl.constexpr,
                                   MAX_KEY_BLOCKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                   HAS_SINKS: tl.constexpr):
    """Merges the key blocks of one decode row and query head in key order (_merge, as the
    prefill tile does), then normalizes. Grid: (D, NUM_HEADS)."""
    G: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    PARTIAL: tl.constexpr = HEAD_DIM + 2
    i = tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.load(decode_seqs_ptr + i)
    first, stop = _decode_blocks(tl.load(context_lens_ptr + seq), SLIDING_WINDOW, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for block in range(first, stop):
        base = partials_ptr + (((i * NUM_KV_HEADS + head // G) * MAX_KEY_BLOCKS + block) * G + head % G).to(tl.int64) \
            * PARTIAL
        acc_b = tl.load(base + d, mask=d_ok, other=0.0)
        m_i, l_i, alpha, beta = _merge(m_i, l_i, tl.load(base + HEAD_DIM), tl.load(base + HEAD_DIM + 1))
        acc = acc * alpha + acc_b * beta
    sink = 0.0
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head) * LOG2E
    out = _finish(acc, m_i, l_i, sink, HAS_SINKS)
    row = tl.load(cu_seqlens_ptr + seq).to(tl.int64)
    tl.store(out_ptr + row * OUT_STRIDE + head * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=d_ok)
