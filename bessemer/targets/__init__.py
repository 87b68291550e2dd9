"""Targets: what one kind of hardware needs, behind one small interface the builder and
the runtime ask. A target is a folder (`targets/<name>/`: its lowering choices, kernels and
executor) plus one line in TARGETS below; models, graph, passes, the op set and its
references, the engine contract (format/), scheduler, block manager, sampler and server
are shared by every target.

What the builder asks a target (builder/build.py):
    lower(graph, build, kv_cache)  -> LoweredRank: the per-target plan (its JSON and the
                                      kernels it calls) and the tensors to store, each with
                                      its dtype, layout and the stored format's part
    header_fields(build)           -> extra fields of config.json and every rank header
                                      (cpu: the ISA baseline; cuda: GPU arch, compiler)
What the runtime asks it (runtime/engine.py):
    check_runnable(config)         -> raises EngineLoadError, one line naming the engine's
                                      requirement and this machine, if it cannot run here
    create_executor(engine, ...)   -> an executor: step(StepBatch) -> logits [L, V] float32
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
TARGETS = {"cpu": "bessemer.targets.cpu"}


@dataclass(frozen=True)
class LoweredRank:
    """One rank as a target lowers it: `plan` is stored under the rank header's "plan"."""

    plan: dict  # the per-target plan, JSON-ready (format/plan.py for the cpu target)
    kernels: tuple[str, ...]  # "op@version" it calls, sorted (config.json "plugins")
    tensors: tuple  # builder.lower.TensorSpec, in file order
    summary: str  # one line for the build log: "123 kernel calls, 9 buffers"


class Target(ABC):
    name: str

    # ---- builder ----
    @abstractmethod
    def lower(self, graph, build, kv_cache: dict) -> LoweredRank:
        """A verified graph of one rank -> its plan and stored tensors. kv_cache: the plan's
        kv_cache section (format/kv.py)."""

    def header_fields(self, build) -> dict:
        """Fields this target adds to config.json and to every rank header."""
        return {}

    # ---- runtime ----
    def check_runnable(self, config: dict) -> None:
        """Raises EngineLoadError when this machine cannot run the engine."""

    @abstractmethod
    def create_executor(self, engine, num_threads: int, num_kv_blocks: int, isa: str = "auto"):
        """The executor of `engine` (runtime.engine.Engine, one rank)."""

    def kv_bytes_per_token(self, header: dict) -> int:
        return section_bytes_per_token(header["plan"]["kv_cache"])


def target_names() -> tuple[str, ...]:
    return tuple(TARGETS)


def get_target(name: str) -> Target:
    """The Target called `name`; ValueError naming the known ones otherwise."""
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
    return importlib.import_module(TARGETS[name]).TARGET
