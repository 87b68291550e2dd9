"""Sampling controls against NumPy references of their definitions."""

import numpy as np
import pytest

from bessemer.errors import InvalidOptionError
from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.runtime.sampler import apply_penalties, sample


def test_penalties_follow_their_definitions():
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0], dtype=np.float32)
    rep = apply_penalties(logits, [0], [1, 1], 2.0, 0.0, 0.0)
    assert np.allclose(rep, [1.0, -2.0, 0.5, 3.0, -2.0])  # positive / p, negative * p
    pf = apply_penalties(logits, [0], [1, 1, 3], 1.0, 0.5, 0.25)
    assert np.allclose(pf, [2.0, -1.0 - 0.5 - 0.5, 0.5, 3.0 - 0.5 - 0.25, -2.0])  # prompt tokens untouched
    assert apply_penalties(logits, [0], [1], 1.0, 0.0, 0.0) is logits


def test_top_k_top_p_min_p_restrict_the_support():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.07, 0.03])).astype(np.float32)
    rng = np.random.default_rng(0)
    draw = lambda **kw: {sample(logits, 1.0, uniform=rng.random(), **kw) for _ in range(400)}
    assert draw(top_k=2, top_p=1.0) == {0, 1}
    assert draw(top_k=0, top_p=0.7) == {0, 1}  # 0.5 + 0.25 reaches 0.7
    assert draw(top_k=0, top_p=1.0, min_p=0.3) == {0, 1}  # >= 0.3 * 0.5
    assert draw(top_k=0, top_p=1.0) == {0, 1, 2, 3, 4}
    assert sample(logits, 0.0, 0, 1.0, rng.random()) == 0


def test_min_tokens_n_and_invalid_params(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=2)
    greedy = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    stop = greedy.token_ids[0]  # greedy would stop at once on this token...
    out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=6, temperature=0, stop_token_ids=[stop],
                                                   min_tokens=3))[0]
    assert stop not in out.token_ids[:3] and len(out.token_ids) >= 4  # ...but not before 3 tokens
    multi = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=1.0, seed=3, n=3, ignore_eos=True))[0]
    assert [c.index for c in multi.outputs] == [0, 1, 2]
    alone = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=5, temperature=1.0, seed=4, ignore_eos=True))[0]
    assert multi.outputs[1].token_ids == alone.token_ids  # completion i uses seed + i
    for bad in (dict(n=0), dict(min_p=2.0), dict(presence_penalty=3.0), dict(repetition_penalty=0.0),
                dict(min_tokens=9, max_tokens=4)):
        with pytest.raises(InvalidOptionError):
            SamplingParams(**bad)


def slipped_past_validation(params: SamplingParams, **values) -> SamplingParams:
    """`params` with values SamplingParams would refuse: what reached the sampler before
    validation existed, and what any future gap in it would let through."""
    for name, value in values.items():
        object.__setattr__(params, name, value)
    return params


def test_a_sequence_that_fails_inside_a_step_ends_alone(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=2)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    alone = llm.generate([[1, 2, 3], [4, 5, 6]], params)
    # two faults raised by the sampler in the middle of a batch: more logprobs than the
    # vocabulary has (valid for SamplingParams, which does not know the vocabulary), and
    # a NaN temperature
    too_many = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=llm.vocab_size + 10)
    nan = slipped_past_validation(SamplingParams(max_tokens=6, ignore_eos=True), temperature=float("nan"))
    out = llm.generate([[1, 2, 3], [7, 8], [4, 5, 6], [9]], [params, too_many, params, nan])
    assert [out[0].token_ids, out[2].token_ids] == [alone[0].token_ids, alone[1].token_ids]
    assert [o.finish_reason for o in out] == ["length", "error", "length", "error"]
    assert "kth" in out[1].outputs[0].error and "NaN" in out[3].outputs[0].error
    assert llm.blocks.num_free == llm.blocks.num_blocks  # the failed ones gave their blocks back
