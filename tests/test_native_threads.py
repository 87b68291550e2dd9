"""The one thread policy of the build's native quantization helpers
(quantization/native_threads.py), run in fresh interpreters so that whether torch is loaded
and OMP_NUM_THREADS are the test's choice."""

import os
import subprocess
import sys

import pytest

_PRINT = "from bessemer.quantization.native_threads import native_threads; print(native_threads())"


def _threads(code: str, omp: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if omp is not None:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.parametrize("omp,want", [(None, "cores"), ("1", 1), ("0", "cores"), ("abc", "cores"), ("999", "cores")])
def test_without_torch_the_cores_capped_by_omp_num_threads(omp, want):
    cores = len(os.sched_getaffinity(0))
    assert _threads(_PRINT + "; import sys; assert 'torch' not in sys.modules", omp) == (cores if want == "cores" else want)


def test_with_torch_loaded_its_pool_size_including_a_set_num_threads():
    assert _threads("import torch; torch.set_num_threads(1); " + _PRINT, None) == 1


def test_a_share_holds_inside_its_block_in_its_own_thread_only():
    from concurrent.futures import ThreadPoolExecutor

    from bessemer.quantization.native_threads import native_threads, thread_budget, thread_share

    budget = thread_budget()
    assert native_threads() == budget
    with thread_share(1):
        assert native_threads() == 1
        with ThreadPoolExecutor(1) as pool:  # a thread started meanwhile keeps the whole budget
            assert pool.submit(native_threads).result() == budget
        with thread_share(0):
            assert native_threads() == 1  # never below one thread
    assert native_threads() == budget
