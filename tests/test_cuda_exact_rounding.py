"""The kernels whose bits are promised equal to a NumPy reference compile, for sm_90a, to
the arithmetic NumPy does: the one-byte KV writes (rope_kv_write_kernel, kv_write_kernel:
quantization/kv_cache.py's codes and scales) and the fp8 GEMM's activation codes
(gemm_fp8_kernel: quantization/fp8.py). Read from the PTX Triton generates:

- every fp32 quotient is div.rn.f32 (IEEE round to nearest, as NumPy), none div.full.f32 or
  div.approx.f32 (what fp32 `/` compiles to);
- the KV writes, compiled without FMA fusion (kernels/__init__.py's UNFUSED_KERNELS), hold no
  fma.rn.f32, while the same kernel compiled with fusion does: the switch is what removes them
  (libdevice's sin/cos keep their own fma.rn.ftz.f32: RoPE's angles are a stated tolerance);
- the compile path of an engine applies the declaration: the stored metadata says
  fp_fusion false and ptxas, rerun with --fmad=false for the report, gives the same cubin.

The interpreter tests (tests/cuda_interpreter/test_kernels_rows.py, test_fp8.py) then check
the bits themselves: the interpreter divides and multiplies as this PTX does.
"""

import re

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.targets.cuda.compile import KernelSpec, compile_kernels  # noqa: E402
from bessemer.targets.cuda.compile_worker import triton_compile  # noqa: E402
from bessemer.targets.cuda.cubin import check_kernel  # noqa: E402
from bessemer.targets.cuda.kernels import fp_fusion  # noqa: E402

K = "bessemer.targets.cuda.kernels."
BF = "*bf16"


def _kv_params(codes: int) -> list:
    code = "*i8" if codes == 1 else "*fp8e4nv"
    return [("k_cache_ptr", code), ("v_cache_ptr", code), ("k_scales_ptr", "*fp32"), ("v_scales_ptr", "*fp32")]


def rope_kv_write(codes: int) -> KernelSpec:  # SmolLM2-135M's attention shape
    return KernelSpec.make(K + "rope", "rope_kv_write_kernel", [
        ("q_ptr", BF), ("k_ptr", BF), ("v_ptr", BF), ("positions_ptr", "*i32"), ("slot_mapping_ptr", "*i32"),
        ("inv_freq_ptr", "*fp32"), *_kv_params(codes), ("attention_scaling", "fp32")],
        dict(NUM_HEADS=9, NUM_KV_HEADS=3, HEAD_DIM=64, ROTARY_DIM=64, Q_STRIDE=960, K_STRIDE=960, V_STRIDE=960,
             BLOCK_HEADS=16, BLOCK_KV_HEADS=4, BLOCK_HALF=32, BLOCK_D=64, KV_BLOCK_SIZE=16, KV_CODES=codes))


def kv_write(codes: int) -> KernelSpec:
    return KernelSpec.make(K + "rope", "kv_write_kernel", [
        ("k_ptr", BF), ("v_ptr", BF), ("slot_mapping_ptr", "*i32"), *_kv_params(codes)],
        dict(NUM_KV_HEADS=3, HEAD_DIM=64, K_STRIDE=960, V_STRIDE=960, BLOCK_KV_HEADS=4, BLOCK_D=64,
             KV_BLOCK_SIZE=16, KV_CODES=codes))


def gemm_fp8(dynamic: bool) -> KernelSpec:
    return KernelSpec.make(K + "gemm_fp8", "gemm_fp8_kernel", [
        ("x_ptr", BF), ("codes_ptr", "*fp8e4nv"), ("scales_ptr", "*fp32"), ("input_scale_ptr", "*fp32"),
        ("bias_ptr", "*fp32"), ("y_ptr", BF), ("partials_ptr", "*fp32"), ("counters_ptr", "*i32"), ("M", "i32")],
        dict(N=576, K=1536, X_STRIDE=1536, Y_STRIDE=576, DYNAMIC=dynamic, HAS_BIAS=True, BLOCK_M=16, BLOCK_N=64,
             BLOCK_K=64, GROUP_M=8, SPLIT_K=4, K_PARTS=4))  # the decode bucket's split of down_proj


def _count(ptx: str, instruction: str) -> int:
    """Occurrences of one PTX instruction with exactly these modifiers (fma.rn.f32 is not fma.rn.ftz.f32)."""
    return len(re.findall(r"\b" + re.escape(instruction) + r"\s", ptx))


@pytest.fixture(autouse=True)
def _private_triton_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))


@pytest.mark.parametrize("spec", [rope_kv_write(1), kv_write(1), gemm_fp8(True), gemm_fp8(False)],
                         ids=["rope_kv_write-int8", "kv_write-int8", "gemm_fp8-dynamic", "gemm_fp8-static"])
def test_quotients_that_become_codes_or_scales_are_ieee_divisions(spec):
    ptx = triton_compile(spec, 90).asm["ptx"]
    counts = {i: _count(ptx, i) for i in ("div.rn.f32", "div.full.f32", "div.approx.f32")}
    # KV: 1/amax and amax/max per head, for K and V; fp8: the scale (dynamic) and x / s_x
    assert counts["div.rn.f32"] > 0 and counts["div.full.f32"] == counts["div.approx.f32"] == 0, counts


@pytest.mark.parametrize("make", [rope_kv_write, kv_write], ids=["rope_kv_write", "kv_write"])
def test_kv_writes_compile_without_fma_contraction(make):
    spec = make(1)  # int8: the code is (x * inv + 1.5 * 2^23) - 1.5 * 2^23, an FMA's favourite
    assert not fp_fusion(spec.module, spec.function)
    unfused = triton_compile(spec, 90).asm["ptx"]
    fused = triton_compile(spec, 90, enable_fp_fusion=True).asm["ptx"]
    assert _count(fused, "fma.rn.f32") > 0  # what the declaration removes
    assert _count(unfused, "fma.rn.f32") == 0 and _count(unfused, "mul.rn.f32") > 0


def test_an_engine_compile_applies_the_declaration_and_its_report_matches_the_cubin():
    rope_spec, gemm_spec = rope_kv_write(2), gemm_fp8(True)
    kernels, _ = compile_kernels([rope_spec, gemm_spec], "sm_90", cache=None)
    assert [k.metadata["fp_fusion"] for k in kernels] == [False, True]
    for spec, kernel in zip([rope_spec, gemm_spec], kernels):
        assert check_kernel(kernel.cubin, dict(kernel.metadata, params=spec.param_table()), "sm_90a") == []
