"""The SmolLM2-135M cuda engine, built on this CPU machine with the CLI, every cubin checked
without a GPU: ELF arch sm_90a, parameter table equal to the stored metadata, .reqntid =
32 x the compiled num_warps, no register spills, and tensor-core instructions (HGMMA or
HMMA, read from the SASS) in every GEMM and attention kernel."""

import json
import subprocess
from collections import Counter

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.format.container import read_rank_header  # noqa: E402
from bessemer.targets.cuda.cubin import (check_kernel, read_cubin, sass_opcodes, sass_opcodes_of,  # noqa: E402
                                         tensor_core_ops)

TENSOR_CORE_KERNELS = {"gemm_kernel", "attention_prefill_kernel", "attention_decode_kernel"}


class Disassembly:
    """cuobjdump's opcode counts of each distinct cubin, disassembled once per test: a
    cuobjdump run costs about a second of CPU, and engines of one test share cubins (the
    int8 lm_head's GEMMs) while a split-K cubin is read for its tensor-core ops and its
    atomics."""

    def __init__(self):
        self._counts: dict[bytes, Counter] = {}

    def opcodes(self, cubin: bytes) -> Counter:
        if cubin not in self._counts:
            self._counts[cubin] = sass_opcodes(cubin)
        return self._counts[cubin]


@pytest.fixture(scope="module")
def smollm2_cuda_engine(smollm2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2-cuda") / "engine"
    proc = subprocess.run(["build-engine", str(smollm2_dir), "--output", str(out), "--target", "cuda"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.slow
def test_every_cubin_of_the_smollm2_engine_passes_the_checks(smollm2_cuda_engine):
    path = smollm2_cuda_engine / "rank0.engine"
    _, _, header, data_offset = read_rank_header(path)
    data = path.read_bytes()
    blobs = {t["name"]: data[data_offset + t["offset"]: data_offset + t["offset"] + t["nbytes"]]
             for t in header["tensors"] if t["name"].startswith("cubin/")}
    kernels = header["kernels"]
    assert len(blobs) == len({k["cubin_sha256"] for k in kernels}) >= 20
    sass = Disassembly()
    for k in kernels:
        cubin = blobs[k["cubin"]]
        assert check_kernel(cubin, k, "sm_90a") == [], k["function"]
        assert read_cubin(cubin).reqntid == (32 * k["num_warps"], 1, 1)
        if k["function"] in TENSOR_CORE_KERNELS:
            ops = tensor_core_ops(sass.opcodes(cubin))  # from the SASS, not the stored summary
            assert ops and ops == k["tensor_core_ops"], (k["function"], ops)
    # the prefill-sized GEMMs and the flash prefill run on Hopper's warpgroup MMA
    big = [k for k in kernels if k["function"] == "gemm_kernel" and k["constexprs"]["BLOCK_M"] >= 64]
    assert big and all("HGMMA" in k["tensor_core_ops"] for k in big)
    # decode GEMMs with K in parts: the tile's counter is a gpu-scope atomic after a fence
    split = [k for k in kernels if k["constexprs"].get("SPLIT_K", 1) > 1]
    assert split and all(k["function"] == "gemm_kernel" for k in split)
    for k in split:
        ops = sass.opcodes(blobs[k["cubin"]])
        assert ops["ATOMG"] and ops["MEMBAR"], (k["constexprs"], dict(ops))
    assert all("HGMMA" in k["tensor_core_ops"] for k in kernels if k["function"] == "attention_prefill_kernel")


@pytest.mark.slow  # builds the SmolLM2 cuda engine (with the test above)
def test_inspect_shows_each_linear_shapes_tiles_and_split_k(smollm2_cuda_engine):
    """The lowering's choice per linear shape (lower.split_k: the decode bucket's 16 x 64 tiles
    times the parts of K within 264 programs), as `bessemer inspect` prints it: o_proj (576
    x 576: 9 tiles, 9 blocks of K) in 9 parts, down_proj (576 x 1536: 24 blocks) in 24, the
    lm_head (768 tiles) whole."""
    info = subprocess.run(["bessemer", "inspect", str(smollm2_cuda_engine)], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    lines = {line.split("(")[-1].rstrip(")"): line for line in info.stdout.splitlines()
             if line.startswith("    gemm_kernel")}
    assert "K parts  9 | <=16: 16x64x64 4w/3s split 9, 81 programs at 16" in lines["model.layers.0.self_attn.o_proj"]
    assert "K parts 24 | <=16: 16x64x64 4w/3s split 24, 216 programs at 16" in lines["model.layers.0.mlp.down_proj"]
    assert "x30" in lines["model.layers.0.mlp.down_proj"]  # one row per shape: 30 layers
    assert "K parts  1 | <=16: 16x64x64 4w/3s split 1, 768 programs at 16" in lines["lm_head"]


@pytest.mark.slow  # builds the SmolLM2 cuda engine (with the test above)
def test_smollm2_cuda_build_report(smollm2_cuda_engine):
    report = json.loads((smollm2_cuda_engine / "build_report.json").read_text())
    kernels = report["kernels"]
    assert kernels["distinct"] == len(kernels["kernels"]) and kernels["seconds"] > 0
    assert all(k["spill_bytes"] == 0 for k in kernels["kernels"])
    print(f"SmolLM2 cuda engine: {report['engine_bytes'] / 2**20:.1f} MiB, built in {report['timings_s']['total']:.1f} s, "
          f"{kernels['distinct']} kernels ({kernels['compiled']} compiled in {kernels['seconds']:.1f} s)")


@pytest.mark.slow
def test_quantized_gemm_cubins_pass_the_checks(tiny_checkpoint, tmp_path, kernel_cache):
    """Quantized cuda engines (w4a16 symmetric and asymmetric, w4k two-level, w8a16 and the
    int8 lm_head, fp8 with dynamic activation scales): every quantized GEMM cubin passes the
    checks and spills nothing; weight-only ones dequantize in registers into bf16
    tensor-core dots (HMMA in the 16-row tiles, HGMMA from 64 rows; decode tiles split K
    where the output has few tiles, with an atomic counter per tile), fp8 ones run E4M3 x
    E4M3 on Hopper's FP8 tensor cores (QGMMA) from 64 rows (16-row tiles: HMMA on the codes
    widened to fp16, exact); every format's decode tiles split K where the output has few tiles."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.config import QuantConfig
    from conftest import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint("llama-tied", tmp_path / "hf", intermediate_size=128)
    # Every GEMM cubin is read from one batched disassembly per engine (sass_opcodes_of, held
    # equal to cuobjdump's by test_cuda_compile); cuobjdump (a second each) re-reads one cubin
    # of each kind in each engine: function, tile class and split K
    sass, kinds = Disassembly(), set()
    for i, quant in enumerate([QuantConfig("w4a16", group_size=32), QuantConfig("w4a16", group_size=64, zero_point=True),
                               QuantConfig("w4k"), QuantConfig("w8a16"), QuantConfig("fp8", fp8_rounding="nearest")]):
        path = build_engine(ckpt, tmp_path / f"e{i}", BuildConfig(target="cuda", dtype="bfloat16", quant=quant, max_seq_len=128)) \
            / "rank0.engine"
        _, _, header, data_offset = read_rank_header(path)
        data = path.read_bytes()
        blobs = {t["name"]: data[data_offset + t["offset"]: data_offset + t["offset"] + t["nbytes"]]
                 for t in header["tensors"] if t["name"].startswith("cubin/")}
        main = {"w4a16": "gemm_w4_kernel", "w4k": "gemm_w4k_kernel", "w8a16": "gemm_w8_kernel",
                "fp8": "gemm_fp8_kernel"}[quant.mode]
        gemms = [k for k in header["kernels"]
                 if k["function"] in ("gemm_w4_kernel", "gemm_w4k_kernel", "gemm_w8_kernel", "gemm_fp8_kernel")]
        split_k_seen = set()
        assert {k["function"] for k in gemms} == {main, "gemm_w8_kernel"}  # + the int8 lm_head
        assert any(k["function"] == "embedding_w8_kernel" for k in header["kernels"])  # the tied int8 table
        for k, opcodes in zip(gemms, sass_opcodes_of([blobs[k["cubin"]] for k in gemms])):
            cubin = blobs[k["cubin"]]
            assert check_kernel(cubin, k, "sm_90a") == [], (k["function"], k["constexprs"])
            ops = tensor_core_ops(opcodes)
            assert ops == k["tensor_core_ops"]
            big = k["constexprs"]["BLOCK_M"] >= 64
            kind = (i, k["function"], big, k["constexprs"].get("SPLIT_K", 1) > 1)
            if kind not in kinds:
                kinds.add(kind)
                assert sass.opcodes(cubin) == opcodes, kind
            want = ("QGMMA" if k["function"] == "gemm_fp8_kernel" else "HGMMA") if big else "HMMA"
            assert want in ops, (k["function"], k["constexprs"]["BLOCK_M"], ops)
            if k["constexprs"].get("SPLIT_K", 1) > 1:  # the tile's counter: a gpu-scope atomic after a fence
                split_k_seen.add(k["function"])
                assert opcodes["ATOMG"] and opcodes["MEMBAR"], dict(opcodes)
        # the decode tiles of the K = 128 down_proj (one 16 x 64 tile) split K: 4 groups (w4k:
        # sub-blocks) of 32, or 2 blocks of 64
        assert main in split_k_seen


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fp8"])
def test_quantized_kv_cache_cubins_pass_the_checks(kind, tmp_path, kernel_cache):
    """--kv-cache-dtype fp8: the cache-writing and attention cubins (codes and scales) pass
    the checks, spill nothing, and the prefill attention keeps its HGMMA dots (int8 differs
    only in the code conversion; its cubins are compiled and launched in the fake-driver
    test of tests/cuda_executor)."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig
    from conftest import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint("llama-untied", tmp_path / "hf")
    path = build_engine(ckpt, tmp_path / "e", BuildConfig(target="cuda", dtype="bfloat16", kv_cache_dtype=kind,
                                                          max_seq_len=128)) / "rank0.engine"
    _, _, header, data_offset = read_rank_header(path)
    data = path.read_bytes()
    blobs = {t["name"]: data[data_offset + t["offset"]: data_offset + t["offset"] + t["nbytes"]]
             for t in header["tensors"] if t["name"].startswith("cubin/")}
    kernels = [k for k in header["kernels"] if k["function"].startswith(("attention", "rope_kv_write"))]
    assert {k["function"] for k in kernels} >= {"attention_prefill_kernel", "attention_decode_kernel",
                                               "rope_kv_write_kernel"}
    for k in kernels:
        assert k["constexprs"].get("KV_CODES", 1 if kind == "int8" else 2) == (1 if kind == "int8" else 2)
        assert check_kernel(blobs[k["cubin"]], k, "sm_90a") == [], (k["function"], k["constexprs"])
        if k["function"] == "attention_prefill_kernel":
            assert "HGMMA" in k["tensor_core_ops"], k["tensor_core_ops"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt-oss", "qwen2-moe"])
def test_moe_and_attention_sinks_cubins_pass_the_checks(kind, tiny_checkpoint, tmp_path, kernel_cache):
    """The mixture-of-experts families for --target cuda: every cubin (routing, expert gate/up
    and down, Qwen2-MoE's shared-expert gate, gpt-oss's attention with sinks and its windowed
    layers) passes the checks and spills nothing."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    path = build_engine(tiny_checkpoint(kind), tmp_path / "e", BuildConfig(target="cuda", dtype="bfloat16",
                                                                           max_seq_len=128)) / "rank0.engine"
    _, _, header, data_offset = read_rank_header(path)
    data = path.read_bytes()
    blobs = {t["name"]: data[data_offset + t["offset"]: data_offset + t["offset"] + t["nbytes"]]
             for t in header["tensors"] if t["name"].startswith("cubin/")}
    functions = {k["function"] for k in header["kernels"]}
    assert {"moe_route_kernel", "moe_gate_up_kernel", "moe_down_kernel"} <= functions
    if kind == "gpt-oss":
        assert any(k["constexprs"].get("HAS_SINKS") for k in header["kernels"])
    else:
        assert "sigmoid_gate_mul_kernel" in functions
    for k in header["kernels"]:
        assert check_kernel(blobs[k["cubin"]], k, "sm_90a") == [], (k["function"], k["constexprs"])
