"""Speculative decoding: greedy output identical to decoding without drafts (n-gram and a
draft engine; tiny models and SmolLM2; batches of mixed lengths), sampled output
distributed exactly as the target's (chi-square against the target's own probabilities),
rejected drafts' KV rolled back (no block leaks, prefix cache still right). The acceptance
rule alone, and seeded sampling identical with and without drafts: test_seeded_streams.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bessemer.errors import EngineLoadError, InvalidOptionError
from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.runtime.sampler import distribution
from bessemer.runtime.speculative.config import MAX_NGRAM
from bessemer.runtime.speculative.ngram import lookup

from conftest import make_tiny_checkpoint
from test_cli import assert_clean_error, run


def mixed_prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    """Mixed lengths; repeated stretches so that prompt lookup finds drafts."""
    rng = np.random.default_rng(seed)
    out = []
    for length in (5, 17, 40, 9, 63):
        base = rng.integers(3, vocab, size=max(3, length // 3)).tolist()
        out.append((base * 4)[:length])
    return out


def assert_all_blocks_free(llm: LLM) -> None:
    assert llm.blocks.num_free == llm.num_kv_blocks


def test_ngram_lookup_takes_the_latest_longest_match():
    assert lookup([1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3], 3, 1, 3) == [7, 5, 1]
    assert lookup([4, 1, 2, 8, 2], 2, 1, 3) == [8, 2]  # falls back to the 1-gram [2]
    assert lookup([1, 2, 3], 4, 1, 3) == []


def brute_force_lookup(tokens: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The definition, one window at a time: the longest suffix first, its latest earlier start."""
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[len(tokens) - n:]:
                return tokens[start + n:start + n + k]
    return []


def test_ngram_lookup_equals_the_definition_on_repetitive_sequences():
    rng = np.random.default_rng(0)
    for _ in range(400):
        tokens = rng.integers(0, 3, size=int(rng.integers(1, 80))).tolist()  # 3 symbols: long matches
        ngram_min = int(rng.integers(1, 4))
        ngram_max = int(rng.integers(ngram_min, MAX_NGRAM + 1))
        assert lookup(tokens, 4, ngram_min, ngram_max) == brute_force_lookup(tokens, 4, ngram_min, ngram_max)


def test_ngram_max_is_bounded_through_the_api_and_the_cli(tiny_engine):
    engine = tiny_engine("llama-untied")
    bound = rf"must be an integer in 1\.\.{MAX_NGRAM}"
    with pytest.raises(InvalidOptionError, match=r"ngram_max \(--ngram-max\) " + bound):
        LLM(engine, num_threads=2, speculative={"method": "ngram", "ngram_max": MAX_NGRAM + 1})
    with pytest.raises(InvalidOptionError, match="ngram_min " + bound):
        LLM(engine, num_threads=2, speculative={"method": "ngram", "ngram_min": 10**6, "ngram_max": 10**6})
    prompt = [5, 6, 7] * 30
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    ref = LLM(engine, num_threads=2).generate([prompt], params)[0]
    spec = LLM(engine, num_threads=2, speculative={"method": "ngram", "ngram_max": MAX_NGRAM})  # the bound itself
    assert spec.generate([prompt], params)[0].token_ids == ref.token_ids
    proc = run("run-engine", str(engine), "--prompt", "x", "--speculative", "ngram", "--ngram-max", str(10**6))
    assert_clean_error(proc, "--ngram-max", f"1..{MAX_NGRAM}")


def test_ngram_greedy_equals_plain_decoding_in_mixed_batches(tiny_engine):
    engine = tiny_engine("llama-untied", kv_block_size=4)
    prompts = mixed_prompts(250)
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=1)
    plain = LLM(engine, num_threads=2).generate(prompts, params)
    spec = LLM(engine, num_threads=2, speculative={"method": "ngram", "num_tokens": 3, "ngram_max": 3})
    got = spec.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    assert [o.finish_reason for o in got] == ["length"] * len(prompts)
    assert [[sorted(e) for e in o.logprobs] for o in got] == [[sorted(e) for e in o.logprobs] for o in plain]
    stats = spec.llm_engine.stats()
    assert stats.num_draft_tokens > 0 and 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert_all_blocks_free(spec)
    # the rolled-back cache serves a prefix-cache hit that gives the same tokens again
    again = spec.generate([prompts[4] + plain[4].token_ids[:20]], SamplingParams(max_tokens=8, temperature=0,
                                                                                 ignore_eos=True))[0]
    assert spec.blocks.num_hit_tokens > 0
    assert again.token_ids == plain[4].token_ids[20:28]


def test_draft_engine_greedy_equals_plain_decoding(tiny_engine):
    target = tiny_engine("qwen2")
    draft = tiny_engine("qwen2", "bfloat16")
    prompts = mixed_prompts(250, seed=1)
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    plain = LLM(target, num_threads=2).generate(prompts, params)
    spec = LLM(target, num_threads=2, speculative={"method": "draft", "draft_engine": str(draft), "num_tokens": 4})
    got = spec.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in plain]
    stats = spec.llm_engine.stats()
    # a bf16 build of the same weights agrees with the target almost always
    assert stats.num_accepted_tokens > 0.8 * stats.num_draft_tokens > 0
    assert_all_blocks_free(spec)
    assert spec.llm_engine.proposer.blocks.num_free == spec.llm_engine.proposer.blocks.num_blocks
    assert not spec.llm_engine.proposer.mirrors


def test_stop_strings_n_and_streaming_with_speculation(smollm2_engine):
    engine = smollm2_engine("bfloat16")
    passage = ("The old lighthouse keeper climbed the stairs every evening, lit the lamp, and watched the "
               "ships pass in the dark until the morning came.")
    prompt = f"Repeat the passage exactly.\nPassage: {passage}\nRepeated: {passage[:40]}"
    plain, spec = LLM(engine, num_threads=2), LLM(engine, num_threads=2, speculative="ngram")
    for params in (SamplingParams(max_tokens=48, temperature=0, stop=[" ships"]),
                   SamplingParams(max_tokens=30, temperature=0, n=2, logprobs=2)):
        ref = plain.generate([prompt], params)[0]
        deltas: list[str] = []
        got = spec.generate([prompt], params, on_delta=lambda i, d: deltas.append(d))[0]
        assert [(c.token_ids, c.text, c.finish_reason) for c in got.outputs] == \
               [(c.token_ids, c.text, c.finish_reason) for c in ref.outputs]
        if params.n == 1:
            assert "".join(deltas) == ref.text
    assert plain.generate([prompt], SamplingParams(max_tokens=48, temperature=0, stop=[" ships"]))[0].finish_reason \
        == "stop"  # the stop string was reached (and cut) in the comparison above
    stats = spec.llm_engine.stats()
    assert stats.num_accepted_tokens > 10  # the passage is copied: most drafts are accepted
    assert_all_blocks_free(spec)


def test_smollm2_greedy_identical_ngram_and_draft_engine(smollm2_engine):
    target, draft = smollm2_engine("float32"), smollm2_engine("bfloat16")
    prompts = ["Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
               "Write the alphabet: A B C D E F G",
               "The capital of France is",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]
    params = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
    ref = [o.token_ids for o in LLM(target, num_threads=2).generate(prompts, params)]
    for spec in ({"method": "ngram", "num_tokens": 4},
                 {"method": "draft", "draft_engine": str(draft), "num_tokens": 3}):
        llm = LLM(target, num_threads=2, speculative=spec)
        assert [o.token_ids for o in llm.generate(prompts, params)] == ref, spec
        assert llm.llm_engine.stats().num_accepted_tokens > 0
        assert_all_blocks_free(llm)


# ---- sampling: the emitted tokens follow the target's distribution exactly ----
def chi_square_p_value(observed: np.ndarray, expected: np.ndarray) -> float:
    """Pearson's test, cells with expected count < 5 pooled; Wilson-Hilferty for the
    chi-square tail (accurate to ~1e-3 at these degrees of freedom)."""
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = len(obs) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_speculative_sampling_distribution_equals_target(tiny_engine, tiny_checkpoint, tmp_path_factory, method):
    """Pairs (t1, t2) of sampled tokens: t2 comes from a step that verified drafts. Their
    frequencies must match p(t1) p(t2 | t1), computed from the target's own logits."""
    engine = tiny_engine("llama-untied")
    top_k, temperature, samples = 4, 1.0, 3000
    llm_plain = LLM(engine, num_threads=2)
    # the prompt holds the model's own greedy continuation of its last tokens, so prompt
    # lookup drafts tokens the target often (not always) samples
    start = [7, 11, 13]
    greedy = llm_plain.generate([start], SamplingParams(max_tokens=60, temperature=0, ignore_eos=True))[0]
    prompt = start + greedy.token_ids + start
    c1, p1 = distribution(llm_plain.score([prompt])[0][-1], temperature, top_k, 1.0)
    seconds = llm_plain.score([prompt + [int(t)] for t in c1])
    expected = {}
    for t1, p_t1, logits in zip(c1, p1, seconds):
        c2, p2 = distribution(logits[-1], temperature, top_k, 1.0)
        for t2, p_t2 in zip(c2, p2):
            expected[(int(t1), int(t2))] = p_t1 * p_t2
    if method == "ngram":
        spec = {"method": "ngram", "num_tokens": 2}
    else:  # another model's weights: q far from p, so the residual draw matters
        other = make_tiny_checkpoint("llama-untied", tmp_path_factory.mktemp("hf-draft"), seed=1)
        from bessemer.builder.build import build_engine
        from bessemer.builder.config import BuildConfig

        draft = tmp_path_factory.mktemp("draft-engine") / "engine"
        build_engine(other, draft, BuildConfig())
        spec = {"method": "draft", "draft_engine": str(draft), "num_tokens": 2}
    llm = LLM(engine, num_threads=2, speculative=spec)
    params = SamplingParams(max_tokens=3, temperature=temperature, top_k=top_k, seed=1000, n=samples, ignore_eos=True)
    out = llm.generate([prompt], params)[0]
    stats = llm.llm_engine.stats()
    assert stats.num_draft_tokens > samples // 10  # second tokens that came from verification steps
    # prompt lookup's drafts are the model's own greedy text: often its draw too; another
    # model's drafts rarely are (acceptance.py), and the tokens must follow p all the same
    assert stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.num_accepted_tokens > 0 or method == "draft"
    keys = sorted(expected)
    counts = {k: 0 for k in keys}
    for c in out.outputs:
        counts[tuple(c.token_ids[:2])] += 1  # a pair outside top-k would raise KeyError
    observed = np.array([counts[k] for k in keys], dtype=np.float64)
    exp = np.array([expected[k] for k in keys]) * samples
    assert chi_square_p_value(observed, exp) > 1e-3, (observed, exp)


def test_bad_speculative_options():
    from bessemer.runtime.speculative import SpeculativeConfig

    with pytest.raises(InvalidOptionError, match="unknown"):
        SpeculativeConfig.parse("medusa")
    with pytest.raises(InvalidOptionError, match="draft engine"):
        SpeculativeConfig.parse({"method": "draft"})
    with pytest.raises(InvalidOptionError, match="num_tokens"):
        SpeculativeConfig.parse({"method": "ngram", "num_tokens": 0})


def test_draft_engine_with_another_vocabulary_is_refused(tiny_engine, smollm2_engine):
    with pytest.raises(EngineLoadError, match="tokenizer"):
        LLM(tiny_engine("llama-untied"), num_threads=2,
            speculative={"method": "draft", "draft_engine": str(smollm2_engine("bfloat16"))})
