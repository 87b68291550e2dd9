"""QuantConfig: what quantization an engine was built with. Frozen, versioned, in config.json.

The scheme (bits, grouping, zero point, algorithm that picks the scales) is kept apart
from the storage layout (packing.py) and from the kernel that reads it (chosen at lowering).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bessemer.errors import InvalidOptionError

QUANT_CONFIG_VERSION = 1
# mode -> (weight bits, algorithm); names as TensorRT-LLM users know them
MODES = {
    "w8a16": (8, "rtn"),
    "w4a16": (4, "rtn"),
}
PLANNED_MODES = ("w4a16-awq", "w4a16-gptq", "w8a8-sq", "fp8")
# Embeddings are a gather (no GEMM to speed up) and lm_head decides every token: both stay
# in the build dtype unless the user removes them from the exclusions.
DEFAULT_EXCLUDE = ("model.embed_tokens", "lm_head")
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantConfig:
    mode: str
    group_size: int = 128  # int4 only; see primitives.effective_group_size for K it doesn't divide
    zero_point: bool = False  # int4 only: asymmetric codes
    exclude_modules: tuple[str, ...] = DEFAULT_EXCLUDE  # fnmatch patterns on HF module paths
    version: int = QUANT_CONFIG_VERSION

    def __post_init__(self):
        if self.mode not in MODES:
            planned = f" ({self.mode} is planned, not built yet)" if self.mode in PLANNED_MODES else ""
            raise InvalidOptionError(f"--quant {self.mode!r} is not supported{planned}; use one of {', '.join(MODES)}")
        if self.bits == 4 and self.group_size not in GROUP_SIZES:
            raise InvalidOptionError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, got {self.group_size}")
        if self.bits == 8 and self.zero_point:
            raise InvalidOptionError("--zero-point applies to 4-bit modes only; w8a16 is symmetric per channel")

    @property
    def bits(self) -> int:
        return MODES[self.mode][0]

    @property
    def algorithm(self) -> str:
        return MODES[self.mode][1]

    def to_json(self) -> dict:
        d = asdict(self)
        d["exclude_modules"] = list(self.exclude_modules)
        d.update(bits=self.bits, algorithm=self.algorithm, scale_dtype="float32",
                 granularity="per_channel" if self.bits == 8 else "per_group")
        if self.bits == 8:
            d.pop("group_size")
        return d
