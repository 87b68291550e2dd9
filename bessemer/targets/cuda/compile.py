"""Ahead-of-time compilation of kernel specs to cubins: on any machine, no GPU needed.

A KernelSpec names one Triton function and everything that makes its compiled code: the
types of its runtime parameters, its constexpr values, which pointer parameters are
16-byte aligned (tt.divisibility hints), num_warps and num_stages. compile_kernels()
compiles every distinct spec once, in parallel worker processes, through a cache keyed
by a hash of the spec, the kernels' source, the GPU arch and the Triton version.

Workers (compile_worker.py) are subprocesses started without TRITON_INTERPRET
(triton.compile fails under the interpreter, whose setting is read when a kernel module
is imported), with line info off (cubins ~3x smaller) and a private Triton cache, so
this cache is the only one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from bessemer.errors import BessemerError

KERNELS_DIR = Path(__file__).resolve().parent / "kernels"
# --gpu-arch -> (compute capability, the arch the cubins are built for)
GPU_ARCHS = {"sm_90": (90, "sm_90a")}
SCRATCH_PARAMS = ("global_scratch", "profile_scratch")  # Triton appends these two pointers
TYPE_SIZES = {"i32": 4, "fp32": 4, "i64": 8}  # every pointer ("*...") is 8 bytes
CACHE_ENV = "BESSEMER_KERNEL_CACHE"
# A worker process costs ~3 CPU-s before and after its kernels (Python and Triton start-up,
# the backend's first compile, one disassembly of its cubins: measured on 2 cores, 26
# kernels took 12.6 CPU-s in one worker and 15.5 in two) against ~0.5 s a kernel: a worker
# is started for every KERNELS_PER_WORKER kernels at most, so that a build that finds
# most of its kernels cached does not pay a process for one or two.
KERNELS_PER_WORKER = 6


def check_gpu_arch(engine_arch: str, device_arch: str) -> None:
    """The runtime's arch check: sm_90a cubins run on compute capability 9.0 only."""
    from bessemer.errors import EngineLoadError

    if engine_arch != device_arch:
        built = next((flag for flag, (_, arch) in GPU_ARCHS.items() if arch == device_arch), None)
        fix = f"rebuild with --gpu-arch {built}" if built else "no --gpu-arch targets this GPU yet"
        raise EngineLoadError(f"engine kernels are built for {engine_arch}, this GPU is {device_arch}; {fix}")


def cuda_install_hint() -> str:
    return "pip install 'bessemer[cuda]' (triton==3.6.0)"


def triton_version() -> str:
    try:
        import triton
    except ImportError:
        raise BessemerError(f"--target cuda needs Triton to compile its kernels; {cuda_install_hint()}") from None
    return triton.__version__


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel. params: the function's runtime (non-constexpr) parameters in
    order as (name, Triton type: "*bf16", "*fp32", "*i32", "i32", "fp32", ...)."""

    module: str  # e.g. "bessemer.targets.cuda.kernels.gemm"
    function: str
    params: tuple[tuple[str, str], ...]
    constexprs: tuple[tuple[str, object], ...]  # sorted (name, value)
    aligned: tuple[str, ...] = ()  # pointer params hinted 16-byte aligned
    num_warps: int = 4
    num_stages: int = 2

    @staticmethod
    def make(module: str, function: str, params: list[tuple[str, str]], constexprs: dict,
             aligned=(), num_warps: int = 4, num_stages: int = 2) -> "KernelSpec":
        return KernelSpec(module, function, tuple(params), tuple(sorted(constexprs.items())),
                          tuple(sorted(aligned)), num_warps, num_stages)

    def to_json(self) -> dict:
        return {"module": self.module, "function": self.function,
                "params": [list(p) for p in self.params], "constexprs": dict(self.constexprs),
                "aligned": list(self.aligned), "options": {"num_warps": self.num_warps, "num_stages": self.num_stages}}

    @staticmethod
    def from_json(d: dict) -> "KernelSpec":
        return KernelSpec.make(d["module"], d["function"], [tuple(p) for p in d["params"]], d["constexprs"],
                               d["aligned"], d["options"]["num_warps"], d["options"]["num_stages"])

    def param_table(self) -> list[dict]:
        """The cubin's parameter list as the launcher packs it: the runtime params, then
        Triton's two scratch pointers; natural alignment, 8-byte pointers."""
        table, offset = [], 0
        for name, ty in list(self.params) + [(p, "*u8") for p in SCRATCH_PARAMS]:
            size = 8 if ty.startswith("*") else TYPE_SIZES[ty]
            offset = -(-offset // size) * size
            table.append({"name": name, "type": ty, "offset": offset, "size": size,
                          "divisibility": 16 if name in self.aligned else 1})
            offset += size
        return table


def source_hash() -> str:
    """sha256 of every kernel source file: any edit invalidates every cached cubin."""
    digest = hashlib.sha256()
    for path in sorted(KERNELS_DIR.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_key(spec: KernelSpec, arch: str, version: str, sources: str) -> str:
    text = json.dumps({"spec": spec.to_json(), "arch": arch, "triton": version, "sources": sources},
                      sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def default_cache_dir() -> Path | None:
    """BESSEMER_KERNEL_CACHE (a directory, or "off"), else ~/.cache/bessemer/kernels."""
    value = os.environ.get(CACHE_ENV)
    if value == "off":
        return None
    return Path(value) if value else Path.home() / ".cache" / "bessemer" / "kernels"


@dataclass
class CompiledKernel:
    cubin: bytes
    metadata: dict  # what the launcher needs and what inspect shows (see plan.py)


@dataclass
class CompileReport:
    distinct: int = 0
    compiled: int = 0
    cached: int = 0
    workers: int = 0
    seconds: float = 0.0
    keys: list = field(default_factory=list)

    def to_json(self) -> dict:
        return {"distinct": self.distinct, "compiled": self.compiled, "from_cache": self.cached,
                "workers": self.workers, "seconds": round(self.seconds, 3)}


def _read_cache(cache: Path | None, key: str) -> CompiledKernel | None:
    if cache is None:
        return None
    meta_path, cubin_path = cache / f"{key}.json", cache / f"{key}.cubin"
    try:
        metadata = json.loads(meta_path.read_text())
        cubin = cubin_path.read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != metadata.get("cubin_sha256"):
        return None  # a torn or foreign entry: compile again
    return CompiledKernel(cubin, metadata)


def _write_cache(cache: Path | None, key: str, kernel: CompiledKernel) -> None:
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    for suffix, data in ((".cubin", kernel.cubin), (".json", json.dumps(kernel.metadata, sort_keys=True).encode())):
        fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{key}")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, cache / f"{key}{suffix}")


def compile_kernels(specs: list[KernelSpec], gpu_arch: str, cache: Path | None = None,
                    say: Callable[[str], None] = lambda m: None) -> tuple[list[CompiledKernel], CompileReport]:
    """Compiles each distinct spec once; returns the kernels in `specs` order."""
    t0 = time.perf_counter()
    version = triton_version()
    capability, arch = GPU_ARCHS[gpu_arch]
    sources = source_hash()
    keys = [cache_key(s, arch, version, sources) for s in specs]
    done: dict[str, CompiledKernel] = {}
    for key in dict.fromkeys(keys):
        hit = _read_cache(cache, key)
        if hit is not None:
            done[key] = hit
    todo = {k: s for k, s in zip(keys, specs) if k not in done}
    report = CompileReport(distinct=len(set(keys)), cached=len(done), compiled=len(todo))
    if todo:
        report.workers = min(-(-len(todo) // KERNELS_PER_WORKER), _cpu_count())
        say(f"compiling {len(todo)} kernels for {arch} in {report.workers} processes "
            f"({len(done)} from the kernel cache)")
        for key, kernel in zip(todo, _compile_in_workers(list(todo.values()), capability, report.workers)):
            _write_cache(cache, key, kernel)
            done[key] = kernel
    report.seconds = time.perf_counter() - t0
    report.keys = keys
    return [done[k] for k in keys], report


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _compile_in_workers(specs: list[KernelSpec], capability: int, workers: int) -> list[CompiledKernel]:
    """Round-robin shares of the specs, one `python -m ...compile_worker` process each (a
    subprocess rather than multiprocessing: it never re-imports the caller's __main__)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DISABLE_LINE_INFO"] = "1"
    with tempfile.TemporaryDirectory(prefix="bessemer-compile-") as tmp:
        env["TRITON_CACHE_DIR"] = str(Path(tmp) / "triton-cache")
        procs = []
        for w in range(workers):
            jobs = [{"index": i, "spec": s.to_json(), "capability": capability}
                    for i, s in enumerate(specs) if i % workers == w]
            jobs_path = Path(tmp) / f"jobs{w}.json"
            jobs_path.write_text(json.dumps(jobs))
            with open(Path(tmp) / f"worker{w}.log", "w") as log:
                procs.append(subprocess.Popen([sys.executable, "-m", "bessemer.targets.cuda.compile_worker",
                                               str(jobs_path), tmp], env=env, stdout=log, stderr=log))
        failed = [w for w, p in enumerate(procs) if p.wait() != 0]
        if failed:
            log = (Path(tmp) / f"worker{failed[0]}.log").read_text().strip().splitlines() or ["(no output)"]
            raise BessemerError(f"kernel compilation failed: {log[-1]}")
        out = []
        for i in range(len(specs)):
            out.append(CompiledKernel((Path(tmp) / f"{i}.cubin").read_bytes(),
                                      json.loads((Path(tmp) / f"{i}.json").read_text())))
    return out
