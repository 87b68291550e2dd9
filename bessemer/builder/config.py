"""BuildConfig: how an engine is built. Frozen, validated, serialized into the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bessemer.errors import InvalidOptionError
from bessemer.quantization.config import QuantConfig
from bessemer.targets import target_names

DTYPES = ("float32", "bfloat16")
# KV cache element types: the float ones, or one-byte codes with dynamic per-(token, head)
# scales (quantization/kv_cache.py).
KV_CACHE_DTYPES = DTYPES + ("int8", "fp8")


@dataclass(frozen=True)
class BuildConfig:
    dtype: str = "float32"  # storage of weights (and the KV cache unless kv_cache_dtype says)
    max_seq_len: int | None = None  # None: min(model's max_position_embeddings, 4096)
    max_batch_size: int = 16
    max_num_tokens: int = 2048  # rows in one step (prefill chunks are cut to this)
    kv_block_size: int = 16
    kv_cache_dtype: str | None = None  # None: dtype; or one of KV_CACHE_DTYPES
    target: str = "cpu"
    tp_size: int = 1
    tp_rank: int = 0  # the rank a per-rank pass builds for; set by build_engine, not serialized
    fuse: bool = True  # run the fusion passes (off only to debug a fusion)
    quant: QuantConfig | None = None  # serialized on its own, as config.json "quant"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise InvalidOptionError(f"--dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        if self.kv_cache_dtype is not None and self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InvalidOptionError(f"--kv-cache-dtype {self.kv_cache_dtype!r} is not supported; use one of "
                                     f"{', '.join(KV_CACHE_DTYPES)}")
        if self.target not in target_names():
            raise InvalidOptionError(f"--target {self.target!r} is not available; use one of {', '.join(target_names())}")
        for name in ("max_batch_size", "max_num_tokens", "kv_block_size", "tp_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise InvalidOptionError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.max_seq_len is not None and (not isinstance(self.max_seq_len, int) or self.max_seq_len <= 0):
            raise InvalidOptionError(f"--max-seq-len must be a positive integer, got {self.max_seq_len!r}")
        if self.kv_block_size & (self.kv_block_size - 1) or self.kv_block_size > 1024:
            raise InvalidOptionError(f"--kv-block-size must be a power of two up to 1024, got {self.kv_block_size}")
        if not isinstance(self.tp_rank, int) or not 0 <= self.tp_rank < self.tp_size:
            raise InvalidOptionError(f"tp_rank must be in [0, {self.tp_size}), got {self.tp_rank!r}")

    @property
    def resolved_kv_dtype(self) -> str:
        return self.kv_cache_dtype or self.dtype

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("quant")
        d.pop("tp_rank")  # config.json describes every rank; each rank file's header names its rank
        return d

