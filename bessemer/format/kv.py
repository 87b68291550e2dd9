"""The KV cache as an engine describes it (the plan's "kv_cache" section) and its size.

    {"num_layers": L, "num_kv_heads": Hkv, "head_dim": D, "dtype": <a KV dtype below>,
     "scales": "dynamic_per_token_head_float32"}   (scales: only for one-byte codes)

Per layer the cache is K and V, each [num_blocks, block_size, Hkv, D] elements of `dtype`;
one-byte codes carry one float32 scale per (token, KV head) beside them, set when attention
writes the row (quantization/kv_cache.py is the reference). Every executor allocates
exactly kv_bytes_per_token() per token slot; the runtime sizes its cache with the same rule.
A sequence of n tokens holds blocks_needed(n, block_size) blocks of its block table.
"""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.format.dtypes import DTYPE_BITS


@dataclass(frozen=True)
class KvDType:
    dtype: str  # format/dtypes.py name
    scale_bytes: int  # bytes of scale per (token, KV head); 0 = none
    scales: str = ""  # the plan's "scales" value when scale_bytes > 0


SCALES_DYNAMIC = "dynamic_per_token_head_float32"
KV_DTYPES: tuple[KvDType, ...] = (
    KvDType("float32", 0),
    KvDType("bfloat16", 0),
    KvDType("float16", 0),  # the cuda target's fp16 engines
    KvDType("int8", 4, SCALES_DYNAMIC),
    KvDType("float8_e4m3", 4, SCALES_DYNAMIC),
)
_BY_NAME = {k.dtype: k for k in KV_DTYPES}
# --kv-cache-dtype spellings that are not contract names
KV_FLAG_DTYPES = {"fp8": "float8_e4m3"}


def kv_dtype(dtype: str) -> KvDType:
    try:
        return _BY_NAME[KV_FLAG_DTYPES.get(dtype, dtype)]
    except KeyError:
        raise ValueError(f"KV cache dtype {dtype!r} is not one of {', '.join(_BY_NAME)}") from None


def kv_cache_section(num_layers: int, num_kv_heads: int, head_dim: int, flag_dtype: str) -> dict:
    """The plan's kv_cache section for a --kv-cache-dtype value (float32, bfloat16, int8, fp8)."""
    k = kv_dtype(flag_dtype)
    section = dict(num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=k.dtype)
    if k.scale_bytes:
        section["scales"] = k.scales
    return section


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: str) -> int:
    """Cache bytes one token takes (K and V of every layer), scales included."""
    k = kv_dtype(dtype)
    return 2 * num_layers * num_kv_heads * (head_dim * DTYPE_BITS[k.dtype] // 8 + k.scale_bytes)


def section_bytes_per_token(section: dict) -> int:
    return kv_bytes_per_token(section["num_layers"], section["num_kv_heads"], section["head_dim"],
                              section["dtype"])


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` tokens (the last one possibly part full)."""
    return -(-num_tokens // block_size)
