"""The fake libcuda.so.1 (compiled with g++ from fake_libcuda.cpp, once per session), its call
log, and a small real sm_90a cubin: the fixtures of the cuda executor tests without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CSRC = REPO / "bessemer" / "targets" / "cuda" / "csrc"


@pytest.fixture(scope="session")
def fake_libcuda(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake-driver") / "libcuda.so.1"
    subprocess.run(["g++", "-std=c++17", "-O1", "-shared", "-fPIC", "-Wall", "-Werror", f"-I{CSRC}",
                    str(HERE / "fake_libcuda.cpp"), "-o", str(out)], check=True)
    return out


class FakeCuda:
    """The environment that selects the fake driver, and what it recorded."""

    def __init__(self, library: Path, log: Path, monkeypatch):
        self.library, self.log, self._mp = library, log, monkeypatch
        monkeypatch.setenv("BESSEMER_LIBCUDA", str(library))
        monkeypatch.setenv("BESSEMER_FAKE_CUDA_LOG", str(log))

    def set(self, **config) -> None:
        """BESSEMER_FAKE_CUDA_<NAME>=value (devices, cc, memory_mib, version, param_override,
        fail_launch, fault_launch, graph_mib: see fake_libcuda.cpp)."""
        for k, v in config.items():
            self._mp.setenv(f"BESSEMER_FAKE_CUDA_{k.upper()}", str(v))

    def records(self, fn: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        rows = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [r for r in rows if fn is None or r["fn"] == fn]

    def clear(self) -> None:
        self.log.write_text("")


@pytest.fixture
def fake_cuda(fake_libcuda, tmp_path, monkeypatch) -> FakeCuda:
    return FakeCuda(fake_libcuda, tmp_path / "calls.jsonl", monkeypatch)


def cuda_header_dir() -> Path | None:
    """The include directory of the cuda.h that Triton's wheel ships (None without Triton)."""
    import importlib.util

    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return None
    include = Path(spec.origin).parent / "backends" / "nvidia" / "include"
    return include if (include / "cuda.h").exists() else None


@pytest.fixture(scope="session")
def tiny_cubin(tmp_path_factory):
    """(cubin bytes, metadata) of a row-scaling kernel compiled for sm_90a."""
    if cuda_header_dir() is None:
        pytest.skip("Triton (pip install 'bessemer[cuda]') is needed to compile a cubin")
    out = tmp_path_factory.mktemp("cubin") / "scale_rows"
    subprocess.run([sys.executable, str(HERE / "compile_tiny_kernel.py"), str(out)], check=True,
                   env={**os.environ, "TRITON_CACHE_DIR": str(out.parent / "triton-cache")})
    return out.with_suffix(".cubin").read_bytes(), json.loads(out.with_suffix(".json").read_text())
