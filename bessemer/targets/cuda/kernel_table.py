"""The cuda target's kernels as data: the graph ops it runs (KERNELS) and, for every stored
quantization format it reads, the Triton kernel that reads it (QUANT_KERNELS). Read through
Target.has_kernel / Target.quant_kernel (targets/__init__.py); lower.py turns the chosen
QuantKernel into a launch (its sizes, grid and the split-K workspace are lower.py's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bessemer.errors import InvalidOptionError
from bessemer.quantization.formats import ExpertStack, Fp8E4M3, Int4Group, Int4SuperBlock, Int8PerChannel, Mxfp4Experts
from bessemer.quantization.superblock import SUB

# plugins/ops.py ops lower.py lowers (split: column views, no launch); no collectives yet
KERNELS = frozenset({
    "embedding", "rms_norm", "add_rms_norm", "add", "linear", "silu_mul", "gather_rows", "split", "rope",
    "attention", "attention_sinks", "rms_norm_heads", "gelu_tanh_mul", "scale", "moe", "sigmoid_gate_mul",
})


@dataclass(frozen=True)
class QuantKernel:
    """The Triton kernel (kernels/<family>.py) that reads one stored format's parts."""

    family: str
    function: str
    # (kernel parameter, part role, pointer dtype when the format stores no such part: the
    # parameter is then a null pointer), in kernel order
    parts: tuple[tuple[str, str, str], ...]
    constexprs: dict = field(default_factory=dict)
    max_block: tuple[int, int] = (128, 128)  # the largest (BLOCK_N, BLOCK_K) its GEMM tiles may be


_CODES_AND_SCALES = (("codes_ptr", "codes", ""), ("scales_ptr", "scales", ""))
_NO_OFFSETS = _CODES_AND_SCALES + (("offsets_ptr", "offsets", "float32"),)  # a null pointer


def _gemm_w4(fmt: Int4Group, shape) -> QuantKernel:
    if fmt.group_size % 32:
        raise InvalidOptionError(f"4-bit groups of {fmt.group_size} (its {shape[1]} input features) are not a "
                                 "multiple of 32, which the cuda kernels need; use --group-size 32, 64 or 128 "
                                 "with a model whose widths they divide")
    scales = next(p.dtype for p in fmt.parts(shape) if p.role == "scales")
    # a K block lies inside one group; offsets' row sums of x spill at 128 x 128 tiles (sm_90a)
    return QuantKernel("gemm_quant", "gemm_w4_kernel", _CODES_AND_SCALES + (("offsets_ptr", "offsets", scales),),
                       dict(GROUP=fmt.group_size, SYMMETRIC=not fmt.zero_point),
                       (64 if fmt.zero_point else 128, min(64, fmt.group_size)))


def _gemm_w4k(fmt: Int4SuperBlock, shape) -> QuantKernel:
    # every part row-major as stored; a K block is one sub-block of 32 (its own scale and
    # minimum). Four parameter vectors a K block, each spread over the accumulator's columns:
    # 64-wide tiles hit 255 registers and spill from 64 rows at the 8B shapes (sm_90a), 32-wide
    # ones take 160-200 without spills
    roles = ("codes", "scales", "offsets", "super_scales", "super_offsets")
    return QuantKernel("gemm_w4k", "gemm_w4k_kernel", tuple((f"{role}_ptr", role, "") for role in roles),
                       dict(SUB_BLOCK=SUB, SUPER_BLOCK=fmt.super_block), (32, SUB))


def _experts(fmt: ExpertStack, shape) -> QuantKernel:
    """A moe node's gate_up or down stored as an ExpertStack: read by the grouped expert GEMMs
    (kernels/moe_grouped.py). The row names the gate/up kernel; the down launch runs its
    partner moe_down_grouped_kernel on the same parameters (lower.py)."""
    rows = fmt.rows_shape(shape)  # (E*N, K)
    inner = fmt.inner
    if isinstance(inner, Int8PerChannel):
        return QuantKernel("moe_grouped", "moe_gate_up_grouped_kernel", _NO_OFFSETS,
                           dict(BITS=8, MXFP4=False, FP8=False, GROUP=0, SYMMETRIC=True), (64, 64))
    if isinstance(inner, Fp8E4M3):
        if not inner.dynamic or inner.act_group:  # expert_format never stores these
            raise InvalidOptionError(f"experts stored as {inner.describe()} have no cuda kernel (it scales expert "
                                     "activations per token only); use --quant fp8 without --fp8-act-group")
        return QuantKernel("moe_grouped", "moe_gate_up_grouped_kernel", _NO_OFFSETS,
                           dict(BITS=8, MXFP4=False, FP8=True, GROUP=0, SYMMETRIC=True), (64, 64))
    if type(inner) is not Int4Group:
        raise InvalidOptionError(f"experts stored as {inner.describe()} have no cuda kernel; use --quant w8a16, "
                                 "w4a16 or fp8")
    dense = _gemm_w4(inner, rows)  # the same 4-bit groups as a linear's: multiples of 32
    return QuantKernel("moe_grouped", "moe_gate_up_grouped_kernel", dense.parts,
                       dict(BITS=4, MXFP4=False, FP8=False, GROUP=inner.group_size, SYMMETRIC=not inner.zero_point),
                       (64, min(64, inner.group_size)))


# gpt-oss's experts as shipped (no --quant): E2M1 codes and E8M0 scales per 32 of K, read by
# the same grouped GEMMs (K blocks of 32: one scale each)
_MXFP4_EXPERTS = QuantKernel("moe_grouped", "moe_gate_up_grouped_kernel", _NO_OFFSETS,
                             dict(BITS=4, MXFP4=True, FP8=False, GROUP=32, SYMMETRIC=True), (64, 32))


# (graph op, stored format class) -> (format, weight shape (N, K)) -> the kernel reading it.
# Weight-only int8 / int4 codes: kernels/gemm_quant.py; two-level int4 (w4k):
# kernels/gemm_w4k.py; fp8: kernels/gemm_fp8.py; a tied
# embedding table quantized with lm_head: gathered by embedding_w8_kernel from the same parts;
# a moe node's int8 / int4 / E4M3 / MXFP4 experts: the grouped expert GEMMs of kernels/moe_grouped.py.
QUANT_KERNELS = {
    ("linear", Int8PerChannel): lambda fmt, shape: QuantKernel("gemm_quant", "gemm_w8_kernel", _CODES_AND_SCALES,
                                                               max_block=(128, 64)),
    ("linear", Int4Group): _gemm_w4,
    ("linear", Int4SuperBlock): _gemm_w4k,
    ("linear", Fp8E4M3): lambda fmt, shape: QuantKernel(
        "gemm_fp8", "gemm_fp8_kernel", _CODES_AND_SCALES + (("input_scale_ptr", "input_scale", "float32"),),
        dict(DYNAMIC=fmt.dynamic)),
    ("embedding", Int8PerChannel): lambda fmt, shape: QuantKernel("gemm_quant", "embedding_w8_kernel",
                                                                  _CODES_AND_SCALES),
    ("moe", ExpertStack): _experts,
    ("moe", Mxfp4Experts): lambda fmt, shape: _MXFP4_EXPERTS,
}
