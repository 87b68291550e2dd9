"""What a cuda build adds to the generic build (builder/build.py): the lowering, the
compiled kernel section of each rank file, and the target's fields of config.json."""

from __future__ import annotations

from typing import Callable

from bessemer.format import container as fmt
from bessemer.targets.cuda.compile import GPU_ARCHS, compile_kernels, default_cache_dir, triton_version
from bessemer.targets.cuda.lower import lower_cuda
from bessemer.targets.cuda.plan import CudaPlan, kernel_entry

__all__ = ["lower_cuda", "rank_kernel_section", "config_fields"]


def rank_kernel_section(plan: CudaPlan, gpu_arch: str, say: Callable[[str], None]) -> tuple[dict, list, dict]:
    """Compiles the plan's kernels. Returns (header fields, cubin tensor entries, report):
    header "plan" (with kernel ids), "kernels" and "gpu_arch"; one uint8 tensor per
    distinct cubin, after the weights."""
    arch = GPU_ARCHS[gpu_arch][1]
    specs = plan.kernel_specs()
    kernels, report = compile_kernels(specs, gpu_arch, default_cache_dir(), say)
    entries, blobs = [], {}
    for i, (spec, kernel) in enumerate(zip(specs, kernels)):
        entries.append(kernel_entry(i, spec, kernel.metadata, arch))
        blobs.setdefault(entries[-1]["cubin"], kernel.cubin)
    tensors = [fmt.TensorEntry(name, "uint8", "row_major", (len(blob),), lambda blob=blob: blob)
               for name, blob in blobs.items()]
    say(f"kernels: {report.distinct} distinct for {arch}, {report.compiled} compiled "
        f"({report.cached} from the kernel cache) in {report.seconds:.1f}s")
    header = {"gpu_arch": arch, "plan": plan.to_json({s: i for i, s in enumerate(specs)}), "kernels": entries}
    summary = dict(report.to_json(), kernels=[_kernel_summary(e) for e in entries])
    return header, tensors, summary


def _kernel_summary(entry: dict) -> dict:
    return {"id": entry["id"], "function": entry["function"], "registers": entry["ptxas"]["registers"],
            "shared": entry["shared"], "spill_bytes": entry["ptxas"]["spill_store_bytes"],
            "tensor_core_ops": entry["tensor_core_ops"]}


def config_fields(gpu_arch: str) -> dict:
    """config.json fields of a cuda engine: what the runtime checks before loading it."""
    return {"gpu_arch": GPU_ARCHS[gpu_arch][1], "triton_version": triton_version()}
