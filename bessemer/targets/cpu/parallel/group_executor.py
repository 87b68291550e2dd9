"""Tensor-parallel launcher: runs a `--tp N` engine as N processes, one rank file each.

Rank 0 is the process that made the LLM: it owns scheduling and sampling. Each step it
broadcasts the step's inputs (group.py) and runs its own rank; every rank's
executor all-reduces activations and all-gathers logits inside the C++ core.

- On one machine (the default), rank 0 creates a shared-memory communicator and starts
  N-1 worker processes (`python -m bessemer.targets.cpu.parallel.worker`). Workers die with their
  parent (PR_SET_PDEATHSIG); a watchdog thread in rank 0 beats a heartbeat the workers
  watch and aborts the group as soon as a worker exits, so a blocked collective returns
  at once; a rank that hangs is given up after `timeout_s`. The shared-memory name is
  unlinked once every rank has attached, so nothing is left in /dev/shm.
- Under `mpirun -n N`, every process makes the LLM; MPI gives the ranks. Rank 0 returns
  the executor as above; other ranks serve steps inside LLM() and exit when rank 0 stops.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import weakref

import numpy as np

import bessemer
from bessemer.errors import TensorParallelError
from bessemer.format.step import StepBatch, is_stop, stop_words
from bessemer.targets.cpu.parallel.group import MpiGroup, launched_by_mpi

STARTUP_TIMEOUT_S = 300.0
WATCH_INTERVAL_S = 0.05
STOP_GRACE_S = 5.0  # a clean stop: workers finish their step and exit
FAILED_EXIT_GRACE_S = 0.25


def slot_bytes(engine, max_blocks: int) -> int:
    """Bytes of each rank's communicator slot: a step message, or the widest collective
    of one full step (larger collectives are cut in chunks of this size)."""
    build, plan = engine.build, engine.header["plan"]
    t = int(build["max_num_tokens"])
    widths = [s["ins"][0][2] for s in plan["steps"] if s["op"] in ("all_reduce", "all_gather")]
    words = StepBatch.max_words(t, int(build["max_batch_size"]), max_blocks)
    return int(max(4 * words + 64, min(t * max(widths) * 4, 16 << 20), 1 << 20))


def run_worker(executor, recv) -> None:
    """A non-zero rank's loop: run every step rank 0 broadcasts until it says stop."""
    while True:
        words = recv()
        if is_stop(words):
            return
        executor.step(StepBatch.decode(words))


class TensorParallelExecutor:
    """Rank 0's executor (runtime/executor.py's protocol): the local one plus the broadcast."""

    sampler = None  # rank 0 samples on the host

    def __init__(self, executor, send, workers: "_Workers | None" = None):
        self.local, self._send, self.workers = executor, send, workers  # local: targets/cpu/executor.CpuExecutor
        self.info = executor.info  # of rank 0; every rank runs the same threads and KV blocks
        self._error: str | None = None

    def step(self, batch: StepBatch) -> np.ndarray:
        problem = self.failure()
        if problem:
            raise TensorParallelError(problem)
        try:
            self._send(batch.encode())
            return self.local.step(batch)
        except RuntimeError as e:
            self._error = f"tensor-parallel step failed: {e}; the engine is stopped, create a new LLM"
            self.close()
            raise TensorParallelError(self._error) from None

    def close(self) -> None:
        if self.workers is not None:
            self.workers.stop()

    def failure(self) -> str | None:
        """Why this group can no longer step (a failed step, a worker rank that exited),
        or None while it can: what /health reports."""
        if self._error:
            return self._error
        # the watchdog (_watch) aborts the group when a worker exits, naming the rank
        if self.workers is not None and self.workers.comm.failed:
            return f"{self.workers.comm.error}; restart the server"
        return None

    @property
    def kv_cache_bytes(self) -> int:
        """Rank 0's (every rank holds its share of the heads)."""
        return self.local.kv_cache_bytes


class _Workers:
    """The worker processes of a shared-memory group, their watchdog and their cleanup."""

    def __init__(self, comm, procs: list, logs: list):
        self.comm, self.procs, self.logs = comm, procs, logs
        self.done = threading.Event()
        self.thread = threading.Thread(target=_watch, args=(comm, procs, logs, self.done),
                                       name="bessemer-tp-watchdog", daemon=True)
        self.thread.start()
        self._finalizer = weakref.finalize(self, _shutdown, comm, procs, logs, self.done)

    def stop(self) -> None:
        self._finalizer()


def _last_line(log) -> str:
    try:
        log.flush()
        log.seek(0)
        lines = [ln.strip() for ln in log.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""
    except (OSError, ValueError):
        return ""


def _watch(comm, procs, logs, done: threading.Event) -> None:
    while not done.wait(WATCH_INTERVAL_S):
        comm.beat()
        for rank, (p, log) in enumerate(zip(procs, logs), start=1):
            code = p.poll()
            if code is not None and not done.is_set():
                why = _last_line(log)
                comm.abort(f"tensor-parallel rank {rank} exited with code {code}" + (f" ({why})" if why else ""))
                return


def _shutdown(comm, procs, logs, done: threading.Event) -> None:
    done.set()
    failed = comm.failed
    if not failed and all(p.poll() is None for p in procs):
        try:
            comm.bcast_send(stop_words())
        except RuntimeError:
            pass
    # After a failure the live workers have seen the abort and exit at once; one that has not
    # within a moment is the rank that hung, and waiting longer only delays the user's error.
    deadline = time.monotonic() + (FAILED_EXIT_GRACE_S if failed else STOP_GRACE_S)
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for log in logs:
        log.close()
    comm.unlink()


def _spawn(engine, rank: int, world: int, shm: str, slot: int, timeout_s: float, threads: int,
           kv_blocks: int, isa: str, verify_checksum: bool, log) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bessemer.targets.cpu.parallel.worker", str(engine.dir), "--rank", str(rank),
           "--world", str(world), "--shm", shm, "--slot-bytes", str(slot), "--timeout", str(timeout_s),
           "--threads", str(threads), "--kv-blocks", str(kv_blocks), "--isa", isa, "--parent", str(os.getpid())]
    if not verify_checksum:
        cmd.append("--no-verify")
    env = dict(os.environ)
    # the directory holding the `bessemer` package, so the worker imports this same copy
    root = os.path.dirname(os.path.dirname(os.path.abspath(bessemer.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)


def start(engine, num_threads: int, num_kv_blocks: int, isa: str, timeout_s: float,
          verify_checksum: bool, max_blocks: int) -> TensorParallelExecutor:
    """Starts every rank of `engine` (rank 0's Engine) and returns rank 0's executor."""
    from bessemer import _C

    world = int(engine.config["mapping"]["tp_size"])
    if launched_by_mpi():
        return _start_mpi(engine, world, num_threads, num_kv_blocks, isa, verify_checksum)
    name = f"/bessemer-tp-{os.getpid()}-{secrets.token_hex(4)}"
    slot = slot_bytes(engine, max_blocks)
    comm = _C.ShmCommunicator(name, 0, world, slot, timeout_s, True)
    procs, logs = [], []
    try:
        for rank in range(1, world):
            logs.append(tempfile.TemporaryFile(prefix=f"bessemer-tp-rank{rank}-"))
            procs.append(_spawn(engine, rank, world, name, slot, timeout_s, num_threads, num_kv_blocks, isa,
                                verify_checksum, logs[-1]))
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        comm.unlink()
        raise
    workers = _Workers(comm, procs, logs)
    try:
        executor = engine.create_executor(num_threads, num_kv_blocks, isa)
        executor.attach_communicator(comm)
        comm.barrier(STARTUP_TIMEOUT_S)  # every rank loaded and attached (or one failed)
    except RuntimeError as e:
        workers.stop()
        raise TensorParallelError(f"tensor-parallel start failed: {e}") from None
    except BaseException:
        workers.stop()
        raise
    comm.unlink()
    return TensorParallelExecutor(executor, comm.bcast_send, workers)


def _start_mpi(engine, world: int, num_threads: int, num_kv_blocks: int, isa: str,
               verify_checksum: bool) -> TensorParallelExecutor:
    group = MpiGroup()
    if group.world != world:
        raise TensorParallelError(f"the engine has {world} ranks but mpirun started {group.world} processes; "
                                  f"run mpirun -n {world}")
    if group.rank != 0:
        engine = type(engine).load(engine.dir, rank=group.rank, verify_checksum=verify_checksum)  # this rank's file
    executor = engine.create_executor(num_threads, num_kv_blocks, isa)
    executor.attach_communicator(group.collectives())
    if group.rank != 0:
        run_worker(executor, group.recv)
        raise SystemExit(0)  # this process was only a rank; rank 0 owns the results
    tp = TensorParallelExecutor(executor, group.send)
    weakref.finalize(tp, group.stop)
    return tp
