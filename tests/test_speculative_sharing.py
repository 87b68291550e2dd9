"""Draft-engine catch-up: shared prompts are prefilled once in the draft engine (the n
sequences of a request, and later requests with the same prompt), and one step's catch-up
is bounded by the draft's max_num_tokens. Outputs equal decoding without drafts."""

from __future__ import annotations

from bessemer.runtime.llm import LLM, SamplingParams

from conftest import WIKITEXT
from test_speculative import assert_all_blocks_free, mixed_prompts


def assert_draft_blocks_free(llm: LLM) -> None:
    proposer = llm.llm_engine.proposer
    assert proposer.blocks.num_free == proposer.blocks.num_blocks
    assert not proposer.mirrors


def test_draft_engine_prefills_a_shared_prompt_once(smollm2_engine):
    engine = smollm2_engine("bfloat16")
    plain = LLM(engine, num_threads=2)
    prompt = plain.tokenizer.encode(WIKITEXT.read_text(encoding="utf-8")[:3000])[:300]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, n=8)
    ref = plain.generate([prompt], params)[0]
    spec = LLM(engine, num_threads=2, speculative={"method": "draft", "draft_engine": str(engine), "num_tokens": 3})
    got = spec.generate([prompt], params)[0]
    assert [c.token_ids for c in got.outputs] == [c.token_ids for c in ref.outputs]
    proposer = spec.llm_engine.proposer
    assert spec.llm_engine.stats().num_accepted_tokens > 0
    # one mirror prefills the prompt; each other one computes only the prompt's last
    # (partial) block, and each sequence at most one token a step behind its drafts
    # (the last draft of a fully accepted run); without sharing this is 8 prompts
    bound = len(prompt) + 8 * (proposer.block_size + params.max_tokens)
    assert len(prompt) <= proposer.num_prefill_tokens <= bound < 2 * len(prompt)
    # a later request with the same prompt finds it in the draft pool too
    before = proposer.num_prefill_tokens
    again = spec.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    assert again.token_ids == ref.outputs[0].token_ids
    assert proposer.num_prefill_tokens - before <= proposer.block_size + 8
    assert_all_blocks_free(spec)
    assert_draft_blocks_free(spec)


def test_draft_catch_up_is_bounded_per_step(tiny_engine):
    """A draft engine with a 16-token step: catching 10 sequences up on their prompts
    (5..63 tokens) takes several target steps, none spending more than 16 draft tokens."""
    target = tiny_engine("qwen2")
    draft = tiny_engine("qwen2", "bfloat16", max_num_tokens=16, kv_block_size=4)
    prompts = mixed_prompts(250, seed=2)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, n=2)
    ref = LLM(target, num_threads=2).generate(prompts, params)
    spec = LLM(target, num_threads=2, speculative={"method": "draft", "draft_engine": str(draft), "num_tokens": 3})
    proposer = spec.llm_engine.proposer
    per_call = []
    propose = proposer.propose

    def counted(requests):
        before = proposer.num_prefill_tokens
        out = propose(requests)
        per_call.append(proposer.num_prefill_tokens - before)
        return out

    proposer.propose = counted
    got = spec.generate(prompts, params)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in ref]
    assert max(per_call) <= 16 < sum(per_call)
    assert spec.llm_engine.stats().num_accepted_tokens > 0
    assert_all_blocks_free(spec)
    assert_draft_blocks_free(spec)
