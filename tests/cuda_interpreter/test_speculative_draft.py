"""Draft-engine speculative decoding with cuda engines, run by the interpreted launcher: a cuda
draft for a cuda target, and a cpu draft for a cuda target. The draft path opens its
executor through the target interface and steps it through the Executor protocol, so either
target's engine drafts (it once called a cpu-only method). Oracle: the same target engine
decoding without drafts; greedy tokens must be identical, whatever the drafts were."""

import numpy as np
import pytest

from interp_support import torch  # noqa: F401  (skips without torch/triton; installs the interpreter fixes)

from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.targets.cuda.interpret import InterpretedExecutor

# few tokens: every interpreted step (target or draft) takes about a second
PARAMS = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
PROMPT = np.random.default_rng(7).integers(0, 250, 6).tolist()


@pytest.fixture(scope="module")
def target(cuda_engine):
    """The cuda target engine and its greedy tokens decoding without drafts."""
    engine = cuda_engine("llama-untied")
    return engine, LLM(engine, interpret=True).generate([PROMPT], PARAMS)[0].token_ids


def _speculative(engine, draft):
    llm = LLM(engine, interpret=True, speculative={"method": "draft", "draft_engine": str(draft), "num_tokens": 2})
    tokens = llm.generate([PROMPT], PARAMS)[0].token_ids
    proposer = llm.llm_engine.proposer
    assert proposer.blocks.num_free == proposer.blocks.num_blocks and not proposer.mirrors
    return tokens, llm.llm_engine.stats(), proposer


def test_a_cuda_draft_engine_for_a_cuda_target_gives_the_plain_greedy_tokens(target):
    engine, plain = target
    tokens, stats, proposer = _speculative(engine, engine)
    assert isinstance(proposer.executor, InterpretedExecutor)  # the target's interpret option reached the draft
    assert tokens == plain
    # the draft is the target's own engine: its greedy drafts are the target's tokens
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0


def test_a_cpu_draft_engine_for_a_cuda_target_gives_the_plain_greedy_tokens(target, tiny_engine):
    engine, plain = target
    tokens, stats, proposer = _speculative(engine, tiny_engine("llama-untied", "bfloat16"))
    assert proposer.executor.info.isa in ("avx512", "avx2")  # a cpu executor, with the cpu target's defaults
    assert tokens == plain
    assert stats.num_draft_tokens > 0
