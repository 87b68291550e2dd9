"""The kernels' thread-pool wait policy (bessemer/thread_policy.py) is set once, before the
native module loads, for every entry point, and a user's own OpenMP settings win."""

from __future__ import annotations

import os
import subprocess
import sys

from bessemer import thread_policy


def test_a_short_spin_by_default():
    env = {}
    thread_policy.apply(env)
    assert env == {"GOMP_SPINCOUNT": str(thread_policy.SPIN_ROUNDS)}


def test_the_users_openmp_settings_win():
    for own in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "infinite"}):
        env = dict(own)
        thread_policy.apply(env)
        assert env == own


def test_libgomps_own_defaults_on_request():
    env = {"BESSEMER_THREAD_POLICY": "libgomp"}
    thread_policy.apply(env)
    assert "GOMP_SPINCOUNT" not in env and "OMP_WAIT_POLICY" not in env


def test_set_before_the_native_module_loads():
    """What libgomp sees is the environment when `_C` loads: importing the runtime the way
    run-engine does must have applied the policy by then."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    code = ("import os, sys\n"
            "from bessemer.runtime.llm import LLM\n"
            "from bessemer import _C\n"
            "print(os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(thread_policy.SPIN_ROUNDS)


def test_governor_gives_way_to_other_runnable_tasks():
    """1 runnable task (the stepping thread itself): every thread; one other busy task on 2
    cores: 1 thread after a few steps; back to 2 once it stops; never below 1."""
    counts = iter([1] * 3 + [2] * 12 + [1] * 12 + [9] * 12)
    gov = thread_policy.ThreadGovernor(max_threads=2, cores=2, read=lambda: next(counts), read_own=lambda: 1)
    seen = [gov.count() for _ in range(39)]
    assert seen[:3] == [2, 2, 2]
    assert seen[3] == 2, "one count of another task must not halve the next step"
    assert seen[14] == 1 and seen[26] == 2 and seen[38] == 1


def test_governor_without_a_run_queue_keeps_every_thread():
    gov = thread_policy.ThreadGovernor(max_threads=4, cores=4, read=lambda: None)
    assert gov.threads() == 4


def test_run_queue_is_read_from_loadavg(tmp_path):
    f = tmp_path / "loadavg"
    f.write_text("0.50 0.40 0.30 3/412 12345\n")
    assert thread_policy.runnable_tasks(str(f)) == 3
    assert thread_policy.runnable_tasks(str(tmp_path / "absent")) is None
    assert thread_policy.runnable_tasks("/proc/loadavg") >= 1
    assert thread_policy.own_runnable_tasks() >= 1  # the thread reading it


def test_own_threads_are_not_load():
    """A worker of this process still spinning after a step is not another process's load."""
    gov = thread_policy.ThreadGovernor(max_threads=2, cores=2, read=lambda: 3, read_own=lambda: 2)
    assert [gov.count() for _ in range(20)][-1] == 1  # one other task: gives way
    gov = thread_policy.ThreadGovernor(max_threads=2, cores=2, read=lambda: 2, read_own=lambda: 2)
    assert [gov.count() for _ in range(20)][-1] == 2


def test_counts_every_few_steps():
    reads = []
    gov = thread_policy.ThreadGovernor(max_threads=2, cores=2, read=lambda: reads.append(1) or 1, read_own=lambda: 1)
    for _ in range(3 * gov.CHECK_EVERY):
        assert gov.threads() == 2
    assert len(reads) == 3


def test_unknown_policy_is_one_line():
    import pytest

    with pytest.raises(ValueError, match="use one of adaptive, fixed, libgomp"):
        thread_policy.policy({"BESSEMER_THREAD_POLICY": "fast"})
