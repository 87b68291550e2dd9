"""Runs tests/cuda_interpreter/ (cuda kernels and whole cuda plans on CPU through the
Triton interpreter) in child pytest processes started with TRITON_INTERPRET=1: the
interpreter is chosen when a kernel module is imported and cannot share a process with
the ahead-of-time compilation the other cuda tests do. One child per file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

HERE = Path(__file__).resolve().parent
FILES = sorted(p.name for p in (HERE / "cuda_interpreter").glob("test_*.py"))


@pytest.mark.parametrize("name", FILES)
def test_under_the_triton_interpreter(name):
    env = dict(os.environ, TRITON_INTERPRET="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(HERE / "cuda_interpreter" / name)], env=env, cwd=HERE.parent,
                         capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{name}: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert "passed" in summary and "failed" not in summary
