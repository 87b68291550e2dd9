"""Sampling that depends only on the request: a seeded request's tokens are the same alone, in
batches of other requests, after a prefix-cache hit, with its prefill in chunks, on a fresh
engine, as completion i of n, and with n-gram or draft-engine speculation; greedy tokens and
logprobs are bit-identical with and without drafts.

Oracles: the stream is checked against the documented pure function written out again here
(and SplitMix64's published first output); the sampler against the device sampler's
reference (plugins/ops.ref_sample_rows, the inverse CDF in vocabulary order); every engine
case against the same request run alone on a fresh engine without the prefix cache or
drafts, with tolerance zero (batch-invariant kernels, test_batch_invariance.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from invariance import skip_if_auto_runs_avx2

from bessemer.plugins.ops import ref_sample_rows
from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.runtime.random_stream import TOKEN, RandomStream, mix64
from bessemer.runtime.sampler import sample
from bessemer.runtime.speculative.acceptance import accept

M64 = (1 << 64) - 1


def documented_uniform(key: int, position: int, purpose: int) -> float:
    """random_stream's docstring, spelled out on NumPy uint64 words (wrapping arithmetic)."""
    def mix(z: np.uint64) -> np.uint64:
        with np.errstate(over="ignore"):
            z = np.uint64(z) + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))
    bits = mix(mix(mix(np.uint64(key & M64)) ^ np.uint64(position)) ^ np.uint64(purpose))
    return int(bits >> np.uint64(11)) / 2.0 ** 53


def test_the_stream_is_the_documented_pure_function():
    assert mix64(0) == 0xE220A8397B1DCDAF  # SplitMix64 seeded with 0: its first output
    rng = np.random.default_rng(0)
    keys = [0, 1, 2**63 - 1, 2**63 + 5, -1] + [int(k) for k in rng.integers(0, 2**63, 20)]
    for key in keys:
        for position in (0, 1, 7, 2047, 10**6):
            for purpose in (TOKEN, 1, 3):
                u = RandomStream(key).uniform(position, purpose)
                assert u == documented_uniform(key, position, purpose)
                assert 0.0 <= u < 1.0
    # a pure function: asking again, or in another order, gives the same number
    stream = RandomStream(42)
    forward = [stream.uniform(p) for p in range(50)]
    assert [stream.uniform(p) for p in reversed(range(50))] == forward[::-1]


def test_the_streams_numbers_are_uniform_and_unrelated():
    """Kolmogorov-Smirnov over 20000 numbers of neighbouring keys and positions (the cases a
    weak mix would correlate), and no correlation between a key's and the next key's."""
    u = np.array([[RandomStream(key).uniform(p) for p in range(200)] for key in range(100)])  # (keys, positions)
    ordered = np.sort(u.ravel())
    n = len(ordered)
    ks = max(np.max(np.arange(1, n + 1) / n - ordered), np.max(ordered - np.arange(n) / n))
    assert ks < 1.63 / math.sqrt(n)  # the 1% critical value
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.03  # key k vs k + 1, ~4.5 sigma
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.03  # position p vs p + 1


def test_sample_is_the_inverse_cdf_in_vocabulary_order():
    """The host's draw is the device sampler's rule (ref_sample_rows), so one uniform gives
    one token whichever of them samples; ties-free logits, so top-k and top-p agree."""
    rng = np.random.default_rng(1)
    for _ in range(300):
        vocab = int(rng.integers(2, 60))
        logits = (rng.normal(size=vocab) * rng.uniform(0.5, 4)).astype(np.float32)
        temperature, top_k = float(rng.uniform(0.3, 2.0)), int(rng.integers(0, vocab + 1))
        top_p, u = float(rng.choice([1.0, rng.uniform(0.2, 1.0)])), float(rng.random())
        want = ref_sample_rows(logits[None], [temperature], [top_k], [top_p], [u])[0]
        assert sample(logits, temperature, top_k, top_p, u) == want


def test_accepted_drafts_are_the_targets_own_draws():
    """The acceptance rule alone, on fixed p and q: whatever the draft (one drawn from q with
    the position's uniform, as a draft engine draws; a fixed token, as prompt lookup
    proposes), the first emitted token is the target's own draw, so ~ p; a draft from q is
    accepted exactly when both inverse CDFs pick the same token."""
    p_logits = np.log(np.array([0.1, 0.4, 0.3, 0.2, 1e-9])).astype(np.float32)
    q_logits = np.log(np.array([0.1, 0.35, 0.25, 0.25, 0.05])).astype(np.float32)
    stream, n = RandomStream(9), 6000
    counts, accepted = np.zeros(5), 0
    for position in range(n):
        u = stream.uniform(position)
        own = sample(p_logits, 1.0, 0, 1.0, u)
        for draft in (sample(q_logits, 1.0, 0, 1.0, u), 1):
            out = accept(lambda i: sample(p_logits, 1.0, 0, 1.0, u) if i == 0 else -1, [draft])
            assert out == ([draft, -1] if draft == own else [own])
        accepted += sample(q_logits, 1.0, 0, 1.0, u) == own
        counts[own] += 1
    p = np.exp(p_logits.astype(np.float64)) / np.exp(p_logits.astype(np.float64)).sum()
    assert np.all(np.abs(counts / n - p) < 4 * np.sqrt(p * (1 - p) / n) + 1e-9), counts / n
    # the CDFs' intervals in vocabulary order: p [0,.1) [.1,.5) [.5,.8) [.8,1); q [0,.1) [.1,.45)
    # [.45,.7) [.7,.95): overlaps .1 + .35 + .2 + .15
    assert abs(accepted / n - 0.8) < 4 * math.sqrt(0.8 * 0.2 / n)


# ---- real engines ----
PASSAGE = ("The old lighthouse keeper climbed the stairs every evening, lit the lamp, and watched the "
           "ships pass in the dark until the morning came.")
PROMPT = f"Repeat the passage exactly.\nPassage: {PASSAGE}\nRepeated: {PASSAGE[:40]}"
SEEDED = SamplingParams(max_tokens=12, temperature=0.8, seed=1234, ignore_eos=True, logprobs=2)


def tokens_of(llm: LLM, prompt, params: SamplingParams) -> list[list[int]]:
    return [c.token_ids for c in llm.generate([prompt], params)[0].outputs]


@pytest.fixture(scope="module")
def smol(smollm2_engine):
    """SmolLM2 bf16: the engine dir, a fresh LLM without prefix cache, and the seeded
    request's prompt ids and tokens alone on it (the reference)."""
    engine = smollm2_engine("bfloat16")
    fresh = LLM(engine, num_threads=2, enable_prefix_caching=False)
    ids = fresh.tokenizer.encode(PROMPT)
    return engine, fresh, ids, tokens_of(fresh, ids, SEEDED)[0]


@pytest.mark.slow
def test_a_seeded_request_is_the_same_in_batches_cached_chunked_and_restarted(smol):
    engine, fresh, ids, want = smol
    rng = np.random.default_rng(0)
    vocab = fresh.vocab_size
    for composition in range(3):  # others joining before and with it, seeded and not, greedy and sampled
        others = [[int(t) for t in rng.integers(3, vocab, int(rng.integers(2, 40)))]
                  for _ in range(int(rng.integers(1, 6)))]
        kinds = [SamplingParams(max_tokens=int(rng.integers(1, 10)), temperature=float(rng.choice([0.0, 1.0])),
                                seed=None if rng.random() < 0.5 else int(rng.integers(0, 100)), ignore_eos=True)
                 for _ in others]
        split = int(rng.integers(0, len(others) + 1))
        for o, p in zip(others[:split], kinds[:split]):
            fresh.add_request(o, p)
        for _ in range(int(rng.integers(0, 3))):
            fresh.step()
        (mine,) = fresh.add_request(ids, SEEDED)
        for o, p in zip(others[split:], kinds[split:]):
            fresh.add_request(o, p)
        while fresh.has_unfinished():
            fresh.step()
        assert mine.output_token_ids == want, f"alone vs batch composition {composition}"
    for chunk in (5, 16):
        fresh.llm_engine.set_limits(None, chunk)
        assert tokens_of(fresh, ids, SEEDED)[0] == want, f"prefill in chunks of {chunk}"
    fresh.llm_engine.set_limits(None, fresh.max_num_tokens)

    cached = LLM(engine, num_threads=2, enable_prefix_caching=True)
    cached.generate(["An unrelated request first, so that arrival order differs."], SEEDED)
    assert tokens_of(cached, ids, SEEDED)[0] == want, "prefix-cache miss (another arrival order)"
    hits = cached.blocks.num_hit_tokens
    assert tokens_of(cached, ids, SEEDED)[0] == want, "prefix-cache hit"
    assert cached.blocks.num_hit_tokens > hits

    # n = 3: completion i is the request with seed + i (sampling_params.n), each alone
    three = tokens_of(cached, ids, SamplingParams(**{**vars(SEEDED), "n": 3}))
    assert three[0] == want
    assert three[1:] == [tokens_of(fresh, ids, SamplingParams(**{**vars(SEEDED), "seed": SEEDED.seed + i}))[0]
                         for i in (1, 2)]
    assert three[1] != three[2]


@pytest.mark.slow
def test_seeds_differ_and_unseeded_requests_are_not_fixed(smol):
    engine, fresh, ids, want = smol
    other_seed = tokens_of(fresh, ids, SamplingParams(**{**vars(SEEDED), "seed": 99}))[0]
    assert other_seed != want
    unseeded = SamplingParams(**{**vars(SEEDED), "seed": None})
    first, second = tokens_of(fresh, ids, unseeded)[0], tokens_of(fresh, ids, unseeded)[0]
    assert first != second  # another arrival order, another stream
    # without a seed, the stream is the engine's seed + the arrival order (LLM(seed=...)):
    # the same requests in the same order on a fresh engine repeat; another engine seed does not
    again = LLM(engine, num_threads=2, enable_prefix_caching=False)
    assert tokens_of(again, ids, SEEDED)[0] == want  # arrival 0, seeded: not the engine's seed
    seeded_engine = [tokens_of(LLM(engine, num_threads=2, seed=s), ids, unseeded)[0] for s in (5, 5, 6)]
    assert seeded_engine[0] == seeded_engine[1] != seeded_engine[2]


NGRAM = {"method": "ngram", "num_tokens": 4}


@pytest.mark.slow
def test_a_seeded_request_is_the_same_with_ngram_and_draft_engine_speculation(smol, smollm2_engine):
    engine, fresh, ids, want = smol
    params = SamplingParams(max_tokens=40, temperature=0.5, top_k=20, seed=7, ignore_eos=True, logprobs=2)
    ref = fresh.generate([ids], params)[0].outputs[0]
    draft = smollm2_engine("float32")
    for spec in (NGRAM, {"method": "draft", "draft_engine": str(draft), "num_tokens": 3}):
        llm = LLM(engine, num_threads=2, speculative=spec)
        got = llm.generate([ids], params)[0].outputs[0]
        stats = llm.llm_engine.stats()
        assert stats.num_accepted_tokens > 0, spec
        if spec is NGRAM:  # rejected drafts too (the fp32 draft of a bf16 target may agree on all)
            assert stats.num_accepted_tokens < stats.num_draft_tokens
        assert got.token_ids == ref.token_ids, spec
        assert got.logprobs == ref.logprobs, spec  # the verify step's rows are the decode steps' bits
        # and the n = 2 completions with it, in one batch
        two = tokens_of(llm, ids, SamplingParams(**{**vars(params), "n": 2}))
        assert two == [ref.token_ids, tokens_of(fresh, ids, SamplingParams(**{**vars(params), "seed": 8}))[0]]


SPEC_ENGINES = [("float32", "auto"), ("bfloat16", "auto"), ("bfloat16", "avx2")]


@pytest.fixture(scope="module", params=SPEC_ENGINES, ids=lambda p: "-".join(p))
def spec_engine(request, smollm2_engine):
    dtype, isa = request.param
    engine = smollm2_engine(dtype)
    skip_if_auto_runs_avx2(engine, isa, (dtype, "auto") in SPEC_ENGINES)
    return engine, isa


@pytest.mark.slow
def test_greedy_tokens_and_logprobs_are_bit_identical_with_and_without_drafts(spec_engine, smollm2_engine):
    engine, isa = spec_engine
    prompts = ["Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat",
               "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n", "The capital of France is"]
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=3)
    ref = [o.outputs[0] for o in LLM(engine, num_threads=2, isa=isa).generate(prompts, params)]
    other = smollm2_engine("bfloat16" if "float32" in str(engine) else "float32")
    for spec in (NGRAM, {"method": "draft", "draft_engine": str(other), "num_tokens": 3}):
        llm = LLM(engine, num_threads=2, isa=isa, speculative=spec)
        got = [o.outputs[0] for o in llm.generate(prompts, params)]
        assert llm.llm_engine.stats().num_accepted_tokens > 0, spec
        assert [g.token_ids for g in got] == [r.token_ids for r in ref], spec
        assert [g.logprobs for g in got] == [r.logprobs for r in ref], spec  # floats compared exactly
