"""Oracle 1: tiny random-weight HF models per family; engine logits vs HF logits.

Prefill logits at every position for a batch of prompts of different lengths, then
decode steps (each token its own step, reading the paged KV cache) for the same batch.
"""

import numpy as np
import pytest

from bessemer.runtime.llm import LLM, SamplingParams
from conftest import NEW_FAMILIES, TINY_FAMILIES, hf_logits, moe_routing_margin
from tolerances import BF16_ERROR_RATIO, FP32_LOGITS_ATOL, FP32_LOGITS_RTOL, MOE_ROUTING_TIE_MARGIN

PROMPT_LENGTHS = [5, 17, 1, 33]


def _prompts(vocab: int, lengths, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, n).tolist() for n in lengths]


def _assert_close(actual, expected, what):
    err = np.abs(actual - expected).max()
    bound = FP32_LOGITS_ATOL + FP32_LOGITS_RTOL * np.abs(expected).max()
    assert err <= bound, f"{what}: max |engine - HF| = {err:.3g} > {bound:.3g}"


@pytest.mark.parametrize("kind", sorted(TINY_FAMILIES))
def test_prefill_and_decode_logits_match_hf(kind, tiny_checkpoint, tiny_engine):
    ckpt, engine = tiny_checkpoint(kind), tiny_engine(kind, kv_block_size=4, max_num_tokens=24)
    llm = LLM(engine, num_threads=2)
    full = _prompts(250, [n + 6 for n in PROMPT_LENGTHS])
    # prefill everything (long prompts are chunked by max_num_tokens=24)
    for ids, got in zip(full, llm.score(full)):
        _assert_close(got, hf_logits(ckpt, ids), f"{kind} prefill")
    # prefill 3 tokens, then one decode step per token, all sequences batched
    for ids, got in zip(full, llm.score(full, num_prefill=3)):
        _assert_close(got, hf_logits(ckpt, ids), f"{kind} decode")


MOE_FAMILIES = ("mixtral", "qwen2-moe", "qwen3-moe", "gpt-oss")


@pytest.mark.parametrize("kind", ["llama-untied", "qwen2", *NEW_FAMILIES])
def test_bf16_engine_error_within_twice_hf_bf16(kind, tiny_checkpoint, tiny_engine):
    """MoE: a position whose top-k routing is a near tie in HF fp32 (a gap below
    MOE_ROUTING_TIE_MARGIN) may go to another expert under bf16 rounding, which no error ratio
    bounds (Mixtral, 33-token prompt, position 27: gap 0.0023, engine error 0.448 there vs HF
    bf16's 0.020, every other position ~0.5x HF bf16's); such positions are left out, the
    others compared."""
    ckpt = tiny_checkpoint(kind)
    llm = LLM(tiny_engine(kind, "bfloat16"), num_threads=2)
    prompts = _prompts(250, PROMPT_LENGTHS)
    compared = total = 0
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=1)):
        ref32 = hf_logits(ckpt, ids)
        ref16 = hf_logits(ckpt, ids, dtype="bfloat16")
        keep = np.ones(len(ids), bool)
        if kind in MOE_FAMILIES and (margin := moe_routing_margin(ckpt, ids)) is not None:
            keep = margin >= MOE_ROUTING_TIE_MARGIN
        compared, total = compared + keep.sum(), total + len(ids)
        if not keep.any():
            continue
        ours, theirs = np.abs(got - ref32)[keep].max(), np.abs(ref16 - ref32).max()
        assert ours <= BF16_ERROR_RATIO * theirs, f"bf16 engine error {ours:.3g} vs HF bf16 error {theirs:.3g}"
    assert compared >= 0.75 * total, f"only {compared} of {total} positions away from a routing tie"


def test_batched_greedy_equals_each_prompt_alone(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=2)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    prompts = _prompts(250, [3, 20, 9, 1, 14])
    together = [o.token_ids for o in llm.generate(prompts, params)]
    alone = [llm.generate([p], params)[0].token_ids for p in prompts]
    assert together == alone
    assert all(len(t) == 12 for t in together)


@pytest.mark.parametrize("kind", ["qwen2", *NEW_FAMILIES])
def test_greedy_generation_matches_hf_generate(kind, tiny_checkpoint, tiny_engine):
    import torch
    from transformers import AutoModelForCausalLM

    ckpt = tiny_checkpoint(kind)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    llm = LLM(tiny_engine(kind), num_threads=2)
    prompts = _prompts(250, [4, 11])
    outs = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert out.token_ids == ref


def test_sampling_is_reproducible_per_seed(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=2)
    p = SamplingParams(max_tokens=8, temperature=0.9, top_k=50, top_p=0.9, seed=7, ignore_eos=True)
    a = llm.generate([[1, 2, 3]], p)[0].token_ids
    b = llm.generate([[1, 2, 3], [4, 5]], [p, SamplingParams(max_tokens=3, seed=1)])[0].token_ids
    assert a == b


def test_logprobs_are_top_k_log_softmax(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=2)
    prompt = [5, 6, 7]
    out = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0, logprobs=3, ignore_eos=True))[0]
    logits = llm.score([prompt])[0][-1].astype(np.float64)
    lp = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
    expected = np.argsort(-lp)[:3]
    assert list(out.logprobs[0]) == expected.tolist()
    assert np.allclose([out.logprobs[0][t] for t in expected], lp[expected], atol=1e-5)
    assert out.token_ids[0] == expected[0]
