"""Targets: what one kind of hardware needs, behind one small interface the builder and
the runtime ask. A target is a folder (`targets/<name>/`: its lowering choices, kernels and
executor) plus one line in TARGETS below; models, graph, passes, the op set and its
references, the engine contract (format/), scheduler, block manager, sampler and server
are shared by every target.

What the builder asks a target (builder/config.py, builder/build.py):
    check_build(build)             -> raises InvalidOptionError, one line, for options this
                                      target cannot build (called when a BuildConfig is made)
    lower(graph, build, kv_cache)  -> LoweredRank: the per-target plan (its JSON and the
                                      kernels it calls) and the tensors to store, each with
                                      its dtype, layout and the stored format's part
    kernel_section(lowered, build, say) -> KernelSection or None: kernels compiled into
                                      the rank file (cuda: cubins), with their header fields
    header_fields(build)           -> extra fields of config.json and every rank header
                                      (cpu: the ISA baseline; cuda: GPU arch, compiler)
What the runtime asks it (runtime/engine.py, runtime/llm_engine.py):
    check_runnable(config)         -> raises EngineLoadError, one line naming the engine's
                                      requirement and this machine, if it cannot run here
    open_executor(engine, options) -> OpenedExecutor: the executor (step(StepBatch) ->
                                      logits [L, V] float32), its KV blocks and threads
    kv_bytes_per_token(header)     -> KV-cache bytes per token slot (sizes the cache)

Targets are imported only when asked for, so a target whose toolchain is missing never
breaks another.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from dataclasses import dataclass

from bessemer.format.kv import section_bytes_per_token

# name -> module whose TARGET is the Target (imported on first use)
TARGETS = {"cpu": "bessemer.targets.cpu", "cuda": "bessemer.targets.cuda"}


@dataclass(frozen=True)
class LoweredRank:
    """One rank as a target lowers it: `plan` is stored under the rank header's "plan"."""

    plan: dict  # the per-target plan, JSON-ready (format/plan.py for the cpu target)
    kernels: tuple[str, ...]  # "op@version" it calls, sorted (config.json "plugins")
    tensors: tuple  # builder.lower.TensorSpec, in file order
    summary: str  # one line for the build log: "123 kernel calls, 9 buffers"
    native: object = None  # the target's own plan object, for its kernel_section


@dataclass(frozen=True)
class KernelSection:
    """Kernels a target compiles into a rank file, after the weights."""

    header: dict  # rank-header fields it sets (they replace the same keys)
    entries: tuple  # format.container.TensorEntry, one per stored kernel binary
    report: dict  # for build_report.json: what was compiled, how long, resources


@dataclass(frozen=True)
class RunOptions:
    """How a loaded engine should run; each target uses the fields that concern it and
    refuses, with one line, the ones that do not apply to it when they are given."""

    num_threads: int | None = None  # cpu: threads per rank (None: the cores / ranks)
    kv_cache_gib: float | None = None  # KV-cache budget (None: the target's default)
    isa: str = "auto"  # cpu: force a kernel ISA
    tp_timeout_s: float = 30.0  # tensor parallelism: how long a rank waits for a peer
    verify_checksum: bool = True
    device: int | None = None  # cuda: GPU ordinal
    gpu_memory_utilization: float | None = None  # cuda: share of GPU memory for the engine
    enforce_eager: bool = False  # cuda: no CUDA graphs
    interpret: bool = False  # cuda: run the launch list on CPU through the Triton interpreter (tests, debugging)
    say: object = None  # Callable[[str], None] | None: load progress


@dataclass(frozen=True)
class OpenedExecutor:
    executor: object
    num_kv_blocks: int
    num_threads: int


class Target(ABC):
    name: str

    # ---- builder ----
    def has_kernel(self, op: str) -> bool:
        """Whether this target runs op `op` (plugins/ops.py); a graph with an op it lacks is
        refused before anything is built. By default: the op's declared `targets`."""
        from bessemer.plugins.ops import OPS

        return self.name in OPS[op].targets

    def check_build(self, build) -> None:
        """Raises InvalidOptionError when this target cannot build with these options."""

    @abstractmethod
    def lower(self, graph, build, kv_cache: dict) -> LoweredRank:
        """A verified graph of one rank -> its plan and stored tensors. kv_cache: the plan's
        kv_cache section (format/kv.py)."""

    def kernel_section(self, lowered: LoweredRank, build, say) -> KernelSection | None:
        """Kernels compiled into the rank file; None for a target whose kernels are in
        its runtime."""
        return None

    def header_fields(self, build) -> dict:
        """Fields this target adds to config.json and to every rank header."""
        return {}

    # ---- runtime ----
    def check_runnable(self, config: dict) -> None:
        """Raises EngineLoadError when this machine cannot run the engine."""

    @abstractmethod
    def open_executor(self, engine, options: RunOptions) -> OpenedExecutor:
        """The executor of `engine` (runtime.engine.Engine) with its KV cache sized."""

    def kv_bytes_per_token(self, header: dict) -> int:
        return section_bytes_per_token(header["plan"]["kv_cache"])


def target_names() -> tuple[str, ...]:
    return tuple(TARGETS)


def get_target(name: str) -> Target:
    """The Target called `name`; ValueError naming the known ones otherwise."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
    return importlib.import_module(TARGETS[name]).TARGET
