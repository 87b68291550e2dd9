"""The cuda target behind the Target interface (targets/__init__.py): what the builder and
the runtime ask of it, delegated to the modules that do the work (lower.py, build.py for
the kernel section, executor.py)."""

from __future__ import annotations

from bessemer.errors import InvalidOptionError
from bessemer.targets import KernelSection, LoweredRank, OpenedExecutor, RunOptions, Target
from bessemer.targets.cuda import kernel_table

# activations, weights and KV cache in one 16-bit float type
CUDA_DTYPES = ("bfloat16", "float16")
# --kv-cache-dtype values with one-byte codes and a scale per (token, KV head) (format/kv.py)
CUDA_KV_CODES = ("int8", "fp8")


class CudaTarget(Target):
    name = "cuda"
    KERNELS, QUANT_KERNELS = kernel_table.KERNELS, kernel_table.QUANT_KERNELS

    # ---- builder ----
    def check_build(self, build) -> None:
        from bessemer.targets.cuda.compile import GPU_ARCHS

        if build.dtype not in CUDA_DTYPES:
            raise InvalidOptionError(f"--target cuda runs {' or '.join(CUDA_DTYPES)} kernels, not {build.dtype}; "
                                     "pass --dtype bfloat16")
        if build.kv_cache_dtype not in (None, build.dtype, *CUDA_KV_CODES):
            raise InvalidOptionError(f"--target cuda keeps the KV cache in --dtype ({build.dtype}) or as "
                                     f"{' or '.join(CUDA_KV_CODES)} codes; drop --kv-cache-dtype {build.kv_cache_dtype}")
        if build.resolved_gpu_arch not in GPU_ARCHS:
            raise InvalidOptionError(f"--gpu-arch {build.gpu_arch!r} is not supported; use one of {', '.join(GPU_ARCHS)}")
        super().check_build(build)  # quantized formats without a kernel here (kernel_table.py)
        if build.quant is not None and build.quant.fp8_act_group:
            raise InvalidOptionError("--target cuda's fp8 kernel has no per-group activation scales; "
                                     "drop --fp8-act-group (or build for --target cpu)")
        if build.tp_size != 1:
            raise InvalidOptionError("--target cuda builds one rank for now; drop --tp")

    def lower(self, graph, build, kv_cache: dict) -> LoweredRank:
        from bessemer.targets.cuda.lower import lower_cuda

        plan, specs = lower_cuda(graph, build, kv_cache)
        return LoweredRank(plan.to_json(), tuple(plan.kernels()), tuple(specs),
                           f"{len(plan.forward)} launches, {len(plan.buffers)} buffers", native=plan)

    def kernel_section(self, lowered: LoweredRank, build, say) -> KernelSection:
        from bessemer.targets.cuda.build import rank_kernel_section

        header, entries, report = rank_kernel_section(lowered.native, build.resolved_gpu_arch, say)
        return KernelSection(header, tuple(entries), report)

    def header_fields(self, build) -> dict:
        from bessemer.targets.cuda.build import config_fields

        return config_fields(build.resolved_gpu_arch)

    # ---- runtime ----
    def open_executor(self, engine, options: RunOptions) -> OpenedExecutor:
        """One GPU; the executor sizes the KV cache from the GPU's free memory."""
        if options.interpret:  # no GPU: the same launch list, each kernel run by the Triton interpreter
            from bessemer.targets.cuda.interpret import InterpretedExecutor

            blocks = engine.kv_pool_blocks(options.kv_cache_gib)
            return OpenedExecutor(InterpretedExecutor(engine.dir, blocks, verify_checksum=False))
        from bessemer.targets.cuda.executor import CudaExecutor

        if options.isa != "auto":
            raise InvalidOptionError(f"--isa {options.isa} applies to cpu engines; this engine's target is cuda")
        executor = CudaExecutor(engine, options.device or 0, options.kv_cache_gib, options.gpu_memory_utilization,
                                options.enforce_eager, options.say)
        return OpenedExecutor(executor)


TARGET = CudaTarget()
