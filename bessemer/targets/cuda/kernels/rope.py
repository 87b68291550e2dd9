"""RoPE fused with the paged KV-cache write: one program per token rotates its query heads
in place and writes its rotated keys and its values into the cache slot of its position.

Every RoPE variant of the cpu target (default, linear, llama3, partial rotary) differs only
in inv_freq and an attention scaling factor, both inputs here. Rotate-half (GPT-NeoX /
Llama) style on the first ROTARY_DIM dims of each head; the angle is fp32
positions[t] * inv_freq[i], as the cpu kernel and ops.ref_rope compute it.

What matches NumPy bit for bit, on the GPU as under the interpreter: the angle (one fp32
product), V's codes and scales, and the codes and scales of a given rotated K (both kernels
are compiled without FMA fusion and divide with div_rn: kernels/__init__.py). What does
not: cos and sin are libdevice's cosf/sinf on the GPU (a few fp32 ulp from NumPy's), so the
rotated q and k, and through them K's scale and at most one step of a K code near a code
boundary, agree with the reference to a stated tolerance (test_kernels_rows.py).
"""

import triton
import triton.language as tl

# y + 1.5 * 2^23 - 1.5 * 2^23 rounds y to the nearest integer, ties to even (|y| < 2^22), in
# fp32 on the GPU and in NumPy alike: np.rint, what quantization/kv_cache.py does. Only
# unfused: an FMA would add the magic number to the unrounded product x * inv.
RINT_MAGIC = tl.constexpr(12582912.0)


@triton.jit
def _rotate_heads(src_ptr, dst_ptr, src_head_stride, dst_head_stride, cos, sin,
                  NUM: tl.constexpr, HALF: tl.constexpr, BLOCK_HEADS: tl.constexpr,
                  BLOCK_HALF: tl.constexpr):
    """dst[h, i], dst[h, i + HALF] = rotated src[h, i], src[h, i + HALF] for h < NUM."""
    h = tl.arange(0, BLOCK_HEADS)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < NUM) & (i < HALF)
    src = src_ptr + h * src_head_stride + i
    a = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + h * dst_head_stride + i
    tl.store(dst, (a * cos - b * sin).to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (b * cos + a * sin).to(dst_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _copy_heads(src_ptr, dst_ptr, src_head_stride, dst_head_stride,
                NUM: tl.constexpr, START: tl.constexpr, STOP: tl.constexpr,
                BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    """dst[h, START:STOP] = src[h, START:STOP] for h < NUM."""
    h = tl.arange(0, BLOCK_HEADS)[:, None]
    d = START + tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM) & (d < STOP)
    x = tl.load(src_ptr + h * src_head_stride + d, mask=mask)
    tl.store(dst_ptr + h * dst_head_stride + d, x, mask=mask)


@triton.jit
def _write_codes(x, cache_ptr, scales_ptr, slot, NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                 KV_BLOCK_SIZE: tl.constexpr, KV_CODES: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr,
                 BLOCK_D: tl.constexpr):
    """One token's K or V rows x: (BLOCK_KV_HEADS, BLOCK_D) fp32, zero past the heads and
    HEAD_DIM, into a one-byte cache at `slot`: per (token, head) scale amax / CODE_MAX and
    codes of x * (CODE_MAX / amax), as quantization/kv_cache.py (int8: KV_CODES 1, E4M3: 2),
    bit for bit: IEEE quotients, the product rounded before the rounding add (a caller is
    in UNFUSED_KERNELS). The layout: kernels/__init__.py."""
    CODE_MAX: tl.constexpr = 448.0 if KV_CODES == 2 else 127.0
    BLOCK_BYTES: tl.constexpr = KV_BLOCK_SIZE * NUM_KV_HEADS * (HEAD_DIM + 4)
    CODE_BYTES: tl.constexpr = KV_BLOCK_SIZE * NUM_KV_HEADS * HEAD_DIM
    h = tl.arange(0, BLOCK_KV_HEADS)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    amax = tl.max(tl.abs(x), axis=1)[:, None]  # (BLOCK_KV_HEADS, 1)
    # div_rn: an IEEE quotient, as NumPy's (fp32 `/` compiles to the approximate div.full.f32)
    inv = tl.where(amax > 0.0, tl.math.div_rn(tl.full(amax.shape, CODE_MAX, tl.float32),
                                              tl.where(amax > 0.0, amax, 1.0)), 0.0)
    y = x * inv  # (BLOCK_KV_HEADS, BLOCK_D); rounded before the add below: the kernels are compiled unfused
    if KV_CODES == 2:
        codes = y.to(tl.float8e4nv)
    else:
        codes = tl.minimum(tl.maximum((y + RINT_MAGIC) - RINT_MAGIC, -127.0), 127.0).to(tl.int8)
    block = slot // KV_BLOCK_SIZE
    row = (slot % KV_BLOCK_SIZE) * NUM_KV_HEADS + h  # (BLOCK_KV_HEADS, 1)
    tl.store(cache_ptr + block * BLOCK_BYTES + row * HEAD_DIM + d, codes, mask=(h < NUM_KV_HEADS) & (d < HEAD_DIM))
    scale = tl.math.div_rn(amax, tl.full(amax.shape, CODE_MAX, tl.float32))
    tl.store(scales_ptr + block * (BLOCK_BYTES // 4) + CODE_BYTES // 4 + row, scale, mask=h < NUM_KV_HEADS)


@triton.jit
def _head_rows(src_ptr, NUM: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    """src[h, d] for the NUM heads of one token, fp32, zero elsewhere: (BLOCK_HEADS, BLOCK_D)."""
    h = tl.arange(0, BLOCK_HEADS)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    return tl.load(src_ptr + h * HEAD_DIM + d, mask=(h < NUM) & (d < HEAD_DIM), other=0.0).to(tl.float32)


@triton.jit
def _rotated_head_rows(src_ptr, position, inv_freq_ptr, attention_scaling, NUM: tl.constexpr, HEAD_DIM: tl.constexpr,
                       ROTARY_DIM: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    """_head_rows with RoPE applied (the same arithmetic as _rotate_heads, element by element,
    over whole heads so that a head's max |x| is at hand for its cache scale)."""
    HALF: tl.constexpr = ROTARY_DIM // 2
    h = tl.arange(0, BLOCK_HEADS)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    rotary = d < ROTARY_DIM
    first = d < HALF
    x = _head_rows(src_ptr, NUM, HEAD_DIM, BLOCK_HEADS, BLOCK_D)
    partner = tl.load(src_ptr + h * HEAD_DIM + tl.where(first, d + HALF, d - HALF), mask=(h < NUM) & rotary,
                      other=0.0).to(tl.float32)
    angle = position * tl.load(inv_freq_ptr + d % HALF, mask=rotary, other=0.0)  # (1, BLOCK_D)
    cos = tl.cos(angle) * attention_scaling
    sin = tl.sin(angle) * attention_scaling
    # first half: a cos - b sin (a = x, b = its partner); second half: b cos + a sin (b = x)
    rotated = tl.where(first, x * cos - partner * sin, x * cos + partner * sin)
    return tl.where(rotary, rotated, x)


@triton.jit
def rope_kv_write_kernel(q_ptr, k_ptr, v_ptr, positions_ptr, slot_mapping_ptr, inv_freq_ptr,
                         k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr, attention_scaling,
                         NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
                         Q_STRIDE: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr,
                         BLOCK_HEADS: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr,
                         BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr, KV_BLOCK_SIZE: tl.constexpr,
                         KV_CODES: tl.constexpr):
    """q: (T, NUM_HEADS * HEAD_DIM) rotated in place; k, v: (T, NUM_KV_HEADS * HEAD_DIM)
    read; the caches receive rotated k and v at slot_mapping[t] (as codes and scales when
    KV_CODES is 1 or 2). Grid: (T,)."""
    t = tl.program_id(0).to(tl.int64)
    HALF: tl.constexpr = ROTARY_DIM // 2
    i = tl.arange(0, BLOCK_HALF)[None, :]
    inv_freq = tl.load(inv_freq_ptr + i, mask=i < HALF, other=0.0)
    angle = tl.load(positions_ptr + t).to(tl.float32) * inv_freq  # (1, BLOCK_HALF)
    cos = tl.cos(angle) * attention_scaling
    sin = tl.sin(angle) * attention_scaling

    q_row = q_ptr + t * Q_STRIDE
    # in place: a partial rotary's tail dims of the query stay as they are
    _rotate_heads(q_row, q_row, HEAD_DIM, HEAD_DIM, cos, sin, NUM_HEADS, HALF, BLOCK_HEADS, BLOCK_HALF)

    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    k_row = k_ptr + t * K_STRIDE
    if KV_CODES != 0:
        k = _rotated_head_rows(k_row, tl.load(positions_ptr + t).to(tl.float32), inv_freq_ptr, attention_scaling,
                               NUM_KV_HEADS, HEAD_DIM, ROTARY_DIM, BLOCK_KV_HEADS, BLOCK_D)
        _write_codes(k, k_cache_ptr, k_scales_ptr, slot, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE, KV_CODES,
                     BLOCK_KV_HEADS, BLOCK_D)
        v = _head_rows(v_ptr + t * V_STRIDE, NUM_KV_HEADS, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
        _write_codes(v, v_cache_ptr, v_scales_ptr, slot, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE, KV_CODES,
                     BLOCK_KV_HEADS, BLOCK_D)
    else:
        k_dst = k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM)
        _rotate_heads(k_row, k_dst, HEAD_DIM, HEAD_DIM, cos, sin, NUM_KV_HEADS, HALF, BLOCK_KV_HEADS, BLOCK_HALF)
        if ROTARY_DIM < HEAD_DIM:
            _copy_heads(k_row, k_dst, HEAD_DIM, HEAD_DIM, NUM_KV_HEADS, ROTARY_DIM, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
        _copy_heads(v_ptr + t * V_STRIDE, v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                    NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)


@triton.jit
def kv_write_kernel(k_ptr, v_ptr, slot_mapping_ptr, k_cache_ptr, v_cache_ptr, k_scales_ptr, v_scales_ptr,
                    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, K_STRIDE: tl.constexpr,
                    V_STRIDE: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                    KV_BLOCK_SIZE: tl.constexpr, KV_CODES: tl.constexpr):
    """The KV-cache write of a layer without RoPE (SmolLM3's NoPE layers): k and v of token t
    to the cache slot slot_mapping[t], unrotated. Grid: (T,)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if KV_CODES != 0:
        _write_codes(_head_rows(k_ptr + t * K_STRIDE, NUM_KV_HEADS, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D), k_cache_ptr,
                     k_scales_ptr, slot, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE, KV_CODES, BLOCK_KV_HEADS, BLOCK_D)
        _write_codes(_head_rows(v_ptr + t * V_STRIDE, NUM_KV_HEADS, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D), v_cache_ptr,
                     v_scales_ptr, slot, NUM_KV_HEADS, HEAD_DIM, KV_BLOCK_SIZE, KV_CODES, BLOCK_KV_HEADS, BLOCK_D)
    else:
        _copy_heads(k_ptr + t * K_STRIDE, k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                    NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
        _copy_heads(v_ptr + t * V_STRIDE, v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                    NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
