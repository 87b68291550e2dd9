"""One kernel-compilation worker: `python -m bessemer.targets.cuda.compile_worker JOBS OUT`.

JOBS is a JSON list of {"index", "spec" (KernelSpec.to_json()), "capability"}; for each
job the worker writes OUT/<index>.cubin and OUT/<index>.json (the kernel's metadata).
compile.py starts it with TRITON_INTERPRET unset, line info off and a private Triton cache.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bessemer.targets.cuda.compile import KernelSpec
from bessemer.targets.cuda.cubin import tensor_core_counts
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


def compile_one(spec: KernelSpec, capability: int) -> tuple[bytes, dict]:
    import triton

    compiled = triton_compile(spec, capability)
    cubin, md = compiled.asm["cubin"], compiled.metadata
    ptxas = ptxas_report(compiled.asm["ptx"], capability, cubin, md.enable_fp_fusion)
    metadata = {
        "entry": md.name, "num_warps": md.num_warps, "num_ctas": md.num_ctas, "shared": md.shared,
        "global_scratch_size": md.global_scratch_size, "global_scratch_align": md.global_scratch_align,
        "profile_scratch_size": md.profile_scratch_size, "profile_scratch_align": md.profile_scratch_align,
        "fp_fusion": bool(md.enable_fp_fusion),
        "launch_pdl": bool(md.launch_pdl), "launch_cooperative_grid": bool(md.launch_cooperative_grid),
        "ptx_version": md.ptx_version, "triton_version": triton.__version__,
        "ptxas_version": ptxas.pop("version"), "ptxas": ptxas,
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(), "cubin_bytes": len(cubin),
        "tensor_core_ops": tensor_core_counts(cubin),
    }
    return cubin, metadata


_PTXAS_LINES = {
    "stack_frame_bytes": r"(\d+) bytes stack frame",
    "spill_store_bytes": r"(\d+) bytes spill stores",
    "spill_load_bytes": r"(\d+) bytes spill loads",
    "registers": r"Used (\d+) registers",
}


def ptxas_report(ptx: str, capability: int, cubin: bytes, fp_fusion: bool = True) -> dict:
    """Registers, spills and stack of the cubin: the same ptxas run on the same PTX with
    Triton's flags (--fmad=false for a kernel compiled without FMA fusion), checked to
    produce the very same cubin bytes."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    ptxas = get_ptxas(capability).path
    with tempfile.TemporaryDirectory() as d:
        src, out = Path(d) / "k.ptx", Path(d) / "k.cubin"
        src.write_text(ptx)
        fmad = [] if fp_fusion else ["--fmad=false"]
        run = subprocess.run([ptxas, "-lineinfo", "-suppress-debug-info", *fmad, "-v",
                              f"--gpu-name={sm_arch_from_capability(capability)}", str(src), "-o", str(out)],
                             capture_output=True, text=True, check=True)
        if out.read_bytes() != cubin:
            raise RuntimeError("ptxas gave a different cubin than Triton's for the same PTX, so its report "
                               "would not describe the stored cubin")
    version = subprocess.run([ptxas, "--version"], capture_output=True, text=True, check=True).stdout
    report = {k: int(m.group(1)) if (m := re.search(p, run.stderr)) else 0 for k, p in _PTXAS_LINES.items()}
    release = re.search(r"release [\d.]+, (V[\d.]+)", version)
    report["version"] = release.group(1) if release else version.strip().splitlines()[-1]
    return report


def main(jobs_path: str, out_dir: str) -> None:
    for job in json.loads(Path(jobs_path).read_text()):
        cubin, metadata = compile_one(KernelSpec.from_json(job["spec"]), job["capability"])
        (Path(out_dir) / f"{job['index']}.cubin").write_bytes(cubin)
        (Path(out_dir) / f"{job['index']}.json").write_text(json.dumps(metadata))


if __name__ == "__main__":
    main(*sys.argv[1:])
