"""The cpu target: x86-64 with AVX2+FMA as the baseline and AVX-512 / VNNI / BF16 fast
paths chosen at run time; weights pre-packed at build time for the kernels.

    lowering.py   storage layouts and kernel choice (builder side)
    csrc/         the C++ executor, its pybind11 bindings (bessemer._C) and the
                  tensor-parallel communicator; csrc/kernels/ the kernels
"""

from __future__ import annotations

from bessemer.errors import EngineLoadError
from bessemer.targets import LoweredRank, Target

ISA_BASELINE = "avx2"
# ISA name -> cpu_features() flags it needs
ISA_FEATURES = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl")}


def native():
    """bessemer._C, or one line saying how to build it."""
    try:
        from bessemer import _C
    except ImportError as e:
        raise EngineLoadError(f"the Bessemer C++ runtime is not built ({e}); run `make install`") from None
    return _C


class CpuTarget(Target):
    name = "cpu"

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

    def create_executor(self, engine, num_threads: int, num_kv_blocks: int, isa: str = "auto"):
        _C = native()
        try:
            file = _C.EngineFile(str(engine.rank_path))
            return _C.Executor(file, num_threads, int(engine.build["kv_block_size"]), num_kv_blocks, isa)
        except ValueError as e:
            raise EngineLoadError(str(e)) from None


TARGET = CpuTarget()
