"""Runs build tasks (one tensor-parallel rank each) in forked child processes, K at a time.

Fork, not spawn: a child inherits the parent's calibration result (Hessians, AWQ scales)
and the closures it runs without pickling them. Each task returns a small JSON-able dict
through a pipe; a failed task fails the build with the child's one-line error, and the
other children are killed, so no process outlives the build.
"""

from __future__ import annotations

import multiprocessing
import traceback
from typing import Callable

from bessemer.errors import BessemerError


def _child(task: Callable[[], dict], conn) -> None:
    try:
        conn.send(("ok", task()))
    except BessemerError as e:
        conn.send(("error", str(e)))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        conn.send(("error", "a build worker failed:\n" + traceback.format_exc()))
    finally:
        conn.close()


def run_forked(tasks: list[Callable[[], dict]], workers: int) -> list[dict]:
    ctx = multiprocessing.get_context("fork")
    results: list[dict | None] = [None] * len(tasks)
    pending = list(range(len(tasks)))
    running: dict[int, tuple] = {}
    try:
        while pending or running:
            while pending and len(running) < workers:
                i = pending.pop(0)
                recv, send = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_child, args=(tasks[i], send), daemon=True)
                proc.start()
                send.close()
                running[i] = (proc, recv)
            ready = multiprocessing.connection.wait([r for _, r in running.values()])
            for i, (proc, recv) in list(running.items()):
                if recv not in ready:
                    continue
                try:
                    status, value = recv.recv()
                except EOFError:
                    status, value = "error", f"build worker for task {i} died (exit code {proc.exitcode})"
                proc.join()
                del running[i]
                if status != "ok":
                    raise BessemerError(value)
                results[i] = value
    finally:
        for proc, recv in running.values():
            proc.kill()
            proc.join()
            recv.close()
    return results
