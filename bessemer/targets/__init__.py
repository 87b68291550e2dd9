"""Targets: what one kind of hardware needs, behind one small interface the builder and
the runtime ask. A target is a folder (`targets/<name>/`: its lowering choices, kernels and
executor) plus one line in TARGETS below; models, graph, passes, the op set and its
references, the engine contract (format/), scheduler, block manager, sampler and server
are shared by every target.

What the builder asks a target (builder/config.py, builder/build.py):
    has_kernel(op), quant_kernel(op, format class)
                                   -> from its kernel tables (KERNELS, QUANT_KERNELS in
                                      targets/<name>/kernel_table.py): whether it runs an op,
                                      and its kernel reading a stored quantized format
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
    open_executor(engine, options) -> OpenedExecutor: the executor, with its KV cache sized
    kv_bytes_per_token(header)     -> KV-cache bytes per token slot (sizes the cache)
The executor it opens implements runtime/executor.py's Executor protocol, and the runtime
asks it nothing else (capabilities are declared, never probed):
    step(batch: StepBatch)         -> logits [L, V] float32 of the rows batch.logits_indices
                                      selects (format/step.py)
    info                           -> ExecutorInfo: isa, threads, KV blocks, kernels
    sampler                        -> a DeviceSampler (sample(batch, rows) -> token ids [L],
                                      where the logits are: cuda) or None (the host samples)
    failure()                      -> why it can no longer step (a dead rank), or None
    close()                        -> releases worker processes and the like; idempotent

Targets are imported only when asked for, so a target whose toolchain is missing never
breaks another.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from bessemer.errors import InvalidOptionError
from bessemer.format.kv import section_bytes_per_token
from bessemer.runtime.executor import Executor

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
    """How a loaded engine runs: built once (by LLM's keyword arguments, the CLI or the
    server) and handed down by name. Each target uses the fields that concern it and
    refuses, with one line, the ones that do not apply to it when they are given; the
    engine core (runtime/llm_engine.py) reads the last four."""

    num_threads: int | None = None  # cpu: threads per rank (None: the cores / ranks)
    kv_cache_gib: float | None = None  # KV-cache budget (None: the target's default)
    isa: str = "auto"  # cpu: force a kernel ISA
    tp_timeout_s: float = 30.0  # tensor parallelism: how long a rank waits for a peer inside a step
    verify_checksum: bool = True  # sha256 of every rank file against config.json
    device: int | None = None  # cuda: GPU ordinal (None: 0)
    gpu_memory_utilization: float | None = None  # cuda: share of GPU memory for the engine
    enforce_eager: bool = False  # cuda: no CUDA graphs
    interpret: bool = False  # cuda: run the launch list on CPU through the Triton interpreter (tests, debugging)
    say: object = None  # Callable[[str], None] | None: load progress
    # the engine core's
    seed: int = 0  # seeds a request without its own seed (with its arrival order)
    enable_prefix_caching: bool = True
    speculative: object = None  # SpeculativeConfig | "ngram" | dict | None (runtime/speculative/config.py)
    constraint_limits: object = None  # ConstraintLimits | None: bounds on requests' schemas, regexes, grammars

    @classmethod
    def of(cls, **options) -> "RunOptions":
        """From keyword arguments, with one line naming any that is not a run option."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise InvalidOptionError(f"unknown run option(s) {', '.join(unknown)}; the options are {', '.join(known)}")
        return cls(**options)


@dataclass(frozen=True)
class OpenedExecutor:
    executor: Executor  # runtime/executor.py

    @property
    def num_kv_blocks(self) -> int:
        return self.executor.info.num_kv_blocks

    @property
    def num_threads(self) -> int:
        return self.executor.info.num_threads


class Target(ABC):
    name: str
    # The kernels, as data (targets/<name>/kernel_table.py): the plugins/ops.py ops this
    # target runs, and (op, StoredFormat subclass of quantization/formats.py) -> the
    # target's own choice of the kernel reading weights stored in that format.
    KERNELS: frozenset = frozenset()
    QUANT_KERNELS: Mapping = MappingProxyType({})

    # ---- builder ----
    def has_kernel(self, op: str) -> bool:
        """Whether this target runs op `op` (plugins/ops.py); a graph with an op it lacks is
        refused before anything is built (builder/pipeline.py)."""
        return op in self.KERNELS

    def quant_kernel(self, op: str, fmt: type):
        """The QUANT_KERNELS row for `op` reading weights stored as `fmt` (a StoredFormat
        subclass); InvalidOptionError naming the formats it does read when there is none."""
        row = self.QUANT_KERNELS.get((op, fmt))
        if row is None:
            read = sorted(f.key for o, f in self.QUANT_KERNELS if o == op)
            raise InvalidOptionError(f"the {self.name} target has no {op} kernel for {fmt.key} weights (its {op} "
                                     f"kernels read {', '.join(read) or 'no quantized weights'}); choose another "
                                     "--quant, --lm-head none or another --target")
        return row

    def check_build(self, build) -> None:
        """Raises InvalidOptionError when this target cannot build with these options. A
        target adds its own checks and calls this one (super().check_build(build))."""
        if build.quant is not None:
            from bessemer.quantization.formats import weight_format

            fmt = type(weight_format(build.quant, build.quant.group_size))
            if ("linear", fmt) not in self.QUANT_KERNELS:
                raise InvalidOptionError(f"--target {self.name} has no kernels for --quant {build.quant.mode} "
                                         f"({fmt.key} weights) yet; choose another --quant or another --target")
            # a quantized lm_head's table, when tied, is also gathered by the embedding; the tie
            # is known only with the checkpoint, so a target without that gather refuses here,
            # before any work, for tied and untied models alike
            from bessemer.quantization.formats import Int4Group, Int8PerChannel

            q = build.quant
            tables = [Int4Group, Int8PerChannel] if q.bits_per_weight is not None else \
                [{"int4": Int4Group, "int8": Int8PerChannel}.get(q.lm_head)]
            for table in (t for t in tables if t is not None):
                if ("embedding", table) not in self.QUANT_KERNELS:
                    why = ("--bits-per-weight (which may store lm_head in int4)" if q.bits_per_weight is not None
                           else f"--lm-head {q.lm_head}")
                    raise InvalidOptionError(f"--target {self.name} has no embedding kernel for the {table.key} table "
                                             f"that {why} gives a tied lm_head; use --lm-head int8 or none without "
                                             "--bits-per-weight, or --target cpu")
            untied = {"int4": Int4Group, "int8": Int8PerChannel}.get(q.embedding)
            if untied is not None and ("embedding", untied) not in self.QUANT_KERNELS:
                raise InvalidOptionError(f"--target {self.name} has no embedding kernel for {untied.key} tables; "
                                         "use --embedding int8 or none, or --target cpu")

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
