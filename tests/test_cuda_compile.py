"""Ahead-of-time compilation of cuda kernels on this CPU machine, and the cubin checker.

Kernels compile to sm_90a cubins without a GPU; the cache serves identical bytes the second
time and recompiles an entry whose bytes do not match its record; the ptxas report stored
with a cubin is the one a separate ptxas run on the same PTX gives; the checker reads the
arch, parameter table, .reqntid, registers and spills from the ELF and reports every
disagreement with the stored metadata.
"""

import re
import struct
import subprocess

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.targets.cuda.compile import KernelSpec, compile_kernels  # noqa: E402
from bessemer.targets.cuda.cubin import (check_kernel, read_cubin, sass_opcodes, sass_opcodes_of,  # noqa: E402
                                         tensor_core_counts, tensor_core_ops)
from bessemer.targets.cuda.compile_worker import ptxas_report, triton_compile  # noqa: E402

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
# compiled without FMA contraction (kernels/__init__.py UNFUSED_KERNELS): ptxas runs with --fmad=false
ROPE = KernelSpec.make(K + "rope", "rope_kv_write_kernel",
                       [("q_ptr", BF), ("k_ptr", BF), ("v_ptr", BF), ("positions_ptr", "*i32"),
                        ("slot_mapping_ptr", "*i32"), ("inv_freq_ptr", "*fp32"), ("k_cache_ptr", "*i8"),
                        ("v_cache_ptr", "*i8"), ("k_scales_ptr", "*fp32"), ("v_scales_ptr", "*fp32"),
                        ("attention_scaling", "fp32")],
                       dict(NUM_HEADS=9, NUM_KV_HEADS=3, HEAD_DIM=64, ROTARY_DIM=64, Q_STRIDE=960, K_STRIDE=960,
                            V_STRIDE=960, BLOCK_HEADS=16, BLOCK_KV_HEADS=4, BLOCK_HALF=32, BLOCK_D=64,
                            KV_BLOCK_SIZE=16, KV_CODES=1),
                       ["q_ptr", "k_ptr", "v_ptr", "positions_ptr", "slot_mapping_ptr", "inv_freq_ptr",
                        "k_cache_ptr", "v_cache_ptr", "k_scales_ptr", "v_scales_ptr"])


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


def test_one_disassembly_of_many_cubins_counts_what_cuobjdump_counts_in_each(compiled):
    """The build's one nvdisasm run over its cubins' code against cuobjdump -sass of each
    cubin alone (the oracle): every opcode's count, in either order and with a repeat; the
    stored tensor-core ops are those of cuobjdump's listing."""
    _, kernels, _ = compiled
    gemm, norm = kernels[0], kernels[1]
    alone = {"gemm": sass_opcodes(gemm.cubin), "norm": sass_opcodes(norm.cubin)}
    assert alone["gemm"]["HGMMA"] > 0 and sum(alone["norm"].values()) > 0
    assert sass_opcodes_of([gemm.cubin, norm.cubin, gemm.cubin]) == [alone["gemm"], alone["norm"], alone["gemm"]]
    assert sass_opcodes_of([norm.cubin, gemm.cubin]) == [alone["norm"], alone["gemm"]]
    assert gemm.metadata["tensor_core_ops"] == tensor_core_ops(alone["gemm"])
    assert norm.metadata["tensor_core_ops"] == tensor_core_ops(alone["norm"]) == {}


def _ptxas(*args: str) -> subprocess.CompletedProcess:
    from triton.backends.nvidia.compiler import get_ptxas

    return subprocess.run([get_ptxas(90).path, *args], capture_output=True, text=True, check=True)


def test_the_stored_ptxas_report_is_what_ptxas_says_of_that_cubin(compiled, tmp_path, monkeypatch):
    """The oracle: the kernel's PTX (Triton run here with the workers' settings) given to
    ptxas again with Triton's flags (line info off, --fmad=false for an unfused kernel, -v)
    must give the stored cubin's very bytes, and its -v lines the stored registers, stack
    frame and spills; `ptxas --version` the stored release."""
    _, kernels, _ = compiled
    (rope,), _ = compile_kernels([ROPE], "sm_90", None)
    assert not rope.metadata["fp_fusion"]
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    release = re.search(r"release [\d.]+, (V[\d.]+)", _ptxas("--version").stdout).group(1)
    for spec, kernel in ((GEMM, kernels[0]), (NORM, kernels[1]), (ROPE, rope)):
        again = triton_compile(spec, 90)
        assert again.asm["cubin"] == kernel.cubin, spec.function
        (tmp_path / "k.ptx").write_text(again.asm["ptx"])
        fmad = [] if kernel.metadata["fp_fusion"] else ["--fmad=false"]
        log = _ptxas("-lineinfo", "-suppress-debug-info", *fmad, "-v", "--gpu-name=sm_90a", str(tmp_path / "k.ptx"),
                     "-o", str(tmp_path / "k.cubin")).stderr
        assert (tmp_path / "k.cubin").read_bytes() == kernel.cubin, spec.function
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", log)
        want = {"stack_frame_bytes": int(frame.group(1)), "spill_store_bytes": int(frame.group(2)),
                "spill_load_bytes": int(frame.group(3)),
                "registers": int(re.search(r"Used (\d+) registers", log).group(1))}
        assert kernel.metadata["ptxas"] == want, spec.function
        assert kernel.metadata["ptxas_version"] == release


def test_a_ptxas_log_that_does_not_describe_the_cubin_is_refused(compiled):
    _, kernels, _ = compiled
    cubin, stored = kernels[1].cubin, kernels[1].metadata["ptxas"]
    log = (f"ptxas info    : Function properties for rms_norm_kernel\n    {stored['stack_frame_bytes']} bytes "
           f"stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           f"ptxas info    : Used {stored['registers']} registers, used 0 barriers\n")
    assert ptxas_report(log, cubin) == stored
    with pytest.raises(RuntimeError, match="no ptxas -v report"):
        ptxas_report("", cubin)  # e.g. Triton stopped printing its log: no silent zeros
    with pytest.raises(RuntimeError, match="registers"):
        ptxas_report(log.replace(f"Used {stored['registers']} ", f"Used {stored['registers'] + 8} "), cubin)
