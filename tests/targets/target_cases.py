"""What the conformance suite (test_conformance.py) needs to know of each target, and how it
runs an existing test as one of its checks.

Every target declares its kernels as data (targets/<name>/kernel_table.py: KERNELS, the ops
it runs; QUANT_KERNELS, (op, stored format class) -> the kernel reading that format). The
kernel tests themselves live with their target (tests/test_kernels.py and the quantized
kernel tests for cpu, tests/cuda_interpreter/ for cuda) and compare each kernel with its
plugins/ops.py reference at that target's tolerance. CASES names, per declared kernel, one
parameter set of one of those tests: test_conformance.py fails for a declared kernel with no
case here, and for a case whose kernel is no longer declared.

A kernel is named "op" (a graph op, KERNELS) or "op:FormatClass" (a QUANT_KERNELS row).
FAMILY names, per target, its test of a tiny random-weight family against HF; ENGINES, the
tiny engine its executor checks open; OWN_PROCESS, the environment of a target whose checks
run in a child process (the cuda kernels run under the Triton interpreter, chosen when a
kernel module is imported, so not in the process that compiles kernels ahead of time).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bessemer.quantization.config import QuantConfig
from bessemer.targets import RunOptions

TESTS = Path(__file__).resolve().parent.parent
CUDA_INTERPRETER = TESTS / "cuda_interpreter"


@dataclass(frozen=True)
class Case:
    module: str  # a test file, relative to tests/
    function: str  # a kernel-vs-reference test in it
    kwargs: dict = field(default_factory=dict)  # one of its parameter sets; fixtures are added


_AVX2 = dict(isa="avx2")
CPU = {
    "embedding": Case("test_kernels.py", "test_embedding", dict(_AVX2, dtype="bfloat16", layout="panel16")),
    "rms_norm": Case("test_kernels.py", "test_rms_norm", dict(_AVX2, H=37, offset=1.0)),
    "add_rms_norm": Case("test_kernels.py", "test_add_rms_norm", dict(_AVX2, inplace=True)),
    "add": Case("test_kernels.py", "test_add_silu_mul_gather", dict(_AVX2, H=19)),
    "silu_mul": Case("test_kernels.py", "test_add_silu_mul_gather", dict(_AVX2, H=19)),
    "gather_rows": Case("test_kernels.py", "test_add_silu_mul_gather", dict(_AVX2, H=19)),
    "gelu_tanh_mul": Case("test_kernels.py", "test_gelu_tanh_mul_scale_sigmoid_gate", dict(_AVX2, H=19)),
    "scale": Case("test_kernels.py", "test_gelu_tanh_mul_scale_sigmoid_gate", dict(_AVX2, H=19)),
    "sigmoid_gate_mul": Case("test_kernels.py", "test_gelu_tanh_mul_scale_sigmoid_gate", dict(_AVX2, H=19)),
    "linear": Case("test_kernels.py", "test_linear", dict(_AVX2, wdtype="bfloat16", M=17, N=40, K=72, bias=True,
                                                       threads=2)),
    "rope": Case("test_kernels.py", "test_rope", dict(_AVX2, D=32, R=16, scaling=0.9)),
    "attention": Case("test_kernels.py", "test_attention_mixed", dict(_AVX2, H=4, Hkv=2, D=32, bs=16, kv_dtype="int8",
                                                                   threads=2)),
    "attention_sinks": Case("test_kernels.py", "test_attention_sinks", dict(_AVX2, kv_dtype="bfloat16")),
    "rms_norm_heads": Case("test_kernels.py", "test_rms_norm_heads", dict(_AVX2, heads=3, d=12, offset=1.0,
                                                                       inplace=True)),
    "moe": Case("test_kernels.py", "test_moe", dict(_AVX2, layout=1, act=1, after=1, renorm=0, biases=True, first=2,
                                                 local=3)),
    "all_reduce": Case("test_tensor_parallel.py", "test_shm_collectives_match_references"),
    "all_gather": Case("test_tensor_parallel.py", "test_shm_collectives_match_references"),
    "linear:Int8PerChannel": Case("test_quant_kernels.py", "test_linear_w8a16", dict(_AVX2, M=3, N=40, K=96, bias=True,
                                                                                  threads=2)),
    # the versions the builder stores: @2 asymmetric, @3 symmetric, bf16 parameters, k8 codes
    "linear:Int4Group": Case("test_quant_kernels.py", "test_linear_w4a16", dict(
        _AVX2, version=3, layout="panel16_int4_k8", params="bfloat16", M=17, N=40, K=96, G=32, bias=True,
        zero_point=False, threads=2)),
    "linear:Int4GroupA8": Case("test_w4a8_kernel.py", "test_linear_w4a8_matches_reference", dict(
        _AVX2, M=17, N=40, K=96, G=32, bias=False, threads=2)),
    "linear:Int4SuperBlock": Case("test_superblock.py", "test_linear_w4k_matches_reference", dict(
        _AVX2, M=17, N=40, K=1536, bias=True, threads=2)),
    "linear:W8A8": Case("test_w8a8_kernel.py", "test_linear_w8a8_matches_reference", dict(
        _AVX2, M=9, N=33, K=5, smooth=True, bias=False, threads=2)),
    "linear:Fp8E4M3": Case("test_fp8_kernels.py", "test_linear_fp8_dynamic", dict(_AVX2, M=3, N=40, K=97, bias=True,
                                                                               threads=2)),
    "embedding:Int8PerChannel": Case("test_quant_kernels.py", "test_embedding_w8a16_tied_table", dict(
        _AVX2, Vt=50, H=96, T=7, threads=1)),
    "embedding:Int4Group": Case("test_quant_kernels.py", "test_embedding_w4a16_tied_table", dict(
        _AVX2, Vt=50, H=96, G=32, T=7, threads=1)),
    # experts: through a tiny MoE engine against HF on the same fake-quantized expert weights
    "moe:ExpertStack": Case("test_moe_quant.py", "test_quantized_experts_match_fake_quantized_hf", dict(
        kind="qwen3-moe", quant=QuantConfig("w4a16", group_size=32, lm_head="none"))),
    "moe:Mxfp4Experts": Case("test_moe_quant.py", "test_mxfp4_experts_kept_as_shipped"),
}

_BF16 = dict(dtype="bfloat16")
_ROWS, _ATTENTION = "cuda_interpreter/test_kernels_rows.py", "cuda_interpreter/test_kernels_attention.py"
_QUANTIZED, _FP8 = "cuda_interpreter/test_quantized.py", "cuda_interpreter/test_fp8.py"
_ATTENTION_TEST = "test_prefill_and_decode_attention_match_reference"
_TILES = dict(BLOCK_M=16, BLOCK_N=16)
CUDA = {
    "embedding": Case(_ROWS, "test_embedding_and_gather_rows_copy_rows_exactly", _BF16),
    "gather_rows": Case(_ROWS, "test_embedding_and_gather_rows_copy_rows_exactly", _BF16),
    "rms_norm": Case(_ROWS, "test_rms_norm", dict(_BF16, width=88)),
    "add_rms_norm": Case(_ROWS, "test_add_rms_norm_normalizes_the_stored_residual", dict(_BF16, in_place=True)),
    "add": Case(_ROWS, "test_add_and_silu_mul", _BF16),
    "silu_mul": Case(_ROWS, "test_add_and_silu_mul", _BF16),
    "rms_norm_heads": Case(_ROWS, "test_rms_norm_heads_in_place_on_a_view", dict(_BF16, heads=3, head_dim=24,
                                                                                  offset=1.0)),
    "gelu_tanh_mul": Case(_ROWS, "test_gelu_tanh_mul_and_scale", _BF16),
    "scale": Case(_ROWS, "test_gelu_tanh_mul_and_scale", _BF16),
    "sigmoid_gate_mul": Case(_ROWS, "test_sigmoid_gate_mul", _BF16),
    "rope": Case(_ROWS, "test_rope_rotates_q_in_place_and_writes_k_v_to_their_cache_slots", dict(
        _BF16, heads=6, kv_heads=2, head_dim=32, rotary_dim=16, scaling=1.0)),
    "linear": Case(_ROWS, "test_gemm", dict(_BF16, m=3, n=72, k=192, bias=True, tile=(16, 32, 64), split=3)),
    "attention": Case(_ATTENTION, _ATTENTION_TEST, dict(_BF16, kv=None, sinks=False, heads=6, kv_heads=2, head_dim=32,
                                                        block_size=4, window=5, splits=3, tiles=_TILES)),
    "attention_sinks": Case(_ATTENTION, _ATTENTION_TEST, dict(_BF16, kv=None, sinks=True, heads=4, kv_heads=2,
                                                              head_dim=16, block_size=4, window=0, splits=1,
                                                              tiles=_TILES)),
    "moe": Case("cuda_interpreter/test_moe.py", "test_moe_matches_reference", dict(layout=1, activation=1, after=1,
                                                                                   norm=0, bias=True)),
    "linear:Int8PerChannel": Case(_QUANTIZED, "test_gemm_w8", dict(_BF16, m=3, tile=(16, 32, 64), split=3)),
    "linear:Int4Group": Case(_QUANTIZED, "test_gemm_w4", dict(_BF16, zero_point=True, group=32, split=4)),
    "linear:Int4SuperBlock": Case(_QUANTIZED, "test_gemm_w4k", dict(_BF16, m=5, tile=(16, 32), split=3)),
    "linear:Fp8E4M3": Case(_FP8, "test_gemm_fp8", dict(_BF16, dynamic=True, m=3, tile=(16, 32, 64), split=3)),
    "embedding:Int8PerChannel": Case(_QUANTIZED, "test_embedding_w8_reads_the_int8_table"),
    # int8 and int4 experts: one kernel family (BITS); the int4 asymmetric, gpt-oss-rows case
    "moe:ExpertStack": Case("cuda_interpreter/test_moe_grouped.py", "test_grouped_quantized_experts_match_reference",
                            dict(bits=4, zero_point=True, layout=1, activation=1, biases=True)),
    "moe:Mxfp4Experts": Case("cuda_interpreter/test_moe_grouped.py", "test_grouped_quantized_experts_match_reference",
                             dict(bits=0, zero_point=False, layout=1, activation=1, biases=True)),
}

CASES = {"cpu": CPU, "cuda": CUDA}

# Per target, one test of a tiny random-weight family end to end (engine logits vs HF's).
FAMILY = {
    "cpu": Case("test_models_tiny.py", "test_prefill_and_decode_logits_match_hf", dict(kind="llama-tied")),
    "cuda": Case("cuda_interpreter/test_plans.py", "test_chunked_prefill_and_decode_logits_match_hf",
                 dict(kind="llama-tied")),
}


# the engine each target's executor checks open: (fixture, its build options, run options)
ENGINES = {
    "cpu": ("tiny_engine", dict(kv_block_size=4, max_num_tokens=24, max_seq_len=64), RunOptions(num_threads=2)),
    "cuda": ("cuda_engine", dict(max_seq_len=64), RunOptions(interpret=True)),
}
OWN_PROCESS = {"cuda": {"TRITON_INTERPRET": "1"}}


def _load(module: str):
    """A test file as a module, named by its path (tests/test_fp8.py and
    tests/cuda_interpreter/test_fp8.py are two modules); it imports its neighbours
    (tolerances, conftest, interp_support) from sys.path."""
    for folder in (str(TESTS), str(CUDA_INTERPRETER)):
        if folder not in sys.path:
            sys.path.append(folder)
    name = "conformance." + module.removesuffix(".py").replace("/", ".")
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, TESTS / module)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def run_case(case: Case, fixture: Callable[[str], object]) -> None:
    """Runs the case's test; `fixture(name)` gives the pytest fixtures it takes (tmp_path,
    tiny_checkpoint, ...) beyond the case's parameters."""
    test = getattr(_load(case.module), case.function)
    kwargs = dict(case.kwargs)
    for name in inspect.signature(test).parameters:
        if name not in kwargs:
            kwargs[name] = fixture(name)
    test(**kwargs)
