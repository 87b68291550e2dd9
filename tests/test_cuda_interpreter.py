"""Runs tests/cuda_interpreter/ (cuda kernels and whole cuda plans on CPU through the
Triton interpreter) in child pytest processes started with TRITON_INTERPRET=1: the
interpreter is chosen when a kernel module is imported and cannot share a process with
the ahead-of-time compilation the other cuda tests do. One child per file, except for the
files of SPLIT_BY_FUNCTION: one child per test function there, so that pytest-xdist workers
share their minutes instead of one worker running them all."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RUN_DIR_ENV

pytest.importorskip("triton", reason="pip install 'bessemer[cuda]' to test the cuda target")

HERE = Path(__file__).resolve().parent
FILES = sorted(p.name for p in (HERE / "cuda_interpreter").glob("test_*.py"))
# whole-model plans of 22 tiny models: about 2 minutes in one process on 2 cores
SPLIT_BY_FUNCTION = {"test_plans.py"}


def _test_functions(name: str) -> list[str]:
    tree = ast.parse((HERE / "cuda_interpreter" / name).read_text())
    return [node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")]


# node ids relative to cuda_interpreter/: a whole file, or one test function of it
UNITS = [f"{name}::{fn}" for name in FILES if name in SPLIT_BY_FUNCTION for fn in _test_functions(name)] + \
        [name for name in FILES if name not in SPLIT_BY_FUNCTION]


@pytest.mark.slow
@pytest.mark.parametrize("name", UNITS)
def test_under_the_triton_interpreter(name, run_dir):
    # the child shares this run's checkpoints and engines (conftest.run_dir): the units of
    # test_plans.py build the same tiny cuda engines
    env = dict(os.environ, TRITON_INTERPRET="1", **{RUN_DIR_ENV: str(run_dir)})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(HERE / "cuda_interpreter" / name)], env=env, cwd=HERE.parent,
                         capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{name}: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert "passed" in summary and "failed" not in summary
