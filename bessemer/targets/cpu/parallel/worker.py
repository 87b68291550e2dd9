"""A non-zero rank of a tensor-parallel engine on one machine, started by rank 0
(group_executor.py):

    python -m bessemer.targets.cpu.parallel.worker ENGINE --rank R --world N --shm NAME ...

It dies with its parent (PR_SET_PDEATHSIG), opens the shared-memory communicator first (so
any later failure aborts the whole group with its reason), loads its rank file, and runs
the steps rank 0 broadcasts until told to stop. Errors: one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bessemer.targets.cpu.parallel.worker")
    ap.add_argument("engine")
    for flag in ("--rank", "--world", "--slot-bytes", "--threads", "--kv-blocks", "--parent"):
        ap.add_argument(flag, type=int, required=True)
    ap.add_argument("--shm", required=True)
    ap.add_argument("--timeout", type=float, required=True)
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--no-verify", action="store_true")
    a = ap.parse_args(argv)
    _die_with_parent(a.parent)

    from bessemer import _C
    from bessemer.runtime.engine import Engine
    from bessemer.targets.cpu.parallel.group_executor import STARTUP_TIMEOUT_S, run_worker

    comm = _C.ShmCommunicator(a.shm, a.rank, a.world, a.slot_bytes, a.timeout, False)
    try:
        engine = Engine.load(a.engine, rank=a.rank, verify_checksum=not a.no_verify)
        executor = engine.create_executor(a.threads, a.kv_blocks, a.isa)
        executor.attach_communicator(comm)
        comm.barrier(STARTUP_TIMEOUT_S)
        run_worker(executor, comm.bcast_recv)
    except Exception as e:  # noqa: BLE001 - every failure ends the group with its reason
        message = f"rank {a.rank}: {e}"
        comm.abort(message)
        print(f"error: {message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
