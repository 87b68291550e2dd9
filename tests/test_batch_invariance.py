"""Batch invariance on real engines: a request's tokens and logprobs (generated and prompt) are
bit-identical whether it runs alone, inside random batches of 1..16 other requests of other
lengths (its prefill next to their decodes, its decodes next to their prefills), after a
prefix-cache hit on its prompt, or with its prefill cut into chunks by max_num_tokens.

The oracle is the same request run alone on a fresh engine without the prefix cache; the
tolerance is zero (the kernels fix every reduction order per shape, never per batch:
targets/cpu/csrc/kernels/linear_driver.h, attention.cpp). bench/batch_invariance.py
finds the kernel when one of these fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import WIKITEXT, build_once
from invariance import HIT, MAX_TOKENS, prompts, run_alone, run_mixed, skip_if_auto_runs_avx2

from bessemer.runtime.llm import LLM

NUM_COMPOSITIONS = 2  # random batch compositions per engine


def smollm2_quantized(smollm2_dir, run_dir, mode: str):
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.config import QuantConfig

    extra = dict(calib_data=str(WIKITEXT), calib_samples=4, calib_seq_len=64, calib_backend="native") \
        if mode == "w8a8-sq" else {}
    config = BuildConfig(dtype="bfloat16", max_seq_len=512, quant=QuantConfig(mode, **extra))
    return build_once(run_dir, f"invariance-smollm2-{mode}",
                      lambda out: build_engine(smollm2_dir, out / "engine", config)) / "engine"


def tiny_options(mode: str) -> tuple[str, dict]:
    """(dtype, build options) of a tiny engine: a dtype, a quantization of every linear, or
    tp2 (two ranks, the one engine test_tp_health and test_diff build)."""
    from bessemer.quantization.config import QuantConfig

    if mode == "tp2":
        return "float32", dict(tp_size=2)
    if mode.startswith("kv-"):  # a one-byte KV cache: codes and a scale per (token, head) written as it comes
        return "bfloat16", dict(kv_block_size=4, kv_cache_dtype=mode[3:])
    quant = {"fp8": QuantConfig("fp8", fp8_rounding="nearest", fp8_activations="dynamic", lm_head="none"),
             "w4a16": QuantConfig("w4a16", group_size=32, lm_head="none"),
             "w8a16": QuantConfig("w8a16", lm_head="none"),
             "w4k": QuantConfig("w4k", lm_head="none")}.get(mode)
    return ("float32", dict(kv_block_size=4, quant=quant)) if quant else (mode, dict(kv_block_size=4))


def get_engine(param, smollm2_dir, smollm2_engine, tiny_engine, run_dir):
    family, mode, isa = param
    if family != "smollm2":
        dtype, options = tiny_options(mode)
        return tiny_engine(family, dtype, **options), isa
    if mode in ("float32", "bfloat16"):
        return smollm2_engine(mode), isa
    return smollm2_quantized(smollm2_dir, run_dir, mode), isa


# (family, mode, isa): an "avx2" case beside an "auto" one tests the fallback where auto picks
# AVX-512, and is skipped where auto picks AVX2 (invariance.skip_if_auto_runs_avx2)
ENGINES = [
    ("smollm2", "float32", "auto"), ("smollm2", "bfloat16", "auto"), ("smollm2", "bfloat16", "avx2"),
    ("smollm2", "w4a16", "auto"), ("smollm2", "w8a8-sq", "auto"), ("smollm2", "w4a8", "auto"),
    ("smollm2", "w4a8", "avx2"),
    ("mistral", "float32", "auto"), ("gemma3", "bfloat16", "auto"),
    ("llama-untied", "fp8", "auto"), ("llama-untied", "fp8", "avx2"),
    ("qwen3-moe", "float32", "auto"), ("qwen3-moe", "w4a16", "auto"), ("mixtral", "w4a16", "avx2"),
    ("qwen3-moe", "w8a16", "auto"), ("qwen3-moe", "fp8", "auto"), ("gpt-oss", "w4k", "auto"),
    ("llama-untied", "kv-int8", "auto"), ("llama-untied", "kv-fp8", "auto"),
    ("llama-untied", "tp2", "auto"),
]


@pytest.fixture(scope="module", params=ENGINES, ids=lambda p: "-".join(p))
def engine(request, smollm2_dir, smollm2_engine, tiny_engine, run_dir):
    """(engine dir, isa): SmolLM2 in fp32, bf16 (both ISAs), w4a16, w8a8-sq, w4a8 (both ISAs); tiny Mistral and
    Gemma 3 (sliding-window layers: blocks of keys starting inside a window); tiny Llama in fp8 (dynamic
    per-token activation scales, both ISAs); tiny MoEs (Qwen3-MoE fp32, w4a16, w8a16 and fp8 experts, gpt-oss
    with w4k linears, Mixtral w4a16 on AVX2: a token's experts must not depend on which other tokens share them);
    tiny Llama with int8 and fp8 KV caches (a row's codes and scale depend on that row alone); tiny Llama on two
    tensor-parallel ranks. TP=2 is compared with itself only: its all-reduce adds the two ranks' partial sums of each
    row-parallel linear, an order of the sum TP=1 does not have, so TP=2 vs TP=1 is close
    (test_tensor_parallel.py) but not bit-identical."""
    engine_dir, isa = get_engine(request.param, smollm2_dir, smollm2_engine, tiny_engine, run_dir)
    skip_if_auto_runs_avx2(engine_dir, isa, (*request.param[:2], "auto") in ENGINES)
    return engine_dir, isa


@pytest.fixture(scope="module", params=[
    ("smollm2", "bfloat16", "auto"), ("gemma3", "bfloat16", "auto"),
], ids=lambda p: "-".join(p))
def long_engine(request, smollm2_dir, smollm2_engine, tiny_engine, run_dir):
    """SmolLM2 bf16 and tiny Gemma 3 (a full-attention layer past one key block, sliding ones
    inside it) for prompts longer than one attention key block."""
    return get_engine(request.param, smollm2_dir, smollm2_engine, tiny_engine, run_dir)


def test_a_request_is_bit_identical_alone_batched_cached_and_chunked(engine):
    engine_dir, isa = engine
    rng = np.random.default_rng(0)
    fresh = LLM(engine_dir, num_threads=2, isa=isa, enable_prefix_caching=False)
    vocab = fresh.vocab_size
    target = prompts(rng, vocab, 1, 35, 45)[0]
    want = run_alone(fresh, target)
    assert len(want[0]) == MAX_TOKENS and len(want[1]) == MAX_TOKENS

    # batches: 1..16 others of other lengths, prefill and decode in the same steps
    for k in rng.choice(np.arange(1, 17), NUM_COMPOSITIONS, replace=False):
        got = run_mixed(fresh, target, prompts(rng, vocab, int(k), 1, 40), rng)
        assert got == want, f"alone vs in a batch of {k + 1}"

    # chunked prefill: the prompt over several steps, each chunk reading the earlier ones
    for chunk in (7, 33):
        fresh.llm_engine.set_limits(None, chunk)
        assert run_alone(fresh, target) == want, f"prefill in chunks of {chunk} tokens"
    fresh.llm_engine.set_limits(None, fresh.max_num_tokens)

    # threads: the governor (bessemer/thread_policy.py) steps with fewer threads under load
    one_thread = LLM(engine_dir, num_threads=1, isa=isa, enable_prefix_caching=False)
    assert run_alone(one_thread, target) == want, "1 thread vs 2"
    assert run_mixed(one_thread, target, prompts(rng, vocab, 5, 1, 40), rng) == want, "1 thread, in a batch of 6"

    # prefix cache: the same prompt again (a hit on its full blocks), and a prompt sharing its
    # first 32 tokens, against that prompt alone on an engine without the cache; the hits are
    # asked without prompt logprobs (HIT), the only requests that read the cache, and counted
    cached = LLM(engine_dir, num_threads=2, isa=isa, enable_prefix_caching=True)
    assert run_alone(cached, target) == want, "prefix cache on (a request with prompt logprobs: not read)"
    bs, hits = cached.block_size, cached.blocks.num_hit_tokens
    assert run_alone(cached, target, HIT)[:2] == want[:2], "prefix-cache hit"
    assert cached.blocks.num_hit_tokens - hits == (len(target) - 1) // bs * bs, "the prompt's full blocks hit"
    sibling, hits = target[:32] + prompts(rng, vocab, 1, 5, 10)[0], cached.blocks.num_hit_tokens
    assert run_alone(cached, sibling, HIT)[:2] == run_alone(fresh, sibling, HIT)[:2], "hit on a shared prefix"
    assert cached.blocks.num_hit_tokens - hits == 32 // bs * bs, "the shared prefix's full blocks hit"


def test_a_long_request_is_bit_identical_alone_batched_and_chunked(long_engine):
    """Prompts of 3-4 attention key blocks (64 keys each, attention.cpp): past the first block
    a row's result must still not depend on its batch (alone vs with 4 others) or on its
    prefill's chunks (2 tokens: the decode-row path; 33: the tiles)."""
    engine_dir, isa = long_engine
    rng = np.random.default_rng(1)
    llm = LLM(engine_dir, num_threads=2, isa=isa, enable_prefix_caching=False)
    target = prompts(rng, llm.vocab_size, 1, 150, 200)[0]
    want = run_alone(llm, target)
    got = run_mixed(llm, target, prompts(rng, llm.vocab_size, 4, 1, 40), rng)
    assert got == want, "alone vs in a batch of 5"
    for chunk in (2, 33):
        llm.llm_engine.set_limits(None, chunk)
        assert run_alone(llm, target) == want, f"prefill in chunks of {chunk} tokens"
