"""The cpu target: x86-64 with AVX2+FMA as the baseline and AVX-512 / VNNI / BF16 fast
paths chosen at run time; weights pre-packed at build time for the kernels.

    kernel_table.py  the ops it runs and the kernel reading each stored quantized format
    lowering.py   storage layouts and kernel choice (builder side)
    executor.py   the C++ executor behind the runtime's Executor protocol
    parallel/     tensor parallelism: a --tp N engine as N processes, one per rank
    csrc/         the C++ executor, its pybind11 bindings (bessemer._C) and the
                  tensor-parallel communicator; csrc/kernels/ the kernels
"""

from __future__ import annotations

import os

from bessemer.errors import EngineLoadError, InvalidOptionError
from bessemer.targets import LoweredRank, OpenedExecutor, RunOptions, Target
from bessemer.targets.cpu import kernel_table
from bessemer.targets.cpu.executor import CpuExecutor

ISA_BASELINE = "avx2"
# more threads than this per core only adds contention (and 10000 threads exhaust the process)
MAX_THREADS_PER_CORE = 8
# ISA name -> cpu_features() flags it needs
ISA_FEATURES = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl")}


def native():
    """bessemer._C, or one line saying how to build it."""
    try:
        from bessemer import _C
    except ImportError as e:
        raise EngineLoadError(f"the Bessemer C++ runtime is not built ({e}); run `make install`") from None
    return _C


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class CpuTarget(Target):
    name = "cpu"
    KERNELS, QUANT_KERNELS = kernel_table.KERNELS, kernel_table.QUANT_KERNELS

    def check_build(self, build) -> None:
        super().check_build(build)
        if build.gpu_arch is not None:
            raise InvalidOptionError("--gpu-arch applies to --target cuda only; drop it or add --target cuda")
        if build.dtype == "float16" or build.kv_cache_dtype == "float16":
            raise InvalidOptionError("float16 is a --target cuda dtype; the cpu target stores float32 or bfloat16")

    def lower(self, graph, build, kv_cache: dict) -> LoweredRank:
        from bessemer.targets.cpu.lowering import lower

        plan, specs = lower(graph, build, kv_cache)
        return LoweredRank(plan.to_json(), tuple(plan.kernels()), tuple(specs),
                           f"{len(plan.steps)} kernel calls, {len(plan.buffers)} buffers")

    def header_fields(self, build) -> dict:
        return {"isa_baseline": ISA_BASELINE}

    def check_runnable(self, config: dict) -> None:
        isa = config.get("isa_baseline", ISA_BASELINE)
        features = native().cpu_features()
        missing = [f for f in ISA_FEATURES.get(isa, ()) if not features.get(f)]
        if missing:
            raise EngineLoadError(f"engine needs CPU features {isa} ({', '.join(missing)} missing on this CPU); "
                                  "run it on an x86-64 CPU with AVX2 and FMA")

    def open_executor(self, engine, options: RunOptions) -> OpenedExecutor:
        """One process (or one per rank of a --tp engine: parallel/group_executor.py), the KV
        pool sized by Engine.kv_pool_blocks."""
        from bessemer.format.kv import blocks_needed

        if (options.device is not None or options.gpu_memory_utilization is not None or options.enforce_eager
                or options.interpret):
            raise InvalidOptionError("--device, --gpu-memory-utilization, --enforce-eager and interpret apply to "
                                     "cuda engines; this engine's target is cpu")
        build = engine.build
        tp_size = int(engine.config.get("mapping", {}).get("tp_size", 1))
        block_size, max_seq_len = int(build["kv_block_size"]), int(build["max_seq_len"])
        cores = _default_threads()
        if options.num_threads is not None and not 0 < options.num_threads <= MAX_THREADS_PER_CORE * cores:
            raise InvalidOptionError(f"--threads {options.num_threads} is not a thread count for this machine's {cores} "
                                     f"cores; use 1 to {MAX_THREADS_PER_CORE * cores} (default: the cores / ranks)")
        threads = options.num_threads or max(1, cores // tp_size)
        blocks = engine.kv_pool_blocks(options.kv_cache_gib)
        if tp_size > 1:
            from bessemer.targets.cpu.parallel import group_executor

            executor = group_executor.start(engine, threads, blocks, options.isa, options.tp_timeout_s,
                                            options.verify_checksum, max_blocks=blocks_needed(max_seq_len, block_size))
        else:
            executor = self.create_executor(engine, threads, blocks, options.isa)
        return OpenedExecutor(executor)

    def create_executor(self, engine, num_threads: int, num_kv_blocks: int, isa: str = "auto") -> CpuExecutor:
        """The executor of one rank file (of a tensor-parallel group, or a draft engine's)."""
        _C = native()
        try:
            file = _C.EngineFile(str(engine.rank_path))
            return CpuExecutor(_C.Executor(file, num_threads, int(engine.build["kv_block_size"]), num_kv_blocks, isa))
        except ValueError as e:
            raise EngineLoadError(str(e)) from None


TARGET = CpuTarget()
