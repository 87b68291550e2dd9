"""The cpu target's kernels as data: the graph ops it runs (KERNELS) and, for every stored
quantization format it reads, the kernel that reads it (QUANT_KERNELS). Read through
Target.has_kernel / Target.quant_kernel (targets/__init__.py); lowering.py asks the chosen
row for the kernel's op@version, its parts' layouts and attrs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.errors import InvalidOptionError
from bessemer.quantization.formats import (ExpertStack, Fp8E4M3, Int4Group, Int4GroupA8, Int4SuperBlock, Int8PerChannel,
                                          Mxfp4Experts, W8A8)

# plugins/ops.py ops with a C++ kernel in csrc/kernels (split: column views, no kernel;
# all_reduce / all_gather: the tensor-parallel collectives)
KERNELS = frozenset({
    "embedding", "rms_norm", "add_rms_norm", "add", "linear", "silu_mul", "gather_rows", "split", "rope",
    "attention", "rms_norm_heads", "gelu_tanh_mul", "scale", "sigmoid_gate_mul", "moe", "attention_sinks",
    "all_reduce", "all_gather",
})


@dataclass(frozen=True)
class QuantKernel:
    """The cpu kernel that reads weights of one stored format, and its parts' layouts."""

    op: str
    version: int
    layouts: dict  # part role -> layout; parts not named are row_major
    attrs: dict = field(default_factory=dict)


def _int4(fmt: Int4Group, shape) -> QuantKernel:
    # codes as linear_w4a16 reads them fastest: panel16_int4_k8 (two instructions per 32
    # weights) when K % 8 == 0, else panel16_int4; @3 reads symmetric codes (no offsets)
    codes = "panel16_int4_k8" if shape[1] % 8 == 0 else "panel16_int4"
    return QuantKernel("linear_w4a16", 2 if fmt.zero_point else 3,
                       {"codes": codes, "scales": "panel16", "offsets": "panel16"}, {"group_size": fmt.group_size})


def _int4_a8(fmt: Int4GroupA8, shape) -> QuantKernel:
    # int8 dot products on whole 8-k blocks of panel16_int4_k8 codes (activation groups too)
    if shape[1] % 8 or fmt.group_size % 8:
        raise InvalidOptionError(f"--quant w4a8 needs input features and groups that are multiples of 8, got "
                                 f"{shape[1]} features in groups of {fmt.group_size}; use --quant w4a16")
    return QuantKernel("linear_w4a8", 1, {"codes": "panel16_int4_k8", "scales": "panel16"},
                       {"group_size": fmt.group_size})


def _experts(fmt: ExpertStack, rows: tuple[int, int]) -> QuantKernel:
    # each expert's matrices in the dense kernels' layouts (moe_quant.cpp runs those kernels
    # on one expert's panels at a time); int4 K decides k8 per matrix, as for a linear
    if isinstance(fmt.inner, Int8PerChannel):
        return QuantKernel("moe_w8a16", 1, {"codes": "panel16"})
    if isinstance(fmt.inner, Fp8E4M3):  # linear_fp8@2's parts and per-token scales (experts: dynamic only)
        return QuantKernel("moe_fp8", 1, {"codes": "panel16"},
                           {"act_group": fmt.inner.act_group} if fmt.inner.act_group else {})
    codes = "panel16_int4_k8" if rows[1] % 8 == 0 else "panel16_int4"
    return QuantKernel("moe_w4a16", 1, {"codes": codes, "scales": "panel16", "offsets": "panel16"},
                       {"zero_point": int(fmt.inner.zero_point)})


def _int4_table(fmt: Int4Group, shape) -> QuantKernel:
    # the tied lm_head's int4 table, in linear_w4a16@3's layouts (stored once for both)
    if fmt.zero_point:
        raise InvalidOptionError("an embedding table tied to lm_head is gathered from symmetric int4 only; "
                                 "use --lm-head int4 (symmetric) or int8")
    return QuantKernel("embedding_w4a16", 1, _int4(fmt, shape).layouts, {"group_size": fmt.group_size})


# (graph op, stored format class) -> (format, weight shape (N, K)) -> the kernel reading it.
# A tied embedding table quantized with lm_head is gathered by embedding_w8a16 from the
# same int8 panel16 tensors (embedding_w4a16: the symmetric int4 ones).
QUANT_KERNELS = {
    ("linear", Int8PerChannel): lambda fmt, shape: QuantKernel("linear_w8a16", 1, {"codes": "panel16"}),
    ("linear", Int4Group): _int4,
    ("linear", Int4GroupA8): _int4_a8,
    # two-level parameters panel16 as stored (uint8 sub-block codes, fp16 super values)
    ("linear", Int4SuperBlock): lambda fmt, shape: QuantKernel(
        "linear_w4k", 1, {"codes": "panel16_int4_k8", "scales": "panel16", "offsets": "panel16",
                          "super_scales": "panel16", "super_offsets": "panel16"}, {"super_block": fmt.super_block}),
    ("linear", W8A8): lambda fmt, shape: QuantKernel("linear_w8a8", 1, {"codes": "vnni16"},
                                                     {"has_smooth": 1} if fmt.smooth else {}),
    # @2: dynamic per-token activation scales computed in the kernel; @1: the stored static one
    # (act_group: power-of-two sub-scales per group of input columns, @2 only)
    ("linear", Fp8E4M3): lambda fmt, shape: QuantKernel("linear_fp8", 2 if fmt.dynamic else 1, {"codes": "panel16"},
                                                        {"act_group": fmt.act_group} if fmt.act_group else {}),
    ("embedding", Int8PerChannel): lambda fmt, shape: QuantKernel("embedding_w8a16", 1, {"codes": "panel16"}),
    ("embedding", Int4Group): _int4_table,
    ("moe", ExpertStack): lambda fmt, shape: _experts(fmt, fmt.rows_shape(shape)),
    ("moe", Mxfp4Experts): lambda fmt, shape: QuantKernel("moe_mxfp4", 1, {}),
}
