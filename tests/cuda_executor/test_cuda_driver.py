"""The cuda executor's driver layer without a GPU: the declared API subset against the
official cuda.h (compile-time), the loader's one-line errors (no driver, no GPU, old
driver, wrong compute capability, bad ordinal), `bessemer inspect --device`, and a real
sm_90a cubin loaded, checked and launched through the fake driver."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from fake_driver import CSRC, HERE, cuda_header_dir
# the fake driver's fixtures (imported here, not in a conftest.py: a second module named
# conftest would shadow tests/conftest.py for the tests that import from it)
from fake_driver import fake_cuda, fake_libcuda, tiny_cubin  # noqa: F401

from bessemer.cli.main import main as cli
from bessemer.errors import DeviceError
from bessemer.targets.cuda.device import device_report, native, open_device


def _compile_conformance(api_dir: Path) -> subprocess.CompletedProcess:
    include = cuda_header_dir()
    if include is None:
        pytest.skip("the official cuda.h ships in Triton's wheel: pip install 'bessemer[cuda]'")
    return subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{api_dir}", f"-I{include}",
                           str(HERE / "conformance.cpp")], capture_output=True, text=True)


def test_declared_api_matches_the_official_header():
    run = _compile_conformance(CSRC)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("edit, complaint", [
    (("CUresult(CUdeviceptr*, size_t))", "CUresult(CUdeviceptr*, unsigned int))"), "signature of cuMemAlloc"),
    (("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 77"),
     "value of CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR"),
    (("    unsigned int sharedMemBytes;\n    CUstream hStream;", "    CUstream hStream;\n    unsigned int sharedMemBytes;"),
     "offset of CUlaunchConfig.sharedMemBytes"),
])
def test_conformance_check_catches_a_wrong_declaration(tmp_path, edit, complaint):
    text = (CSRC / "cuda_api.h").read_text()
    assert edit[0] in text
    (tmp_path / "cuda_api.h").write_text(text.replace(edit[0], edit[1], 1))
    run = _compile_conformance(tmp_path)
    assert run.returncode != 0 and complaint in run.stderr


def test_no_driver_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("BESSEMER_LIBCUDA", str(tmp_path / "libcuda.so.1"))
    with pytest.raises(DeviceError, match=r"^no CUDA driver: cannot load .*libcuda\.so\.1.*install the NVIDIA driver"):
        open_device(0)
    result = CliRunner().invoke(cli, ["inspect", "--device"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no CUDA driver")


def test_driver_without_gpu_or_too_old(fake_cuda):
    fake_cuda.set(devices=0)
    with pytest.raises(DeviceError, match=r"found no usable GPU \(cuInit: CUDA_ERROR_NO_DEVICE"):
        open_device(0)
    fake_cuda.set(devices=1, version=12020)
    with pytest.raises(DeviceError, match=r"supports CUDA 12\.2; this runtime needs 12\.4 or newer"):
        open_device(0)


def test_every_function_is_asked_at_the_declared_abi(fake_cuda):
    open_device(0)
    asked = fake_cuda.records("cuGetProcAddress_v2")
    text = (CSRC / "cuda_api.h").read_text()
    declared = re.findall(r'X\(\w+, "(\w+)"', text[text.index("#define BESSEMER_CUDA_FUNCTIONS"):])
    assert len(declared) > 30
    assert sorted(r["symbol"] for r in asked) == sorted(declared)
    assert {r["version"] for r in asked} == {native().DRIVER_ABI_VERSION} == {12040}


def test_wrong_compute_capability_names_both(fake_cuda):
    fake_cuda.set(cc="8.9")
    with pytest.raises(DeviceError, match=r"built for sm_90a \(compute capability 9\.0 exactly\) but GPU 0 "
                                          r"\(.*\) is compute capability 8\.9"):
        open_device(0, "sm_90a")
    fake_cuda.set(cc="9.0", devices=2)
    open_device(1, "sm_90a")
    with pytest.raises(DeviceError, match=r"GPU 2 does not exist: the driver sees 2"):
        open_device(2)


def test_inspect_device_shows_gpu_and_memory(fake_cuda):
    fake_cuda.set(memory_mib=8192, devices=2)
    report = device_report()
    assert [d["ordinal"] for d in report["devices"]] == [0, 1]
    assert report["devices"][0]["total_bytes"] == 8192 << 20
    result = CliRunner().invoke(cli, ["inspect", "--device"])
    assert result.exit_code == 0, result.output
    assert "compute capability 9.0" in result.output and "8.00 GiB total" in result.output
    assert "gpu 1" in result.output and "CUDA 12.8" in result.output


def _launch_bytes(x: int, y: int, rows: int, scale: float) -> bytes:
    # the table: x_ptr@0, y_ptr@8, n_rows@16 (i32), scale@20 (fp32 bits), two scratch pointers
    return struct.pack("<QQif QQ".replace(" ", ""), x, y, rows, scale, 0, 0)


def test_cubin_loads_and_launches_as_triton_packs_it(fake_cuda, tiny_cubin):
    cubin, meta = tiny_cubin
    _cuda = native()
    kernel = _cuda.Kernel(open_device(0, "sm_90a"), cubin, meta)
    assert kernel.block_threads == 32 * meta["num_warps"]
    packed = _launch_bytes(0x1000, 0x2000, 7, 0.5)
    kernel.launch([7, 1, 1], packed)
    kernel.launch([0, 1, 1], packed)  # an empty grid is skipped, as Triton does
    (launch,) = fake_cuda.records("cuLaunchKernelEx")
    assert launch["entry"] == meta["entry"] == "scale_rows"
    assert launch["grid"] == [7, 1, 1] and launch["block"] == [64, 1, 1] and launch["shared"] == meta["shared"]
    # the fake packs by the cubin's own parameter table: the same bytes means the same layout
    assert bytes.fromhex(launch["params"]) == packed
    assert launch["attrs"] == []


def test_parameter_table_mismatch_is_refused(fake_cuda, tiny_cubin):
    cubin, meta = tiny_cubin
    _cuda = native()
    device = open_device(0)
    wrong = {**meta, "params": [dict(p) for p in meta["params"]]}
    wrong["params"][3]["offset"] = 24
    with pytest.raises(ValueError, match=r"kernel scale_rows: parameter 3 \(scale\) is at offset 20 size 4 in the "
                                         r"loaded cubin but offset 24 size 4 in the engine"):
        _cuda.Kernel(device, cubin, wrong)
    with pytest.raises(ValueError, match=r"the cubin has 6 parameters, the engine's metadata 7"):
        _cuda.Kernel(device, cubin, {**meta, "params": meta["params"] + [{**meta["params"][-1], "offset": 40}]})
    with pytest.raises(ValueError, match=r"the cubin has more than the 5 parameters"):
        _cuda.Kernel(device, cubin, {**meta, "params": meta["params"][:5]})
    # and when the driver reports another layout than the stored one
    fake_cuda.set(param_override="scale_rows:2:16:8")
    device = open_device(0)
    with pytest.raises(ValueError, match=r"parameter 2 \(n_rows\) is at offset 16 size 8 in the loaded cubin"):
        _cuda.Kernel(device, cubin, meta)


def test_large_shared_memory_is_opted_in(fake_cuda, tiny_cubin):
    cubin, meta = tiny_cubin
    _cuda = native()
    kernel = _cuda.Kernel(open_device(0), cubin, {**meta, "shared": 96 * 1024})
    (opt_in,) = fake_cuda.records("cuFuncSetAttribute")
    assert opt_in["value"] == 96 * 1024 and opt_in["attr"] == 8  # MAX_DYNAMIC_SHARED_SIZE_BYTES
    kernel.launch([1, 1, 1], _launch_bytes(0, 0, 1, 1.0))
    assert fake_cuda.records("cuLaunchKernelEx")[0]["shared"] == 96 * 1024


def test_cubin_for_another_arch_is_refused_by_the_driver(fake_cuda, tiny_cubin):
    """The executor checks the arch first (test above); the fake driver, like the real one,
    also refuses the cubin itself."""
    cubin, meta = tiny_cubin
    fake_cuda.set(cc="8.0")
    with pytest.raises(native().CudaError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        native().Kernel(open_device(0), cubin, meta)


def test_extension_imports_without_cuda():
    """_cuda links nothing from CUDA: importing it never needs a driver."""
    so = Path(native().__file__)
    deps = subprocess.run(["ldd", str(so)], capture_output=True, text=True).stdout
    assert "libcuda" not in deps and "libcudart" not in deps and "libcublas" not in deps
    if shutil.which("nm"):
        undefined = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True).stdout
        assert " cu" not in undefined.replace(" cuda", "")  # no driver symbol is linked
