"""QuantConfig: what quantization an engine was built with. Frozen, versioned, in config.json.

The scheme (bits, grouping, zero point, algorithm that picks the scales) is kept apart
from the storage layout (packing.py) and from the kernel that reads it (chosen at lowering).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bessemer.errors import InvalidOptionError

QUANT_CONFIG_VERSION = 2  # 2: lm_head field (int8 lm_head / tied table by default)
# mode -> (weight bits, algorithm); names as TensorRT-LLM users know them
MODES = {
    "w8a16": (8, "rtn"),
    "w4a16": (4, "rtn"),
    "w4a16-awq": (4, "awq"),
    "w4a16-gptq": (4, "gptq"),
}
CALIBRATED = ("awq", "gptq")
PLANNED_MODES = ("w8a8-sq", "fp8")
# An untied embedding table is a gather of one row per token (nothing to speed up): it
# stays in the build dtype unless the user removes it from the exclusions.
DEFAULT_EXCLUDE = ("model.embed_tokens",)
# lm_head (the linear producing the logits) has its own scheme, whatever the mode: "int8"
# (per output channel, the default) or "none" (build dtype). On small models it is most of
# the bytes read per token (SmolLM2-135M: 49152 x 576, 113 MiB in fp32 = 66% of a w4a16
# engine), and like llama.cpp (Q6_K/Q8_0 output tensor under Q4_0 bodies) it gets 8 bits
# even in 4-bit modes, since it decides every token. A table tied to the embedding is stored
# once, quantized; the embedding then gathers and dequantizes its rows (embedding_w8a16).
LM_HEAD_SCHEMES = ("int8", "none")
GROUP_SIZES = (32, 64, 128)


@dataclass(frozen=True)
class QuantConfig:
    mode: str
    group_size: int = 128  # int4 only; see primitives.effective_group_size for K it doesn't divide
    zero_point: bool = False  # int4 only: asymmetric codes
    exclude_modules: tuple[str, ...] = DEFAULT_EXCLUDE  # fnmatch patterns on HF module paths
    lm_head: str = "int8"  # LM_HEAD_SCHEMES; an exclusion matching "lm_head" wins
    act_order: bool = False  # GPTQ: quantize columns by decreasing Hessian diagonal
    calib_data: str | None = None  # plain-text file (AWQ and GPTQ)
    calib_samples: int = 64
    calib_seq_len: int = 512
    version: int = QUANT_CONFIG_VERSION

    def __post_init__(self):
        if self.mode not in MODES:
            planned = f" ({self.mode} is planned, not built yet)" if self.mode in PLANNED_MODES else ""
            raise InvalidOptionError(f"--quant {self.mode!r} is not supported{planned}; use one of {', '.join(MODES)}")
        if self.bits == 4 and self.group_size not in GROUP_SIZES:
            raise InvalidOptionError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, got {self.group_size}")
        if self.bits == 8 and self.zero_point:
            raise InvalidOptionError("--zero-point applies to 4-bit modes only; w8a16 is symmetric per channel")
        if self.algorithm in CALIBRATED and not self.calib_data:
            raise InvalidOptionError(f"--quant {self.mode} needs calibration text: pass --calib-data FILE")
        if self.act_order and self.algorithm != "gptq":
            raise InvalidOptionError("--act-order applies to w4a16-gptq only")
        if self.lm_head not in LM_HEAD_SCHEMES:
            raise InvalidOptionError(f"--lm-head must be one of {', '.join(LM_HEAD_SCHEMES)}, got {self.lm_head!r}")
        if self.calib_samples <= 0 or self.calib_seq_len < 2:
            raise InvalidOptionError("--calib-samples must be positive and --calib-seq-len at least 2")

    @property
    def bits(self) -> int:
        return MODES[self.mode][0]

    @property
    def algorithm(self) -> str:
        return MODES[self.mode][1]

    @property
    def needs_calibration(self) -> bool:
        return self.algorithm in CALIBRATED

    def to_json(self) -> dict:
        d = asdict(self)
        d["exclude_modules"] = list(self.exclude_modules)
        d.update(bits=self.bits, algorithm=self.algorithm, scale_dtype="float32",
                 granularity="per_channel" if self.bits == 8 else "per_group")
        if self.bits == 8:
            d.pop("group_size")
        if self.algorithm not in CALIBRATED:
            for key in ("calib_data", "calib_samples", "calib_seq_len", "act_order"):
                d.pop(key)
        else:  # the file's name, not where it lay on the build machine
            d["calib_data"] = self.calib_data.replace("\\", "/").rsplit("/", 1)[-1]
        return d
