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
    decode = step_inputs.decode_seqs(cu)
    partials = torch.full((len(decode) * kv_heads * splits * group * (head_dim + 2),), float("nan"))
    attention.attention_decode_kernel[(len(decode), kv_heads, splits)](
        q, k_cache, v_cache, k_scales, v_scales, i32(tables), i32(cu), i32(contexts), i32(decode), partials, scale,
        NUM_SPLITS=splits, BLOCK_G=max(16, 1 << (group - 1).bit_length()), **common)
    attention.attention_decode_reduce_kernel[(len(decode), heads)](
        partials, i32(cu), i32(decode), out, sinks_t, NUM_HEADS=heads, NUM_KV_HEADS=kv_heads, HEAD_DIM=head_dim,
        OUT_STRIDE=heads * head_dim, NUM_SPLITS=splits, BLOCK_SPLITS=1 << (splits - 1).bit_length(), BLOCK_D=block_d,
        HAS_SINKS=sinks)

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
