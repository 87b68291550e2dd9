"""Ahead-of-time compilation of cuda kernels on this CPU machine, and the cubin checker.

Kernels compile to sm_90a cubins without a GPU; the cache serves identical bytes the second
time and recompiles an entry whose bytes do not match its record; the checker reads the
arch, parameter table, .reqntid, registers and spills from the ELF and reports every
disagreement with the stored metadata.
"""

import struct

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.targets.cuda.compile import KernelSpec, compile_kernels  # noqa: E402
from bessemer.targets.cuda.cubin import check_kernel, read_cubin, tensor_core_counts  # noqa: E402

K = "bessemer.targets.cuda.kernels."
BF = "*bf16"
GEMM = KernelSpec.make(K + "gemm", "gemm_kernel",
                       [("x_ptr", BF), ("w_ptr", BF), ("bias_ptr", "*fp32"), ("y_ptr", BF), ("partials_ptr", "*fp32"),
                        ("counters_ptr", "*i32"), ("M", "i32")],
                       dict(N=960, K=576, X_STRIDE=576, Y_STRIDE=960, HAS_BIAS=True, BLOCK_M=128, BLOCK_N=128,
                            BLOCK_K=64, GROUP_M=8, SPLIT_K=1, K_PARTS=1), ["x_ptr", "w_ptr", "bias_ptr", "y_ptr"],
                       num_warps=8, num_stages=3)
NORM = KernelSpec.make(K + "norm", "rms_norm_kernel",
                       [("x_ptr", BF), ("w_ptr", "*fp32"), ("y_ptr", BF), ("eps", "fp32"), ("weight_offset", "fp32")],
                       dict(N=576, X_STRIDE=576, Y_STRIDE=576, BLOCK=1024), ["x_ptr", "w_ptr", "y_ptr"])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")
    kernels, report = compile_kernels([GEMM, NORM, GEMM], "sm_90", cache)
    return cache, kernels, report


def _metadata(spec, kernel):
    return dict(kernel.metadata, params=spec.param_table())


def test_compiles_each_distinct_spec_once_to_consistent_sm90a_cubins(compiled):
    cache, kernels, report = compiled
    assert (report.distinct, report.compiled, report.cached) == (2, 2, 0)
    assert kernels[0].cubin == kernels[2].cubin
    for spec, kernel in zip([GEMM, NORM], kernels):
        assert check_kernel(kernel.cubin, _metadata(spec, kernel), "sm_90a") == []
        info = read_cubin(kernel.cubin)
        assert info.arch == "sm_90a" and info.entry == spec.function
        # runtime parameters then Triton's two scratch pointers, naturally aligned
        assert len(info.params) == len(spec.params) + 2
    gemm = read_cubin(kernels[0].cubin)
    assert gemm.params[6] == (48, 4) and gemm.reqntid == (256, 1, 1)  # M: i32 after six pointers
    assert kernels[0].metadata["shared"] > 48 * 1024  # the pipelined GEMM needs the opt-in
    assert tensor_core_counts(kernels[0].cubin).get("HGMMA", 0) > 0
    assert not tensor_core_counts(kernels[1].cubin)


def test_the_cache_serves_the_same_bytes_and_rejects_a_torn_entry(compiled):
    cache, kernels, _ = compiled
    again, report = compile_kernels([GEMM, NORM], "sm_90", cache)
    assert (report.compiled, report.cached) == (0, 2)
    assert [k.cubin for k in again] == [kernels[0].cubin, kernels[1].cubin]
    torn = next(p for p in cache.glob("*.cubin") if p.read_bytes() == kernels[1].cubin)
    torn.write_bytes(torn.read_bytes()[:-7])
    fixed, report = compile_kernels([NORM], "sm_90", cache)
    assert (report.compiled, report.cached) == (1, 0)
    assert fixed[0].cubin == kernels[1].cubin  # and compilation is deterministic


def test_the_checker_reports_every_disagreement(compiled):
    _, kernels, _ = compiled
    gemm = kernels[0]
    md = _metadata(GEMM, gemm)
    assert check_kernel(gemm.cubin, md, "sm_89") == [f"{md['entry']}: cubin arch sm_90a, engine arch sm_89"]
    wrong_params = dict(md, params=[dict(p, size=8) for p in md["params"]])  # M claimed 8 bytes
    assert "parameters" in " ".join(check_kernel(gemm.cubin, wrong_params, "sm_90a"))
    assert "reqntid" in " ".join(check_kernel(gemm.cubin, dict(md, num_warps=4), "sm_90a"))
    spilled = dict(md, ptxas=dict(md["ptxas"], spill_store_bytes=8))
    assert "spills" in " ".join(check_kernel(gemm.cubin, spilled, "sm_90a"))
    flags = struct.unpack_from("<I", gemm.cubin, 0x30)[0]
    plain = bytearray(gemm.cubin)
    struct.pack_into("<I", plain, 0x30, flags & ~0x800)  # the sm_90 (not 90a) flag bits
    assert read_cubin(bytes(plain)).arch == "sm_90"
    assert "sha256" in " ".join(check_kernel(bytes(plain), md, "sm_90a"))
