"""Paged attention kernels under the Triton interpreter vs ops.ref_attention, sequence by
sequence, on one step that mixes what the scheduler produces: a prefill chunk over cached
blocks (chunked prefill), a whole prompt, decode rows at ragged context lengths (block and
split boundaries), a 1-token context, and two sequences sharing a prefix's blocks.

Bound (tolerances.py): one output rounding + the rounding of the probabilities for the P.V
product (at most that fraction of max|v|) + fp32 arithmetic.
"""

import numpy as np
import pytest

from interp_support import assert_rounded_close, device_tensor, host, torch

from bessemer.plugins import ops
from bessemer.quantization import kv_cache as kvq
from bessemer.targets.cuda import step_inputs
from bessemer.targets.cuda.kernels import attention

# (context length, rows in this step) per sequence
STEP = [(12, 7), (9, 1), (10, 10), (1, 1), (23, 1), (16, 1)]
CASES = [  # (heads, kv heads, head_dim, kv block size, sliding window, decode splits, tiles)
    (4, 2, 16, 4, 0, 1, dict(BLOCK_M=16, BLOCK_N=16)),
    (6, 2, 32, 4, 5, 3, dict(BLOCK_M=16, BLOCK_N=16)),   # GQA 3: 16-row tiles hold 5 tokens
    (3, 3, 24, 8, 0, 2, dict(BLOCK_M=16, BLOCK_N=16)),   # MHA, head_dim not a power of two
    (8, 1, 16, 4, 6, 4, dict(BLOCK_M=32, BLOCK_N=16)),   # GQA 8 (multi-query), window
]


def _block_tables(rng, contexts, block_size):
    """Distinct shuffled blocks per sequence, except that sequence 1 reuses sequence 0's
    first full block (a cached prefix shared by two sequences)."""
    need = [-(-c // block_size) for c in contexts]
    ids = rng.permutation(sum(need) + 3)
    tables, start = [], 0
    for n in need:
        tables.append(list(ids[start:start + n]))
        start += n
    tables[1][0] = tables[0][0]
    width = max(need)
    return np.array([t + [-1] * (width - len(t)) for t in tables], dtype=np.int32), int(ids.max()) + 1


def quantized_cache(values, kind: str, block_size: int):
    """A one-byte KV cache region as the kernels read it (kernels/__init__.py: per block its
    codes, then its fp32 scales), from values (slots, kv_heads, head_dim), with the codes of
    quantization/kv_cache.py. Returns (codes view, scales view of the same bytes, the
    dequantized values the kernels should see)."""
    codes, scales = (kvq.quantize_int8 if kind == "int8" else kvq.quantize_fp8)(np.asarray(values, np.float32))
    dequantized = (kvq.dequantize_int8 if kind == "int8" else kvq.dequantize_fp8)(codes, scales)
    blocks = codes.shape[0] // block_size
    region = np.concatenate([np.concatenate([codes[b * block_size:(b + 1) * block_size].view(np.uint8).ravel(),
                                             scales[b * block_size:(b + 1) * block_size].ravel().view(np.uint8)])
                             for b in range(blocks)])
    mem = torch.from_numpy(region.copy())
    return mem.view(torch.int8 if kind == "int8" else torch.float8_e4m3fn), mem.view(torch.float32), dequantized


def decode_attention(q, out, k_cache, v_cache, k_scales, v_scales, tables, cu, contexts, sinks_t, scale, splits,
                     block_m, common):
    """The decode launch and its reduction over the step's one-row sequences, as lower.py
    launches them (the decode tile as many rows as the prefill tile's BLOCK_M)."""
    i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    heads, kv_heads, head_dim = common["NUM_HEADS"], common["NUM_KV_HEADS"], common["HEAD_DIM"]
    decode = step_inputs.decode_seqs(cu)
    key_blocks = -(-max(contexts) // common["BLOCK_N"])
    partials = torch.full((len(decode) * heads * key_blocks * (head_dim + 2),), float("nan"))
    attention.attention_decode_kernel[(len(decode), kv_heads, splits)](
        q, k_cache, v_cache, k_scales, v_scales, i32(tables), i32(cu), i32(contexts), i32(decode), partials, scale,
        NUM_SPLITS=splits, MAX_KEY_BLOCKS=key_blocks, BLOCK_G=block_m, **common)
    attention.attention_decode_reduce_kernel[(len(decode), heads)](
        partials, i32(cu), i32(contexts), i32(decode), out, sinks_t, NUM_HEADS=heads, NUM_KV_HEADS=kv_heads,
        HEAD_DIM=head_dim, OUT_STRIDE=heads * head_dim, SLIDING_WINDOW=common["SLIDING_WINDOW"],
        MAX_KEY_BLOCKS=key_blocks, BLOCK_N=common["BLOCK_N"], BLOCK_D=common["BLOCK_D"],
        HAS_SINKS=sinks_t.numel() > 0)


@pytest.mark.parametrize("dtype,kv,sinks", [("bfloat16", None, False), ("float16", None, False),
                                            ("bfloat16", "int8", False), ("bfloat16", "fp8", False),
                                            ("bfloat16", None, True)])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,window,splits,tiles", CASES)
def test_prefill_and_decode_attention_match_reference(dtype, kv, sinks, heads, kv_heads, head_dim, block_size,
                                                      window, splits, tiles):
    """kv None: the cache in the activation dtype; int8 / fp8: one-byte codes with a scale
    per (token, KV head), against the reference on the values those codes stand for.
    sinks: attention_sinks@1 (gpt-oss), a logit per head with no value in each softmax."""
    if dtype == "float16" and heads != 6:
        pytest.skip("fp16 once, on the GQA-3 window case (the kernels are dtype-generic)")
    rng = np.random.default_rng(heads * 100 + head_dim)
    contexts = [c for c, _ in STEP]
    rows = [n for _, n in STEP]
    tables, num_blocks = _block_tables(rng, contexts, block_size)
    cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    t = int(cu[-1])
    group, block_d = heads // kv_heads, 1 << (head_dim - 1).bit_length()
    k_values = rng.normal(size=(num_blocks * block_size, kv_heads, head_dim)) * np.exp(rng.normal(size=(1, kv_heads, 1)))
    v_values = rng.normal(size=(num_blocks * block_size, kv_heads, head_dim))
    if kv is None:
        k_cache, v_cache = device_tensor(k_values, dtype), device_tensor(v_values, dtype)
        k_scales = v_scales = torch.empty(0, dtype=torch.float32)
        k_all, v_all = host(k_cache), host(v_cache)
    else:
        k_cache, k_scales, k_all = quantized_cache(k_values, kv, block_size)
        v_cache, v_scales, v_all = quantized_cache(v_values, kv, block_size)
    q = device_tensor(rng.normal(size=(t, heads * head_dim)), dtype)
    # sinks around the scores' scale, some large enough to take most of a head's weight
    sink_values = (rng.normal(size=heads) * 2).astype(np.float32) if sinks else None
    sinks_t = torch.from_numpy(sink_values) if sinks else torch.empty(0, dtype=torch.float32)
    out = torch.zeros(t, heads * head_dim, dtype=q.dtype)
    i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    common = dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim, Q_STRIDE=heads * head_dim,
                  KV_BLOCK_SIZE=block_size, BLOCK_TABLE_STRIDE=tables.shape[1], SLIDING_WINDOW=window,
                  BLOCK_N=tiles["BLOCK_N"], BLOCK_D=block_d, KV_CODES={None: 0, "int8": 1, "fp8": 2}[kv])
    scale = head_dim ** -0.5

    tile_tokens = tiles["BLOCK_M"] // group
    prefill = step_inputs.prefill_tiles(cu, tile_tokens)
    attention.attention_prefill_kernel[(len(prefill), kv_heads)](
        q, out, k_cache, v_cache, k_scales, v_scales, i32(tables), i32(cu), i32(contexts), i32(prefill), sinks_t,
        scale, OUT_STRIDE=heads * head_dim, TILE_TOKENS=tile_tokens, BLOCK_M=tiles["BLOCK_M"], HAS_SINKS=sinks,
        **common)
    decode_attention(q, out, k_cache, v_cache, k_scales, v_scales, tables, cu, contexts, sinks_t, scale, splits,
                     tiles["BLOCK_M"], common)

    from tolerances import CUDA_OUTPUT_ROUNDING

    q_all, o_all = host(q), host(out)
    for s, (ctx, n) in enumerate(STEP):
        slots = np.array([tables[s, j // block_size] * block_size + j % block_size for j in range(ctx)])
        ks, vs = k_all[slots].reshape(ctx, -1), v_all[slots].reshape(ctx, -1)
        ref = ops.ref_attention(q_all[cu[s]:cu[s + 1]], ks, vs, np.arange(ctx - n, ctx), np.arange(ctx),
                                heads, kv_heads, head_dim, scale, window, sinks=sink_values)
        p_rounding = CUDA_OUTPUT_ROUNDING[dtype] * np.abs(vs).max()
        assert_rounded_close(o_all[cu[s]:cu[s + 1]], ref, dtype, f"sequence {s} (context {ctx}, {n} rows)",
                             extra=p_rounding)


@pytest.mark.parametrize("kv,window,sinks", [(None, 0, False), (None, 21, False), ("int8", 0, False),
                                             (None, 0, True)])
def test_a_row_gets_the_same_bits_from_the_prefill_tile_and_the_decode_splits(kv, window, sinks):
    """The last row of a sequence computed by the prefill kernel (with 9 rows before it in its
    step, tiles of 4 tokens) and by the decode kernel (its step's only row) in 1 and in 3
    splits: bit-identical, over 1 to 4 key blocks of 16 (contexts 5, 16, 17, 50, 64) and a
    window of 21 that starts inside a block. What lets a prompt's last token, a decode row
    after a prefix-cache hit or a chunk boundary, match the same token inside a prefill."""
    heads, kv_heads, head_dim, block_size, block_m = 8, 2, 16, 4, 16
    contexts = [5, 16, 17, 50, 64]
    rng = np.random.default_rng(7)
    need = [-(-c // block_size) for c in contexts]
    ids = rng.permutation(sum(need))
    tables = np.full((len(contexts), max(need)), -1, np.int32)
    for s, start in enumerate(np.cumsum([0] + need[:-1])):
        tables[s, :need[s]] = ids[start:start + need[s]]
    slots = len(ids) * block_size
    dtype = "bfloat16"
    values = [rng.normal(size=(slots, kv_heads, head_dim)) for _ in range(2)]
    if kv is None:
        (k_cache, v_cache), k_scales = (device_tensor(v, dtype) for v in values), torch.empty(0, dtype=torch.float32)
        v_scales = k_scales
    else:
        (k_cache, k_scales, _), (v_cache, v_scales, _) = (quantized_cache(v, kv, block_size) for v in values)
    sinks_t = torch.from_numpy((rng.normal(size=heads) * 2).astype(np.float32)) if sinks else \
        torch.empty(0, dtype=torch.float32)
    last_q = device_tensor(rng.normal(size=(len(contexts), heads * head_dim)), dtype)
    common = dict(NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim, Q_STRIDE=heads * head_dim,
                  KV_BLOCK_SIZE=block_size, BLOCK_TABLE_STRIDE=tables.shape[1], SLIDING_WINDOW=window, BLOCK_N=16,
                  BLOCK_D=16, KV_CODES={None: 0, "int8": 1}[kv])
    i32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int32))  # noqa: E731
    scale = head_dim ** -0.5

    # prefill: each sequence's last min(ctx, 10) rows, the last one being last_q
    rows = [min(c, 10) for c in contexts]
    cu = np.concatenate([[0], np.cumsum(rows)]).astype(np.int32)
    q = device_tensor(rng.normal(size=(int(cu[-1]), heads * head_dim)), dtype)
    q[cu[1:] - 1] = last_q
    tile_tokens = block_m // (heads // kv_heads)
    tiles = step_inputs.prefill_tiles(cu, tile_tokens)
    prefilled = torch.zeros_like(q)
    attention.attention_prefill_kernel[(len(tiles), kv_heads)](
        q, prefilled, k_cache, v_cache, k_scales, v_scales, i32(tables), i32(cu), i32(contexts), i32(tiles), sinks_t,
        scale, OUT_STRIDE=heads * head_dim, TILE_TOKENS=tile_tokens, BLOCK_M=block_m, HAS_SINKS=sinks, **common)
    want = host(prefilled)[cu[1:] - 1]

    one_row = np.arange(len(contexts) + 1, dtype=np.int32)
    for splits in (1, 3):
        decoded = torch.zeros_like(last_q)
        decode_attention(last_q, decoded, k_cache, v_cache, k_scales, v_scales, tables, one_row, contexts, sinks_t,
                         scale, splits, block_m, common)
        np.testing.assert_array_equal(host(decoded), want, err_msg=f"decode in {splits} splits vs the prefill tile")
