"""QuantConfig: what quantization an engine was built with. Frozen, versioned, in config.json.

The scheme (bits, grouping, zero point, algorithm that picks the scales) is kept apart
from the storage layout (format/layouts.py) and from the kernel that reads it (chosen at lowering).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from bessemer.errors import InvalidOptionError

QUANT_CONFIG_VERSION = 7  # 2: lm_head field (int8 lm_head / tied table by default); 3: fp8_rounding;
# 4: int4 group scales and offsets are bf16 values, stored as bf16; 5: symmetric int4 stores
# no offsets (w = scale * (code - 8), all 16 levels) and its scales are searched
# (quantization/scale_search.py); 6: lm_head "int4", bits_per_weight and the precision plan;
# 7: embedding (an untied table quantized)
# mode -> (weight bits, algorithm); names as TensorRT-LLM users know them
MODES = {
    "w8a16": (8, "rtn"),
    "w4a16": (4, "rtn"),
    "w4a16-awq": (4, "awq"),
    "w4a16-gptq": (4, "gptq"),
    # int8 activations too (per token, quantized inside the kernel), SmoothQuant factors
    "w8a8-sq": (8, "smoothquant"),
    # w4a16's symmetric 4-bit codes and searched scales, read with int8 activations
    # (dynamic, per row and per group of --group-size columns, quantized inside the
    # kernel) and int8 dot products, as llama.cpp's Q4_0 x Q8_0: faster prefill
    "w4a8": (4, "rtn"),
    # E4M3 weights (per-channel scales) and E4M3 activations with a static per-tensor
    # scale per linear input, from the calibrated max |x| ("max" calibration)
    "fp8": (8, "max"),
    # two-level 4-bit (k-quant class, as llama.cpp's Q4_K): an 8-bit scale and minimum per
    # 32 columns under an fp16 scale and minimum per super-block of up to 256 (4.625-4.67
    # bits per weight; quantization/superblock.py); codes by round to nearest or GPTQ
    "w4k": (4, "rtn"),
    "w4k-gptq": (4, "gptq"),
}
TWO_LEVEL_MODES = ("w4k", "w4k-gptq")
CALIBRATED = ("awq", "gptq", "smoothquant", "max")
# weight storage dtype of each mode's codes (format/dtypes.py names)
WEIGHT_DTYPES = {"fp8": "float8_e4m3"}
PLANNED_MODES: tuple[str, ...] = ()
# Where activation statistics come from: our torch hooks, or nvidia-modelopt's INT8
# SmoothQuant calibration ("auto": modelopt when it is installed, else native).
CALIB_BACKENDS = ("auto", "native", "modelopt")
# o_proj reads the attention output, which has no per-channel producer to fold 1/s into:
# "kernel" stores 1/s and linear_w8a8 multiplies the activations by it before quantizing
# them; "none" leaves o_proj unsmoothed. Measured on SmolLM2 (WikiText-2, 8192 tokens,
# context 1024, alpha 0.5): none 16.4069 vs kernel 16.4194 (fp32 16.2438): the attention
# output has no strong outlier channels, so none, which also skips a multiply, is the default.
O_PROJ_SMOOTHING = ("none", "kernel")
# Exclusions name linears; an untied embedding table is a gather of one row per token (nothing
# to speed up), stored as --embedding says (EMBEDDING_SCHEMES).
DEFAULT_EXCLUDE = ("model.embed_tokens",)
# An untied embedding table: "none" (build dtype, the default) or int8 per row / symmetric int4
# groups of 32 (lm_head's int4), gathered and dequantized row by row (embedding_w8a16 /
# embedding_w4a16), as llama.cpp stores token_embd in its quantized files. What it saves is
# size, not speed: Llama-3-8B's untied table is 1 GiB of a 4.3 GiB w4a16 g32 engine in bf16,
# 0.28 GiB in int4. A table tied to lm_head is one tensor and follows --lm-head.
EMBEDDING_SCHEMES = ("none", "int8", "int4")
# lm_head (the linear producing the logits) has its own scheme, whatever the mode: "int8"
# (per output channel, the default) or "none" (build dtype). On small models it is most of
# the bytes read per token (SmolLM2-135M: 49152 x 576, 113 MiB in fp32 = 66% of a w4a16
# engine), and like llama.cpp (Q6_K/Q8_0 output tensor under Q4_0 bodies) it gets 8 bits
# even in 4-bit modes, since it decides every token. A table tied to the embedding is stored
# once, quantized; the embedding then gathers and dequantizes its rows (embedding_w8a16).
# "int4": symmetric groups of 32 with searched scales (4.5 bits per weight), the table
# gathered by embedding_w4a16: what a budget under ~5 bits per weight needs on a small
# model, whose tied table is a fifth of its weights (see quantization/mixed_precision.py).
LM_HEAD_SCHEMES = ("int8", "int4", "none")
# Stored schemes a precision plan may give a linear (quantization/mixed_precision.py), by name.
# int4-k: the two-level format of --quant w4k (only for K a multiple of 32).
PRECISION_SCHEMES = ("int4-g64", "int4-g32", "int4-g32-asym", "int4-k", "int8")
GROUP_SIZES = (32, 64, 128)
# How fp8 picks each weight's E4M3 code on its per-channel grid: "nearest" (round to nearest)
# or "gptq" (GPTQ error compensation against the calibration Hessians, same grid, layout and
# kernel). gptq is the default: SmolLM2, WikiText-2 8192 tokens, context 1024, fp32 16.2438:
# nearest 16.8229 (+3.57%), gptq 16.4797 (+1.45%); it costs the Hessians and ~20 s of build.
FP8_ROUNDINGS = ("nearest", "gptq")
# fp8 activation scales: "dynamic" (per token, max|x| / 448 of each row, in the kernel:
# linear_fp8@2) or "static" (one per linear input, the calibrated max|x| / 448: linear_fp8@1).
FP8_ACTIVATIONS = ("dynamic", "static")
FP8_ACTIVATIONS_DEFAULT = "dynamic"
FP8_ACT_GROUPS = (16, 32, 64, 128)


@dataclass(frozen=True)
class QuantConfig:
    mode: str
    group_size: int = 128  # int4 only; see primitives.effective_group_size for K it doesn't divide
    zero_point: bool = False  # int4 only: asymmetric codes
    exclude_modules: tuple[str, ...] = DEFAULT_EXCLUDE  # fnmatch patterns on HF module paths
    lm_head: str = "int8"  # LM_HEAD_SCHEMES; an exclusion matching "lm_head" wins
    embedding: str = "none"  # EMBEDDING_SCHEMES: an untied embedding table
    # GPTQ: quantize columns by decreasing Hessian diagonal. None: on for w4a16-gptq (held-out
    # ppl, SmolLM2 g64: 23.4 with vs 27.3 without, RTN 25.1), off for fp8 (no gain measured)
    act_order: bool | None = None
    fp8_rounding: str | None = None  # fp8: FP8_ROUNDINGS; None: "gptq" (see FP8_ROUNDINGS)
    fp8_activations: str | None = None  # fp8: FP8_ACTIVATIONS; None: FP8_ACTIVATIONS_DEFAULT
    # fp8: SmoothQuant's migration before E4M3 (quantization/smoothquant.py, folded factors
    # only), s = max|x|^alpha / max|w|^(1 - alpha); None: no migration
    fp8_smoothing_alpha: float | None = None
    # fp8 dynamic: each token's scale refined by a power of two per group of this many input
    # columns (FP8_ACT_GROUPS, linear_fp8@2 attr act_group); None: one scale per token
    fp8_act_group: int | None = None
    calib_data: str | None = None  # plain-text file (AWQ and GPTQ)
    calib_samples: int = 64
    calib_seq_len: int = 512
    smoothquant_alpha: float = 0.5  # w8a8-sq: s = max|x|^alpha / max|w|^(1 - alpha)
    calib_backend: str = "auto"  # w8a8-sq; the engine records the one that ran
    o_proj_smoothing: str = "none"  # w8a8-sq
    # Mixed precision: a budget of bits per weight over all matrices (lm_head included); the
    # build measures each linear's sensitivity on the calibration text and writes the plan it
    # chose into `precision` ((node name, PRECISION_SCHEMES entry) pairs), which the quantize
    # pass follows. A given plan is followed as is (a rebuild of the same engine).
    bits_per_weight: float | None = None
    precision: tuple[tuple[str, str], ...] = ()
    version: int = QUANT_CONFIG_VERSION

    def __post_init__(self):
        if self.mode not in MODES:
            planned = f" ({self.mode} is planned, not built yet)" if self.mode in PLANNED_MODES else ""
            raise InvalidOptionError(f"--quant {self.mode!r} is not supported{planned}; use one of {', '.join(MODES)}")
        if self.bits == 4 and self.group_size not in GROUP_SIZES:
            raise InvalidOptionError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))}, got {self.group_size}")
        if self.bits == 8 and self.zero_point:
            raise InvalidOptionError(f"--zero-point applies to 4-bit modes only; {self.mode} is symmetric per channel")
        if self.two_level and self.zero_point:
            raise InvalidOptionError(f"--zero-point does not apply to --quant {self.mode} (its sub-blocks always "
                                     "store a minimum); drop --zero-point")
        if self.mode == "w4a8" and self.zero_point:
            raise InvalidOptionError("--zero-point does not apply to --quant w4a8 (its int8 kernel reads symmetric "
                                     "codes); drop --zero-point or use --quant w4a16")
        if self.fp8_activations is None and self.mode == "fp8":
            object.__setattr__(self, "fp8_activations", FP8_ACTIVATIONS_DEFAULT)
        if self.fp8_activations is not None and self.mode != "fp8":
            raise InvalidOptionError("--fp8-activations applies to --quant fp8 only")
        if self.mode == "fp8" and self.fp8_activations not in FP8_ACTIVATIONS:
            raise InvalidOptionError(f"--fp8-activations must be one of {', '.join(FP8_ACTIVATIONS)}, "
                                     f"got {self.fp8_activations!r}")
        if self.fp8_rounding is None:
            object.__setattr__(self, "fp8_rounding", "gptq" if self.mode == "fp8" else "nearest")
        if self.needs_calibration and not self.calib_data:
            what = " (static activation scales or GPTQ rounding)" if self.mode == "fp8" else ""
            raise InvalidOptionError(f"--quant {self.mode}{what} needs calibration text: pass --calib-data FILE")
        if self.act_order is None:
            object.__setattr__(self, "act_order", self.mode in ("w4a16-gptq", "w4k-gptq"))
        if self.fp8_rounding not in FP8_ROUNDINGS:
            raise InvalidOptionError(f"--fp8-rounding must be one of {', '.join(FP8_ROUNDINGS)}, "
                                     f"got {self.fp8_rounding!r}")
        if self.fp8_smoothing_alpha is not None:
            if self.mode != "fp8":
                raise InvalidOptionError("--fp8-smoothing-alpha applies to --quant fp8 only; "
                                         "w8a8-sq takes --smoothquant-alpha")
            if not 0.0 <= self.fp8_smoothing_alpha <= 1.0:
                raise InvalidOptionError(f"--fp8-smoothing-alpha must be in [0, 1], got {self.fp8_smoothing_alpha}")
        if self.fp8_act_group is not None:
            if self.mode != "fp8" or self.fp8_activations != "dynamic":
                raise InvalidOptionError("--fp8-act-group applies to --quant fp8 with dynamic activations only")
            if self.fp8_act_group not in FP8_ACT_GROUPS:
                raise InvalidOptionError(f"--fp8-act-group must be one of {', '.join(map(str, FP8_ACT_GROUPS))}, "
                                         f"got {self.fp8_act_group}")
        if self.fp8_rounding != "nearest" and self.mode != "fp8":
            raise InvalidOptionError("--fp8-rounding applies to --quant fp8 only")
        if self.act_order and not self.uses_gptq:
            raise InvalidOptionError("--act-order applies to w4a16-gptq, w4k-gptq and fp8 with --fp8-rounding gptq only")
        if self.algorithm != "smoothquant":
            if self.smoothquant_alpha != 0.5 or self.calib_backend != "auto" or self.o_proj_smoothing != "none":
                raise InvalidOptionError("--smoothquant-alpha, --calib-backend and --smoothquant-o-proj apply "
                                         "to --quant w8a8-sq only")
        if not 0.0 <= self.smoothquant_alpha <= 1.0:
            raise InvalidOptionError(f"--smoothquant-alpha must be in [0, 1], got {self.smoothquant_alpha}")
        if self.calib_backend not in CALIB_BACKENDS:
            raise InvalidOptionError(f"--calib-backend must be one of {', '.join(CALIB_BACKENDS)}, "
                                     f"got {self.calib_backend!r}")
        if self.o_proj_smoothing not in O_PROJ_SMOOTHING:
            raise InvalidOptionError(f"--smoothquant-o-proj must be one of {', '.join(O_PROJ_SMOOTHING)}, "
                                     f"got {self.o_proj_smoothing!r}")
        if self.lm_head not in LM_HEAD_SCHEMES:
            raise InvalidOptionError(f"--lm-head must be one of {', '.join(LM_HEAD_SCHEMES)}, got {self.lm_head!r}")
        if self.embedding not in EMBEDDING_SCHEMES:
            raise InvalidOptionError(f"--embedding must be one of {', '.join(EMBEDDING_SCHEMES)}, got {self.embedding!r}")
        if self.bits_per_weight is not None or self.precision:
            if self.mode not in ("w4a16", "w4a16-gptq", *TWO_LEVEL_MODES):
                raise InvalidOptionError(f"--bits-per-weight applies to --quant w4a16, w4a16-gptq, w4k and w4k-gptq, "
                                         f"not {self.mode}")
            if self.bits_per_weight is not None and not 4.25 <= self.bits_per_weight <= 8.0:
                raise InvalidOptionError(f"--bits-per-weight must be between 4.25 (every matrix in 4 bits, groups "
                                         f"of 64) and 8.0, got {self.bits_per_weight}")
            if self.lm_head == "none":
                raise InvalidOptionError("--bits-per-weight counts lm_head in the budget and chooses its scheme; "
                                         "drop --lm-head none")
            if not self.calib_data:
                raise InvalidOptionError("--bits-per-weight measures each linear's sensitivity on calibration "
                                         "text: pass --calib-data FILE")
            bad = [s for _, s in self.precision if s not in PRECISION_SCHEMES]
            if bad:
                raise InvalidOptionError(f"precision plan scheme {bad[0]!r} is not one of {', '.join(PRECISION_SCHEMES)}")
        if self.calib_samples <= 0 or self.calib_seq_len < 2:
            raise InvalidOptionError("--calib-samples must be positive and --calib-seq-len at least 2")

    @property
    def bits(self) -> int:
        return MODES[self.mode][0]

    @property
    def algorithm(self) -> str:
        return MODES[self.mode][1]

    @property
    def two_level(self) -> bool:
        """Stored as Int4SuperBlock (scales per sub-block under a super-block's)."""
        return self.mode in TWO_LEVEL_MODES

    @property
    def uses_gptq(self) -> bool:
        """Codes chosen by GPTQ: the calibration collects input Hessians."""
        return self.algorithm == "gptq" or (self.mode == "fp8" and self.fp8_rounding == "gptq")

    @property
    def act_bits(self) -> int:
        """16: activations stay floating point; 8: int8, dynamic (w8a8-sq: per token; w4a8:
        per token and group of group_size columns)."""
        return 8 if self.algorithm == "smoothquant" or self.mode == "w4a8" else 16

    @property
    def weight_dtype(self) -> str:
        return WEIGHT_DTYPES.get(self.mode, f"int{self.bits}")

    @property
    def needs_calibration(self) -> bool:
        """fp8 with dynamic activation scales and round-to-nearest codes has nothing to calibrate."""
        if self.mode == "fp8":
            return (self.fp8_activations == "static" or self.fp8_rounding == "gptq"
                    or self.fp8_smoothing_alpha is not None)
        return self.algorithm in CALIBRATED or self.bits_per_weight is not None

    def to_json(self) -> dict:
        d = asdict(self)
        d["exclude_modules"] = list(self.exclude_modules)
        d["precision"] = dict(self.precision)
        if self.bits_per_weight is None and not self.precision:
            d.pop("bits_per_weight")
            d.pop("precision")
        d.update(bits=self.bits, algorithm=self.algorithm, scale_dtype="bfloat16" if self.bits == 4 else "float32",
                 granularity="per_channel" if self.bits == 8 else "per_group")
        d["weight_dtype"] = self.weight_dtype
        if self.mode == "fp8" and self.fp8_activations == "static":  # one per linear input, in the rank file
            d.update(activation_dtype="float8_e4m3", activation_granularity="per_tensor",
                     activation_scales="static: calibrated max|x| / 448 (tensor <weight>.input_scale)",
                     weight_scale="amax / 448 per output channel", e4m3="OCP E4M3FN, saturating")
        elif self.mode == "fp8" and self.fp8_act_group:
            d.update(activation_dtype="float8_e4m3", activation_granularity=f"per_token_pow2_group{self.fp8_act_group}",
                     activation_scales=f"dynamic: max|x| / 448 of each token times 2^-e per {self.fp8_act_group} "
                                       "columns (e: the group's headroom below the token's max), in the kernel",
                     weight_scale="amax / 448 per output channel", e4m3="OCP E4M3FN, saturating")
        elif self.mode == "fp8":
            d.update(activation_dtype="float8_e4m3", activation_granularity="per_token",
                     activation_scales="dynamic: max|x| / 448 of each token, in the kernel",
                     weight_scale="amax / 448 per output channel", e4m3="OCP E4M3FN, saturating")
        if self.two_level:
            d.pop("group_size")
            d.update(granularity="two_level", scale_dtype="uint8 under float16",
                     group_params="per 32 columns uint8 sc, m; per super-block (<= 256) fp16 d, dmin: "
                                  "w = d * sc * code - dmin * m")
        elif self.bits == 4:
            d["group_params"] = ("scale, offset per group: w = scale * code + offset" if self.zero_point else
                                 "scale per group (searched, no offset stored): w = scale * (code - 8)")
        if self.bits == 8:
            d.pop("group_size")
        if self.mode != "fp8":
            d.pop("fp8_rounding")
            d.pop("fp8_activations")
        for key in ("fp8_smoothing_alpha", "fp8_act_group"):  # engines built without them keep their config.json
            if d[key] is None:
                d.pop(key)
        if self.act_bits == 8:
            d.update(act_bits=8, act_granularity="per_token_dynamic" if self.bits == 8 else "per_token_group_dynamic",
                     act_symmetric=True)
        if self.algorithm != "smoothquant":
            for key in ("smoothquant_alpha", "calib_backend", "o_proj_smoothing"):
                d.pop(key)
        if not self.needs_calibration:
            for key in ("calib_data", "calib_samples", "calib_seq_len", "act_order"):
                d.pop(key)
        else:  # the file's name, not where it lay on the build machine
            d["calib_data"] = self.calib_data.replace("\\", "/").rsplit("/", 1)[-1]
        return d
