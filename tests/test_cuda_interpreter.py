"""Runs tests/cuda_interpreter/ (cuda kernels and whole cuda plans on CPU through the
Triton interpreter) in child pytest processes started with TRITON_INTERPRET=1: the
interpreter is chosen when a kernel module is imported and cannot share a process with
the ahead-of-time compilation the other cuda tests do.

Each child costs about 4.5 CPU-seconds before its first test (torch, triton, transformers),
so the children are few: a file or a test function of about a minute or more runs alone or
with one other (CHILDREN), so that pytest-xdist workers share their minutes, and every file
and function not named there runs in one last child (each of them takes seconds)."""

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
NODE_IDS = [f"{name}::{fn}" for name in FILES if name in SPLIT_BY_FUNCTION for fn in _test_functions(name)] + \
           [name for name in FILES if name not in SPLIT_BY_FUNCTION]
# the children of a minute or more each (CPU time on 2 cores, fresh kernel cache), by node id
CHILDREN = [
    ("test_batch_invariance_cuda.py",),
    ("test_plans.py::test_chunked_prefill_and_decode_logits_match_hf",),
    ("test_plans.py::test_moe_families_match_hf_away_from_routing_ties",
     "test_plans.py::test_greedy_generation_with_mixed_batches_and_a_reused_prefix"),
    ("test_quantized.py", "test_fp8.py"),
    ("test_kv_codes.py", "test_moe_quant_plans.py"),
]
assert {node for child in CHILDREN for node in child} <= set(NODE_IDS), \
    f"CHILDREN names {sorted({n for c in CHILDREN for n in c} - set(NODE_IDS))}, which tests/cuda_interpreter/ lacks"
UNITS = [*CHILDREN, tuple(node for node in NODE_IDS if not any(node in child for child in CHILDREN))]
UNIT_IDS = ["+".join(child) for child in CHILDREN] + ["the-others"]


@pytest.mark.slow
@pytest.mark.parametrize("nodes", UNITS, ids=UNIT_IDS)
def test_under_the_triton_interpreter(nodes, run_dir):
    # the child shares this run's checkpoints and engines (conftest.run_dir): the units of
    # test_plans.py build the same tiny cuda engines
    env = dict(os.environ, TRITON_INTERPRET="1", **{RUN_DIR_ENV: str(run_dir)})
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *(str(HERE / "cuda_interpreter" / node) for node in nodes)], env=env, cwd=HERE.parent,
                         capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0, f"{nodes}: {summary}\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert "passed" in summary and "failed" not in summary
