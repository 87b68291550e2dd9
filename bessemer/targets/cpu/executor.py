"""The cpu target's executor for the runtime: the C++ executor (bessemer._C.Executor) of one
rank file behind the Executor protocol (runtime/executor.py). The C++ object steps; this
class adds what the protocol declares (its info, no device sampler, nothing to fail or
close on its own) and names the extras the cpu tools use (profiling, KV-cache bytes)."""

from __future__ import annotations

import numpy as np

from bessemer import thread_policy
from bessemer.format.step import StepBatch
from bessemer.runtime.executor import ExecutorInfo


class CpuExecutor:
    sampler = None  # the host samples: logits are already in host memory

    def __init__(self, native):
        self.native = native  # bessemer._C.Executor
        self.info = ExecutorInfo(isa=native.isa, num_threads=int(native.num_threads),
                                 num_kv_blocks=int(native.num_kv_blocks), kernels=tuple(native.kernels))
        # fewer threads while other processes hold cores (bessemer/thread_policy.py)
        adaptive = thread_policy.policy() == "adaptive" and self.info.num_threads > 1
        self.governor = thread_policy.ThreadGovernor(self.info.num_threads) if adaptive else None

    def step(self, batch: StepBatch) -> np.ndarray:
        if self.governor is not None:
            self.native.active_threads = self.governor.threads()
        return self.native.step(batch)

    def failure(self) -> str | None:
        return None  # a failed step raises; a single process has no peer to lose

    def close(self) -> None:
        """Nothing to stop: the KV cache and the mapped rank file go with the object."""

    def attach_communicator(self, comm) -> None:
        """Joins a tensor-parallel group (targets/cpu/parallel/). Its ranks are other runnable
        processes of the same job, not load to give way to: every thread stays on."""
        self.governor = None
        self.native.active_threads = self.info.num_threads
        self.native.attach_communicator(comm)

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.native.kv_cache_bytes)

    @property
    def profiling(self) -> bool:
        return self.native.profiling

    @profiling.setter
    def profiling(self, on: bool) -> None:
        """Turning it on clears the counters."""
        self.native.profiling = on

    def profile_stats(self) -> dict:
        """op -> (calls, seconds) since profiling was turned on."""
        return self.native.profile_stats()
