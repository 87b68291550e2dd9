"""The Executor seam: what the runtime asks of every target's executor, typed.

A target's `open_executor` (targets/__init__.py) returns an object that has

    step(batch: StepBatch) -> np.ndarray   logits [L, V] float32 of the batch's
                                            logits_indices rows (format/step.py)
    info: ExecutorInfo                      what it runs on, fixed once it is open
    sampler: DeviceSampler | None           sampling where the logits are (a cuda engine's
                                            never leave the GPU); None: the host samples
    failure() -> str | None                 why it can no longer step (a dead tensor-parallel
                                            rank), or None; what /health reports
    close() -> None                         releases what it holds now (worker processes);
                                            idempotent

and nothing else is asked of it: capabilities are declared data, never probed for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from bessemer.format.step import StepBatch


@dataclass(frozen=True)
class ExecutorInfo:
    """What an open executor runs on (logged at load, read by the CLI and the server)."""

    isa: str  # what runs the kernels: "avx512" (cpu), "cuda sm_90a on GPU 0 (NVIDIA H100)"
    num_threads: int  # host threads per rank (1 on a GPU)
    num_kv_blocks: int  # blocks of the paged KV cache it allocated
    kernels: tuple[str, ...] = ()  # the kernels its plan calls


@dataclass(frozen=True, eq=False)
class SamplingRows:
    """Per-row sampling controls of the rows a step samples (the completing sequences), in
    the batch's logits_indices order."""

    temperature: np.ndarray  # [L] float32; 0: argmax
    top_k: np.ndarray  # [L] int32; 0: no limit
    top_p: np.ndarray  # [L] float32; 1: no limit
    uniform: np.ndarray  # [L] float64 in [0, 1): each draw's uniform, its sequence's stream's at the position


@runtime_checkable
class DeviceSampler(Protocol):
    def sample(self, batch: StepBatch, rows: SamplingRows,
               want_logits: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Runs the step and samples on the device: token ids [L] int32 (argmax where
        temperature is 0, else a draw with `uniform` from what top_k/top_p keep), and the
        logits [L, V] float32 when `want_logits`."""


@runtime_checkable
class Executor(Protocol):
    info: ExecutorInfo
    sampler: DeviceSampler | None

    def step(self, batch: StepBatch) -> np.ndarray:
        """Logits [L, V] float32 of the rows batch.logits_indices selects."""

    def failure(self) -> str | None:
        """Why this executor can no longer step, or None while it can."""

    def close(self) -> None:
        """Releases what it holds (idempotent; garbage collection releases it too)."""
