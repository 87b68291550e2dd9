"""One kernel-compilation worker: `python -m bessemer.targets.cuda.compile_worker JOBS OUT`.

JOBS is a JSON list of {"index", "spec" (KernelSpec.to_json()), "capability"}; for each
job the worker writes OUT/<index>.cubin and OUT/<index>.json (the kernel's metadata).
compile.py starts it with TRITON_INTERPRET unset, line info off and a private Triton cache.
Per kernel, ptxas runs once (inside triton.compile): its -v log gives the metadata's
registers, spills and stack frame. The tensor-core ops come from one disassembly of all
the worker's cubins, after the last is compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

from bessemer.targets.cuda.compile import KernelSpec
from bessemer.targets.cuda.cubin import read_cubin, sass_opcodes_of, tensor_core_ops
from bessemer.targets.cuda.kernels import fp_fusion


def triton_compile(spec: KernelSpec, capability: int, enable_fp_fusion: bool | None = None):
    """Triton's compiled kernel of `spec` (asm: "ptx", "cubin", ...); enable_fp_fusion None:
    the kernel's own setting (kernels/__init__.py's UNFUSED_KERNELS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if enable_fp_fusion is None:
        enable_fp_fusion = fp_fusion(spec.module, spec.function)
    fn = getattr(importlib.import_module(spec.module), spec.function)
    types, constexprs = dict(spec.params), dict(spec.constexprs)
    runtime = [n for n in fn.arg_names if n not in constexprs]
    if runtime != [n for n, _ in spec.params] or set(constexprs) - set(fn.arg_names):
        raise ValueError(f"{spec.function}: spec parameters {[n for n, _ in spec.params]} + constexprs "
                         f"{sorted(constexprs)} do not match the kernel's {fn.arg_names}")
    signature = {n: types.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec.aligned}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": spec.num_warps, "num_stages": spec.num_stages,
                                   "enable_fp_fusion": enable_fp_fusion})


def compile_with_ptxas_log(spec: KernelSpec, capability: int):
    """(Triton's compiled kernel of `spec`, the -v log of the ptxas run that made its cubin).
    Triton prints that log to stdout when knobs.nvidia.dump_ptxas_log is set; always_compile
    keeps a hit in Triton's cache from skipping the run (and the log)."""
    from triton import knobs

    log = io.StringIO()
    with knobs.nvidia.scope(), knobs.compilation.scope():
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        try:
            with contextlib.redirect_stdout(log):
                compiled = triton_compile(spec, capability)
        except BaseException:
            sys.stdout.write(log.getvalue())  # what Triton printed about the failure (ptxas's log, the PTX)
            raise
    return compiled, log.getvalue()


def compile_one(spec: KernelSpec, capability: int, ptxas_version: str) -> tuple[bytes, dict]:
    """The cubin and its metadata, but for "tensor_core_ops" (main() reads every cubin's SASS
    in one run)."""
    import triton

    compiled, log = compile_with_ptxas_log(spec, capability)
    cubin, md = compiled.asm["cubin"], compiled.metadata
    metadata = {
        "entry": md.name, "num_warps": md.num_warps, "num_ctas": md.num_ctas, "shared": md.shared,
        "global_scratch_size": md.global_scratch_size, "global_scratch_align": md.global_scratch_align,
        "profile_scratch_size": md.profile_scratch_size, "profile_scratch_align": md.profile_scratch_align,
        "fp_fusion": bool(md.enable_fp_fusion),
        "launch_pdl": bool(md.launch_pdl), "launch_cooperative_grid": bool(md.launch_cooperative_grid),
        "ptx_version": md.ptx_version, "triton_version": triton.__version__,
        "ptxas_version": ptxas_version, "ptxas": ptxas_report(log, cubin),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "cubin_bytes": len(cubin),
    }
    return cubin, metadata


_PTXAS_LINES = {
    "stack_frame_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
    "registers": r"Used (\d+) registers",
}


def ptxas_report(log: str, cubin: bytes) -> dict:
    """Registers, spills and stack of the cubin from the -v log of the ptxas run that made
    it; the registers and stack frame it states are checked against the cubin's own
    (.nv.info), so a log of another run cannot pass for this cubin's."""
    if not re.search(_PTXAS_LINES["registers"], log):
        raise RuntimeError(f"no ptxas -v report in what Triton printed while compiling: {log[-500:]!r}")
    report = {k: int(m.group(1)) if (m := re.search(p, log)) else 0 for k, p in _PTXAS_LINES.items()}
    info = read_cubin(cubin)
    if (info.registers, info.frame_bytes) != (report["registers"], report["stack_frame_bytes"]):
        raise RuntimeError(f"{info.entry}: ptxas reported {report['registers']} registers and a "
                           f"{report['stack_frame_bytes']}-byte stack frame, the cubin holds "
                           f"{info.registers} and {info.frame_bytes}")
    return report


def ptxas_version(capability: int) -> str:
    """The release of the ptxas Triton compiles with for `capability`, e.g. "V12.8.93"."""
    from triton.backends.nvidia.compiler import get_ptxas

    version = subprocess.run([get_ptxas(capability).path, "--version"], capture_output=True, text=True,
                             check=True).stdout
    release = re.search(r"release [\d.]+, (V[\d.]+)", version)
    return release.group(1) if release else version.strip().splitlines()[-1]


def main(jobs_path: str, out_dir: str) -> None:
    jobs = json.loads(Path(jobs_path).read_text())
    versions: dict[int, str] = {}  # one ptxas --version per capability, not per kernel
    compiled = []
    for job in jobs:
        capability = job["capability"]
        if capability not in versions:
            versions[capability] = ptxas_version(capability)
        compiled.append(compile_one(KernelSpec.from_json(job["spec"]), capability, versions[capability]))
    for job, (cubin, metadata), ops in zip(jobs, compiled, sass_opcodes_of([cubin for cubin, _ in compiled])):
        metadata["tensor_core_ops"] = tensor_core_ops(ops)
        (Path(out_dir) / f"{job['index']}.cubin").write_bytes(cubin)
        (Path(out_dir) / f"{job['index']}.json").write_text(json.dumps(metadata))


if __name__ == "__main__":
    main(*sys.argv[1:])
