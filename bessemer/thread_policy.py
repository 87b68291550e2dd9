"""How the native kernels' worker threads wait and how many of them work: decided here, once,
for every entry point (run-engine, `LLM`, the server).

Waiting. libgomp's workers spin for GOMP_SPINCOUNT rounds of a pause instruction after a
parallel region, then sleep on a futex until the next one. The regions of one decode step
come microseconds apart, so a short spin covers them; sleeping at once
(OMP_WAIT_POLICY=PASSIVE) pays a futex wake-up of an idle core at each of the ~200 regions of
a step. Measured with bench/thread_policy.py (SmolLM2 w4a16 g32, batch-1 decode, 2 threads,
idle 2-core machine): 10000 rounds 251 tok/s, libgomp's default 300000 254, 1000 239,
100 118, PASSIVE 88.

How many. Beside one busy process, two threads that wait for each other at every barrier
lose to one: 25-41 tok/s with 2 threads at 10000 spins, 115-128 PASSIVE, 158 with 1 thread.
So a single-process executor asks `ThreadGovernor` every few steps how many threads to use:
as many as the cores that other processes' runnable tasks do not hold (the run queue of
/proc/loadavg less this process's own runnable threads, smoothed). With it: idle 230-240
tok/s (4-8% under all threads always on), beside a busy process 103-160; through the server
201 idle, 128-147 busy (it slept passively before: 92 idle). Results do not depend on it
(the kernels split rows and columns over threads, never a sum). Tensor-parallel ranks keep
every thread (the other ranks are the same job, not load).

libgomp reads the environment once, when the native module loads, so `apply()` runs when the
`bessemer` package is imported. A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins;
BESSEMER_THREAD_POLICY=fixed keeps every thread working whatever the load, =libgomp also
leaves libgomp's own wait defaults.
"""

from __future__ import annotations

import os

SPIN_ROUNDS = 10000
POLICY_VAR = "BESSEMER_THREAD_POLICY"  # adaptive (default) | fixed | libgomp
POLICIES = ("adaptive", "fixed", "libgomp")


def policy(environ=os.environ) -> str:
    value = environ.get(POLICY_VAR, "adaptive")
    if value not in POLICIES:
        raise ValueError(f"{POLICY_VAR}={value!r} is not a thread policy; use one of {', '.join(POLICIES)}")
    return value


def apply(environ=os.environ) -> None:
    if "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return
    if environ.get(POLICY_VAR, "") == "libgomp":
        return
    environ["GOMP_SPINCOUNT"] = str(SPIN_ROUNDS)


def runnable_tasks(path: str = "/proc/loadavg") -> int | None:
    """Tasks runnable on the machine right now, the reading thread included (the 4th field
    of /proc/loadavg, "running/total"); None where the file does not exist."""
    try:
        with open(path) as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def own_runnable_tasks(task_dir: str = "/proc/self/task") -> int:
    """This process's runnable threads (the reading one included): its kernel workers still
    spinning after a step, a server's event loop."""
    running = 0
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return 1
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                running += f.read().rsplit(")", 1)[1].split()[0] == "R"
        except (OSError, IndexError):
            continue  # a thread that ended meanwhile
    return max(running, 1)


class ThreadGovernor:
    """Threads for the next step: `max_threads` less the cores other processes' runnable
    tasks want, at least 1. They are counted before each step (the machine's run queue less
    this process's own runnable threads) and smoothed with an exponential average, so a task
    that runs for a moment does not halve the next step."""

    SMOOTHING = 0.25  # weight of the newest count
    # another task counts as holding a core once it was runnable at most of the recent
    # steps: a server's event loop, running now and then between steps, does not
    HOLDS_A_CORE = 0.75
    CHECK_EVERY = 8  # steps between two counts (~50 us each): a decode step takes milliseconds

    def __init__(self, max_threads: int, cores: int | None = None, read=runnable_tasks, read_own=own_runnable_tasks):
        self.max_threads = max_threads
        self.cores = cores if cores is not None else len(os.sched_getaffinity(0))
        self.read, self.read_own = read, read_own
        self.others = 0.0
        self.steps, self.last = 0, max_threads

    def threads(self) -> int:
        self.steps += 1
        if self.steps % self.CHECK_EVERY != 1 and self.CHECK_EVERY > 1:
            return self.last
        self.last = self.count()
        return self.last

    def count(self) -> int:
        # own threads first: a worker still spinning can only go to sleep meanwhile, so the
        # count errs towards keeping threads, never towards seeing our own worker as load
        own = self.read_own()
        running = self.read()
        if running is None:
            return self.max_threads
        self.others += self.SMOOTHING * (max(running - own, 0) - self.others)
        free = self.cores - int(self.others + 1 - self.HOLDS_A_CORE)
        return max(1, min(self.max_threads, free))
