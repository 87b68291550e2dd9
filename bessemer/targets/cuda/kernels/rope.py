"""RoPE fused with the paged KV-cache write: one program per token rotates its query heads
in place and writes its rotated keys and its values into the cache slot of its position.

Every RoPE variant of the cpu target (default, linear, llama3, partial rotary) differs only
in inv_freq and an attention scaling factor, both inputs here. Rotate-half (GPT-NeoX /
Llama) style on the first ROTARY_DIM dims of each head; the angle is fp32
positions[t] * inv_freq[i], as the cpu kernel and ops.ref_rope compute it.
"""

import triton
import triton.language as tl


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
def rope_kv_write_kernel(q_ptr, k_ptr, v_ptr, positions_ptr, slot_mapping_ptr, inv_freq_ptr,
                         k_cache_ptr, v_cache_ptr, attention_scaling,
                         NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
                         HEAD_DIM: tl.constexpr, ROTARY_DIM: tl.constexpr,
                         Q_STRIDE: tl.constexpr, K_STRIDE: tl.constexpr, V_STRIDE: tl.constexpr,
                         BLOCK_HEADS: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr,
                         BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr):
    """q: (T, NUM_HEADS * HEAD_DIM) rotated in place; k, v: (T, NUM_KV_HEADS * HEAD_DIM)
    read; the caches receive rotated k and v at slot_mapping[t]. Grid: (T,)."""
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
    k_dst = k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM)
    k_row = k_ptr + t * K_STRIDE
    _rotate_heads(k_row, k_dst, HEAD_DIM, HEAD_DIM, cos, sin, NUM_KV_HEADS, HALF, BLOCK_KV_HEADS, BLOCK_HALF)
    if ROTARY_DIM < HEAD_DIM:
        _copy_heads(k_row, k_dst, HEAD_DIM, HEAD_DIM, NUM_KV_HEADS, ROTARY_DIM, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
    _copy_heads(v_ptr + t * V_STRIDE, v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)


@triton.jit
def kv_write_kernel(k_ptr, v_ptr, slot_mapping_ptr, k_cache_ptr, v_cache_ptr,
                    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, K_STRIDE: tl.constexpr,
                    V_STRIDE: tl.constexpr, BLOCK_KV_HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    """The KV-cache write of a layer without RoPE (SmolLM3's NoPE layers): k and v of token t
    to the cache slot slot_mapping[t], unrotated. Grid: (T,)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    _copy_heads(k_ptr + t * K_STRIDE, k_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
    _copy_heads(v_ptr + t * V_STRIDE, v_cache_ptr + slot * (NUM_KV_HEADS * HEAD_DIM), HEAD_DIM, HEAD_DIM,
                NUM_KV_HEADS, 0, HEAD_DIM, BLOCK_KV_HEADS, BLOCK_D)
