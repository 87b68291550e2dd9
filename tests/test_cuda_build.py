"""build-engine --target cuda on this CPU machine: the engine's kernel section, its weights
as the GPU kernels read them, config.json, inspect, determinism, and the refusals."""

import json
import os
import subprocess

import numpy as np
import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

from bessemer.format.container import read_rank_header  # noqa: E402
from bessemer.format.dtypes import bfloat16_bits_to_float32, to_bfloat16_bits  # noqa: E402
from bessemer.targets.cuda.cubin import check_kernel  # noqa: E402


def _rank(engine):
    major, minor, header, data_offset = read_rank_header(engine / "rank0.engine")
    data = (engine / "rank0.engine").read_bytes()
    tensors = {t["name"]: data[data_offset + t["offset"]: data_offset + t["offset"] + t["nbytes"]]
               for t in header["tensors"]}
    return header, tensors


def test_tiny_cuda_engine_holds_checked_cubins_for_every_launch(cuda_engine):
    engine = cuda_engine("qwen2")  # biases: the GEMM's bias variant
    config = json.loads((engine / "config.json").read_text())
    assert (config["target"], config["gpu_arch"], config["triton_version"]) == ("cuda", "sm_90a", "3.6.0")
    assert config["build"]["gpu_arch"] == "sm_90" and "isa_baseline" not in config
    header, tensors = _rank(engine)
    kernels = header["kernels"]
    assert header["target"] == "cuda" and header["gpu_arch"] == "sm_90a"
    for k in kernels:
        assert check_kernel(tensors[k["cubin"]], k, "sm_90a") == [], k["function"]
    with_tc = {k["function"] for k in kernels if k["tensor_core_ops"]}
    assert {"gemm_kernel", "attention_prefill_kernel", "attention_decode_kernel"} <= with_tc
    # every launch names a kernel, and gives one argument per runtime parameter
    plan = header["plan"]
    launches = [c for item in plan["forward"] + plan["sample"] for c in item.get("cases", [item])]
    assert {c["kernel"] for c in launches} == set(range(len(kernels)))
    for c in launches:
        assert len(c["args"]) == len(kernels[c["kernel"]]["params"]) - 2
    report = json.loads((engine / "build_report.json").read_text())["kernels"]
    assert report["distinct"] == len(kernels) and report["compiled"] + report["from_cache"] == len(kernels)


def test_weights_are_stored_as_the_gpu_kernels_read_them(cuda_engine, tiny_checkpoint):
    from safetensors.numpy import load_file

    engine = cuda_engine("qwen2")
    header, tensors = _rank(engine)
    table = {t["name"]: t for t in header["tensors"]}
    hf = load_file(str(tiny_checkpoint("qwen2") / "model.safetensors"))
    name = "model.layers.1.self_attn.qkv_proj.weight"
    fused = np.concatenate([hf[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    assert table[name]["shape"] == list(fused.shape)  # [N, K] row-major, bf16
    stored = bfloat16_bits_to_float32(np.frombuffer(tensors[name], np.uint16)).reshape(fused.shape)
    np.testing.assert_array_equal(stored, bfloat16_bits_to_float32(to_bfloat16_bits(fused)).reshape(fused.shape))
    bias = np.frombuffer(tensors["model.layers.1.self_attn.qkv_proj.bias"], np.float32)
    np.testing.assert_array_equal(bias, np.concatenate([hf[f"model.layers.1.self_attn.{p}_proj.bias"] for p in "qkv"]))


def test_cuda_build_is_byte_identical(tiny_checkpoint, tmp_path):
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    build = BuildConfig(target="cuda", dtype="bfloat16", kv_block_size=4, max_num_tokens=24, max_seq_len=128)
    a = build_engine(tiny_checkpoint("llama-tied"), tmp_path / "a", build)
    b = build_engine(tiny_checkpoint("llama-tied"), tmp_path / "b", build)
    for name in ("rank0.engine", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_cli_builds_inspects_and_refuses_to_run_a_cuda_engine(tiny_checkpoint, tmp_path):
    out = tmp_path / "engine"
    build = subprocess.run(["build-engine", str(tiny_checkpoint("llama-tied")), "--output", str(out),
                            "--target", "cuda", "--max-seq-len", "128", "--kv-block-size", "4",
                            "--max-num-tokens", "24"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    assert "kernels:" in build.stderr and "compiled" in build.stderr  # count and time reported
    assert json.loads((out / "config.json").read_text())["build"]["dtype"] == "bfloat16"  # cuda default
    info = subprocess.run(["bessemer", "inspect", str(out)], capture_output=True, text=True).stdout
    assert "target        cuda, gpu_arch sm_90a, triton_version 3.6.0" in info
    assert "gemm_kernel" in info and "HGMMA" in info and "regs" in info and "spills 0" in info
    # per linear shape: its tiles and parts of K (K of 64 and 88: one part, 16 x 64 decode tiles)
    assert "gemms       5 linear shapes" in info
    assert "64 x 88     x2   K parts  1 | <=16: 16x64x64 4w/3s split 1, 1 programs at 16;" in info
    # the runtime runs cuda engines now (targets/cuda/executor.py): without a driver, one line
    env = dict(os.environ, BESSEMER_LIBCUDA=str(tmp_path / "no-driver" / "libcuda.so.1"))
    run = subprocess.run(["run-engine", str(out), "--prompt", "hi"], capture_output=True, text=True, env=env)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode != 0 and "Traceback" not in run.stderr and len(errors) == 1
    assert "no CUDA driver" in errors[0] and "libcuda.so.1" in errors[0], errors


def test_runtime_arch_check_names_both_archs():
    from bessemer.errors import EngineLoadError
    from bessemer.targets.cuda.compile import check_gpu_arch

    check_gpu_arch("sm_90a", "sm_90a")
    with pytest.raises(EngineLoadError, match=r"built for sm_90a, this GPU is sm_80; no --gpu-arch"):
        check_gpu_arch("sm_90a", "sm_80")


@pytest.mark.parametrize("flags,needle", [
    (["--target", "cuda", "--dtype", "float32"], "pass --dtype bfloat16"),
    (["--target", "cuda", "--quant", "w8a8-sq", "--calib-data", "wikitext2"], "no kernels for --quant w8a8-sq"),
    (["--target", "cuda", "--dtype", "bfloat16", "--kv-cache-dtype", "float32"], "drop --kv-cache-dtype float32"),
    (["--target", "cuda", "--tp", "2"], "drop --tp"),
    (["--target", "cuda", "--quant", "fp8", "--fp8-rounding", "nearest", "--fp8-act-group", "32"],
     "has no per-group activation scales; drop --fp8-act-group"),
    (["--gpu-arch", "sm_90"], "--target cuda only"),
    (["--dtype", "float16"], "float16 is a --target cuda dtype"),
])
def test_bad_cuda_options_give_one_line(flags, needle, tiny_checkpoint, tmp_path):
    proc = subprocess.run(["build-engine", str(tiny_checkpoint("llama-tied")), "--output", str(tmp_path / "e"),
                           *flags], capture_output=True, text=True)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and len(errors) == 1, proc.stderr
    assert needle in errors[0]
    assert not (tmp_path / "e").exists()
