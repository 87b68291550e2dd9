"""Every registered target's executor implements the runtime's Executor protocol
(bessemer/runtime/executor.py) as the target opened it: the declared info agrees with what
was loaded, a step returns logits [L, V] float32, the sampler is declared (None, or a
DeviceSampler giving int32 token ids [L]), failure() is None while it can step, close()
is idempotent. The cuda executor runs on the fake driver (tests/cuda_executor/fake_driver.py):
its kernels do not run there, so only shapes and types are judged; what it computes is
tested by tests/cuda_interpreter and the GPU check."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "cuda_executor"))
from fake_driver import fake_cuda, fake_libcuda  # noqa: E402,F401 - the fake driver's fixtures

from bessemer.format.step import StepBatch  # noqa: E402
from bessemer.runtime.engine import Engine  # noqa: E402
from bessemer.runtime.executor import DeviceSampler, Executor, ExecutorInfo, SamplingRows  # noqa: E402
from bessemer.targets import RunOptions, target_names  # noqa: E402


def _open_cpu(request):
    engine = Engine.load(request.getfixturevalue("tiny_engine")("llama-untied"))
    return engine, engine.target.open_executor(engine, RunOptions(num_threads=1, kv_cache_gib=0))


def _open_cuda(request):
    request.getfixturevalue("fake_cuda")
    engine = Engine.load(request.getfixturevalue("cuda_engine")("llama-tied"))
    return engine, engine.target.open_executor(engine, RunOptions(kv_cache_gib=0.01, enforce_eager=True))


# every registered target needs a case here: a new target fails until it has one
OPENERS = {"cpu": _open_cpu, "cuda": _open_cuda}


def test_every_target_has_a_protocol_case():
    assert set(OPENERS) == set(target_names())


def _prefill(vocab: int) -> StepBatch:
    """Two prompts (5 and 3 tokens, blocks 0-1 and 2), the logits of their last rows."""
    ids = np.arange(8) * 7 % vocab
    return StepBatch.of(ids, [0, 1, 2, 3, 4, 0, 1, 2], [0, 5, 8], [5, 3], [[0, 1], [2, -1]], [4, 7])


def _check(executor, engine) -> None:
    assert isinstance(executor, Executor)
    info = executor.info
    assert isinstance(info, ExecutorInfo) and info.isa and info.num_threads >= 1
    assert info.num_kv_blocks >= 3  # what the block manager is told it may hand out
    assert set(info.kernels) and all(isinstance(k, str) for k in info.kernels)
    vocab = int(engine.header["plan"]["vocab_size"])
    logits = executor.step(_prefill(vocab))
    assert logits.shape == (2, vocab) and logits.dtype == np.float32
    if executor.sampler is not None:
        assert isinstance(executor.sampler, DeviceSampler)
        rows = SamplingRows(np.float32([0.0, 0.8]), np.int32([0, 5]), np.float32([1.0, 0.9]), np.array([0.0, 0.3]))
        tokens, sampled_logits = executor.sampler.sample(_prefill(vocab), rows, want_logits=True)
        assert tokens.shape == (2,) and tokens.dtype == np.int32 and sampled_logits.shape == (2, vocab)
    assert executor.failure() is None
    executor.close()
    executor.close()


@pytest.mark.parametrize("target", sorted(OPENERS))
def test_the_executor_a_target_opens_implements_the_protocol(target, request):
    engine, opened = OPENERS[target](request)
    assert opened.num_kv_blocks == opened.executor.info.num_kv_blocks
    _check(opened.executor, engine)


def test_cpu_executor_info_is_what_was_asked_and_its_logits_are_the_native_executors(tiny_engine):
    from bessemer import _C

    engine = Engine.load(tiny_engine("llama-untied"))
    executor = engine.create_executor(num_threads=1, num_kv_blocks=5)
    assert (executor.info.num_threads, executor.info.num_kv_blocks) == (1, 5)
    assert executor.info.kernels == tuple(engine.config["plugins"]) and executor.sampler is None
    native = _C.Executor(_C.EngineFile(str(engine.rank_path)), 1, int(engine.build["kv_block_size"]), 5, "auto")
    batch = _prefill(int(engine.header["plan"]["vocab_size"]))
    np.testing.assert_array_equal(executor.step(batch), native.step(batch))  # the wrapper adds nothing


def test_tensor_parallel_group_executor_implements_the_protocol(tiny_engine):
    """Rank 0's executor of a group (here a group of one, its broadcast recorded): it
    sends each step's wire form to the other ranks, then steps its own rank."""
    from bessemer.targets.cpu.parallel.group_executor import TensorParallelExecutor

    engine = Engine.load(tiny_engine("llama-untied"))
    local = engine.create_executor(num_threads=1, num_kv_blocks=4)
    sent = []
    group = TensorParallelExecutor(local, sent.append)
    assert group.info == local.info and group.sampler is None
    batch = _prefill(int(engine.header["plan"]["vocab_size"]))
    np.testing.assert_array_equal(group.step(batch), local.step(batch))
    (words,) = sent
    for got, want in zip(StepBatch.decode(words).arrays(), batch.arrays()):
        np.testing.assert_array_equal(got, want)
    _check(group, engine)


def test_run_options_are_one_object_given_by_name(tiny_engine):
    """LLM's keyword arguments and a RunOptions give the same engine; a misspelt option or
    both forms at once are refused with one line."""
    from bessemer.errors import InvalidOptionError
    from bessemer.runtime.llm import LLM, SamplingParams

    engine = tiny_engine("llama-untied")
    by_keywords = LLM(engine, num_threads=1, kv_cache_gib=0, seed=5)
    by_object = LLM(engine, options=RunOptions(num_threads=1, kv_cache_gib=0, seed=5))
    assert by_keywords.llm_engine.options == by_object.llm_engine.options
    assert (by_object.num_threads, by_object.num_kv_blocks) == (1, Engine.load(engine).kv_pool_blocks(0))
    params = SamplingParams(max_tokens=6, temperature=0.8)  # no seed of its own: the engine's decides
    assert by_keywords.generate([[1, 2, 3]], params)[0].token_ids == by_object.generate([[1, 2, 3]], params)[0].token_ids
    with pytest.raises(InvalidOptionError, match=r"^unknown run option\(s\) threads; the options are num_threads,"):
        LLM(engine, threads=1)
    with pytest.raises(InvalidOptionError, match="not both"):
        LLM(engine, options=RunOptions(), num_threads=1)
