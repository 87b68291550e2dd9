"""Conformance of every registered target (bessemer.targets.target_names()): what the author
of a new target runs to see what is still missing. For each target:

- its kernel tables (targets/<name>/kernel_table.py) name ops of plugins/ops.py and stored
  formats of quantization/formats.py, and every QUANT_KERNELS row chooses a kernel;
- every kernel it declares passes one kernel-vs-reference test of that target
  (target_cases.CASES; a declared kernel without a case fails, naming it);
- a tiny random-weight family's logits match HF (target_cases.FAMILY);
- its executor takes the StepBatch edge cases (a step with no rows, a one-token prompt,
  a sequence holding its full block table up to max_seq_len) and implements the runtime's
  Executor protocol (runtime/executor.py).

A target whose checks need their own process (target_cases.OWN_PROCESS: the cuda kernels
run under the Triton interpreter) is checked by a child pytest of this file with that
environment. Building its engine compiles every kernel (~70 s on 2 cores with a cold
kernel cache), so its engine checks are marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bessemer.errors import InvalidOptionError

from target_cases import CASES, ENGINES, FAMILY, OWN_PROCESS, TESTS, run_case

from bessemer.format.kv import blocks_needed
from bessemer.format.step import StepBatch
from bessemer.plugins.ops import OPS
from bessemer.quantization.formats import (ExpertStack, Fp8E4M3, Int4Group, Int4GroupA8, Int4SuperBlock,
                                           Int8PerChannel, Mxfp4Experts, StoredFormat, W8A8)
from bessemer.targets import get_target, target_names

ONLY = os.environ.get("BESSEMER_CONFORMANCE_TARGET")  # set in such a child: the one target it checks
TARGETS = (ONLY,) if ONLY else target_names()
HERE = tuple(t for t in TARGETS if ONLY or t not in OWN_PROCESS)  # targets whose kernels run in this process
ELSEWHERE = () if ONLY else tuple(t for t in TARGETS if t in OWN_PROCESS)

# (instance, weight shape) of every stored format, for asking each QUANT_KERNELS row what it
# chooses; experts' weights are (E*N, K) rows or, input-major and MXFP4, (E, K, N)
FORMAT_SAMPLES = {
    Int8PerChannel: ((Int8PerChannel(), (64, 128)),),
    Int4Group: ((Int4Group(32, False), (64, 128)), (Int4Group(64, True), (64, 128))),
    Int4GroupA8: ((Int4GroupA8(32), (64, 128)), (Int4GroupA8(128), (64, 128))),
    Int4SuperBlock: ((Int4SuperBlock(128), (64, 128)), (Int4SuperBlock(192), (64, 576))),
    W8A8: ((W8A8(smooth=False), (64, 128)), (W8A8(smooth=True), (64, 128))),
    Fp8E4M3: ((Fp8E4M3(dynamic=True), (64, 128)), (Fp8E4M3(dynamic=False), (64, 128))),
    ExpertStack: ((ExpertStack(Int8PerChannel(), 4), (4 * 64, 128)),
                  (ExpertStack(Int4Group(32, True), 4, input_major=True), (4, 128, 64)),
                  (ExpertStack(Fp8E4M3(dynamic=True), 4), (4 * 64, 128)),
                  (ExpertStack(Fp8E4M3(dynamic=True, act_group=32), 4), (4 * 64, 128))),
    Mxfp4Experts: ((Mxfp4Experts(), (4, 128, 64)),),
}

FAMILY_KIND = "llama-tied"


def declared_kernels(name: str) -> set[str]:
    """The kernels a target declares: ops with a kernel (version 0: views, none) and its
    QUANT_KERNELS rows as "op:FormatClass"."""
    target = get_target(name)
    return ({op for op in target.KERNELS if op in OPS and OPS[op].version > 0}
            | {f"{op}:{fmt.__name__}" for op, fmt in target.QUANT_KERNELS})


def _engine_marks(name: str) -> list:
    return [pytest.mark.slow] if name in OWN_PROCESS else []


# ---------------------------------------------------------------- kernel tables

@pytest.mark.parametrize("name", TARGETS)
def test_kernel_tables_name_known_ops_and_formats(name):
    target = get_target(name)
    assert target.KERNELS, f"the {name} target declares no KERNELS (targets/{name}/kernel_table.py)"
    unknown = sorted(set(target.KERNELS) - set(OPS))
    assert not unknown, f"{name} KERNELS names ops plugins/ops.py does not declare: {unknown}"
    assert all(target.has_kernel(op) for op in target.KERNELS)
    for (op, fmt), choose in target.QUANT_KERNELS.items():
        assert op in target.KERNELS, f"{name} QUANT_KERNELS row ({op}, {fmt.__name__}) for an op it does not run"
        assert isinstance(fmt, type) and issubclass(fmt, StoredFormat), f"{name}: {fmt!r} is not a StoredFormat"
        assert fmt in FORMAT_SAMPLES, f"add samples of {fmt.__name__} to FORMAT_SAMPLES"
        chosen = 0
        for sample, shape in FORMAT_SAMPLES[fmt]:
            try:  # a row may refuse a variant it has no kernel for (the int4 table: symmetric only), in one line
                kernel = choose(sample, shape)
            except InvalidOptionError as e:
                assert "\n" not in str(e) and "use " in str(e), f"{name} ({op}, {sample.describe()}): {e}"
                continue
            assert kernel is not None, f"{name} ({op}, {sample.describe()}) chose no kernel"
            chosen += 1
        assert chosen, f"{name} ({op}, {fmt.__name__}) refused every sample"
        assert target.quant_kernel(op, fmt) is choose


def test_every_stored_format_has_samples():
    """A new StoredFormat (a subclass of one too) gets samples here, so every target's table
    is asked about it."""
    def every_subclass(cls):
        return {c for sub in cls.__subclasses__() for c in (sub, *every_subclass(sub))}
    assert every_subclass(StoredFormat) == set(FORMAT_SAMPLES)


# ---------------------------------------------------------------- kernels vs references

@pytest.mark.parametrize("name", TARGETS)
def test_every_declared_kernel_has_a_reference_case(name):
    declared, cases = declared_kernels(name), set(CASES.get(name, {}))
    missing, stale = sorted(declared - cases), sorted(cases - declared)
    assert not missing, (f"the {name} target declares kernels with no kernel-vs-reference case in "
                         f"tests/targets/target_cases.py: {missing}; write a test of each against its "
                         "plugins/ops.py reference with its target's kernel tests and name it there")
    assert not stale, f"target_cases.py has cases for kernels the {name} target no longer declares: {stale}"


@pytest.fixture(scope="module")
def passed_cases() -> set:
    """Cases already run in this module (several kernels share one test)."""
    return set()


@pytest.mark.parametrize("name,kernel", [(n, k) for n in HERE for k in sorted(declared_kernels(n))])
def test_kernel_matches_its_reference(name, kernel, request, passed_cases):
    case = CASES.get(name, {}).get(kernel)
    if case is None:
        pytest.fail(f"{name} declares {kernel} but target_cases.py names no test of it against its reference")
    if repr(case) not in passed_cases:
        run_case(case, request.getfixturevalue)
        passed_cases.add(repr(case))


# ---------------------------------------------------------------- a tiny family vs HF

@pytest.mark.parametrize("name", [pytest.param(n, marks=_engine_marks(n)) for n in HERE])
def test_tiny_family_matches_hf(name, request):
    assert name in FAMILY, f"target_cases.FAMILY names no tiny-family-vs-HF test for the {name} target"
    run_case(FAMILY[name], request.getfixturevalue)


# ---------------------------------------------------------------- the executor

@pytest.fixture
def opened(request):
    """(the engine's Engine, its opened executor, HF checkpoint) of the target `name`."""
    from bessemer.runtime.engine import Engine

    name = request.node.callspec.params["name"]
    assert name in ENGINES, f"target_cases.ENGINES names no tiny engine for the {name} target's executor checks"
    fixture, build, options = ENGINES[name]
    engine = Engine.load(request.getfixturevalue(fixture)(FAMILY_KIND, **build))
    executor = engine.target.open_executor(engine, options).executor
    yield engine, executor, request.getfixturevalue("tiny_checkpoint")(FAMILY_KIND)
    executor.close()


def _logits_bound(engine, ckpt, ids, ref) -> float:
    """How far the engine's logits may be from HF fp32's (tests/tolerances.py): fp32 engines
    within FP32_LOGITS_*, 16-bit ones within their ratio of HF's own 16-bit error."""
    from conftest import hf_logits
    from tolerances import BF16_ERROR_RATIO, CUDA_BF16_ERROR_RATIO, FP32_LOGITS_ATOL, FP32_LOGITS_RTOL

    dtype = engine.build["dtype"]
    if dtype == "float32":
        return FP32_LOGITS_ATOL + FP32_LOGITS_RTOL * np.abs(ref).max()
    ratio = CUDA_BF16_ERROR_RATIO if engine.config["target"] == "cuda" else BF16_ERROR_RATIO
    return ratio * np.abs(hf_logits(ckpt, ids, dtype=dtype) - ref).max()


def _one_sequence(tokens, start, table) -> StepBatch:
    """Rows `tokens` of one sequence at positions start.., its block table `table`, logits
    of every row."""
    n = len(tokens)
    return StepBatch.of(tokens, np.arange(start, start + n), [0, n], [start + n], [table], np.arange(n))


@pytest.mark.parametrize("name", [pytest.param(n, marks=_engine_marks(n)) for n in HERE])
def test_step_batch_edge_cases(name, opened):
    from conftest import hf_logits

    engine, executor, ckpt = opened
    build = engine.build
    width = blocks_needed(int(build["max_seq_len"]), int(build["kv_block_size"]))  # the most blocks a sequence holds
    vocab = engine.header["plan"]["vocab_size"]

    # a step with no rows (nothing scheduled): no logits, not an error
    empty = executor.step(StepBatch.of([], [], [0], [], np.zeros((0, width), np.int32), []))
    assert empty.shape == (0, vocab) and empty.dtype == np.float32

    # a prompt of one token
    table = np.full(width, -1, np.int32)
    table[0] = width - 1
    got = executor.step(_one_sequence([7], 0, table))
    ref = hf_logits(ckpt, [7])
    assert got.shape == (1, vocab) and np.abs(got - ref).max() <= _logits_bound(engine, ckpt, [7], ref)

    # one sequence up to max_seq_len, chunked by max_num_tokens, every block of its table in
    # use (in reverse order: a block's id says nothing of its position)
    prompt = np.random.default_rng(0).integers(0, vocab, int(build["max_seq_len"])).tolist()
    table = np.arange(width, dtype=np.int32)[::-1].copy()
    chunk, rows = int(build["max_num_tokens"]), []
    for start in range(0, len(prompt), chunk):
        rows.append(executor.step(_one_sequence(prompt[start:start + chunk], start, table)))
    got, ref = np.concatenate(rows), hf_logits(ckpt, prompt)
    assert np.abs(got - ref).max() <= _logits_bound(engine, ckpt, prompt, ref), "full block table"


@pytest.mark.parametrize("name", [pytest.param(n, marks=_engine_marks(n)) for n in HERE])
def test_executor_implements_the_protocol(name, opened):
    from bessemer.runtime.executor import DeviceSampler, Executor, ExecutorInfo

    _engine, executor, _ckpt = opened
    assert isinstance(executor, Executor), f"the {name} executor {type(executor).__name__} is not an Executor"
    assert isinstance(executor.info, ExecutorInfo) and executor.info.num_kv_blocks > 0
    assert executor.sampler is None or isinstance(executor.sampler, DeviceSampler)
    assert executor.failure() is None
    executor.close()
    executor.close()  # idempotent


# ---------------------------------------------------------------- targets needing their own process

def _run_child(name: str, marker: str) -> None:
    env = dict(os.environ, **OWN_PROCESS[name], BESSEMER_CONFORMANCE_TARGET=name)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker,
                          str(Path(__file__))], env=env, cwd=TESTS.parent, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    if run.returncode == 0 and "passed" not in summary:
        pytest.skip(f"{name}: {summary}")  # everything skipped (its toolchain is not installed)
    assert run.returncode == 0, f"{name}: {summary}\n{run.stdout[-8000:]}\n{run.stderr[-2000:]}"


@pytest.mark.slow  # a child process: the cuda target's, its kernels under the interpreter, ~15 s on 2 cores
@pytest.mark.parametrize("name", ELSEWHERE)
def test_target_in_its_own_process(name):
    """Its kernel tables and every kernel against its reference."""
    _run_child(name, "not slow")


@pytest.mark.slow
@pytest.mark.parametrize("name", ELSEWHERE)
def test_target_engine_in_its_own_process(name):
    """Its tiny family against HF and its executor (an engine build compiles its kernels)."""
    _run_child(name, "slow")
