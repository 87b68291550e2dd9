"""Batch invariance of the cuda target's kernels, run by the Triton interpreter (started with
TRITON_INTERPRET=1 by tests/test_cuda_interpreter.py): a request's tokens and logprobs (generated
and prompt) are bit-identical alone, in a batch of other requests (its decode rows next to their
prefill chunks: the GEMMs' 64-row instantiations instead of the 16-row split-K ones), with its
prefill in other chunks (other prefill tiles) and then its last prompt tokens one a step (alone
in their steps: through the decode attention kernel instead of a prefill tile, with one key
block and an empty second split, then with both splits; a decode that merged its splits
otherwise than the prefill tile merges its key blocks fails here), and after a prefix-cache
hit (its tokens and logprobs: a request that asks for prompt logprobs reads nothing from the
cache, so the hit is asked without them, and counted).

The engine: tiny Gemma 3 in w4a16 g32 (a sliding-window layer, window 6, and a full one; int4
linears whose K of 64 and 128 the decode bucket cuts into 2 and 4 parts; the tied int8 lm_head;
max_seq_len 512: two decode splits), a 69-token prompt: two 64-key attention blocks. The oracle
is the same request alone on an engine without the prefix cache; the tolerance is zero: every
GEMM instantiation of a linear sums K in the same blocks and parts (lower.py: GEMM_BLOCK_K,
split_k), and both attention kernels merge the same absolute 64-key blocks in key order
(kernels/attention.py). The kernel tests (test_kernels_attention.py, test_quantized.py) prove the
same per kernel, where a difference cannot hide behind a bf16 rounding.
"""

import numpy as np

from interp_support import torch  # noqa: F401  (skips without torch/triton; installs the interpreter fixes)

from conftest import build_once, make_tiny_checkpoint
from invariance import prompts, result, run_alone, run_mixed

from bessemer.quantization.config import QuantConfig
from bessemer.runtime.llm import LLM
from bessemer.runtime.sampling_params import SamplingParams

# 3 tokens: every step the interpreter runs costs about a second
GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=3, prompt_logprobs=2)
# the same without prompt logprobs: a request asking for them computes every prompt row and
# takes no block from the prefix cache (runtime/scheduler.py), so only this one can hit
HIT = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=3)


def run_mixed_then_hit(llm: LLM, target: list[int], others: list[list[int]], rng, hit_tokens: int) -> tuple:
    """(`target` in a batch of `others`, then alone: its tokens and logprobs) on an engine with
    the prefix cache. The batch leaves the target's full KV blocks in the cache (registered
    once its prompt logprobs are computed); alone, it must take `hit_tokens` of its prompt from
    there and compute the rest: its last prompt token a decode row beside cached keys."""
    mixed = run_mixed(llm, target, others, rng, GREEDY)
    hits = llm.blocks.num_hit_tokens
    tokens, logprobs, _ = run_alone(llm, target, HIT)
    assert llm.blocks.num_hit_tokens - hits == hit_tokens, "the prefix cache was not hit"
    return mixed, (tokens, logprobs)


def run_with_decode_rows(llm: LLM, target: list[int], chunks: tuple[int, ...]) -> tuple:
    """`target` with its first prompt tokens prefilled in `chunks` (one a step) and the rest
    one token a step (decode rows)."""
    (mine,) = llm.add_request(target, GREEDY)
    for chunk in chunks:
        llm.llm_engine.set_limits(None, chunk)
        llm.step()
    llm.llm_engine.set_limits(None, 1)
    while llm.has_unfinished():
        llm.step()
    llm.llm_engine.set_limits(None, llm.max_num_tokens)
    return result(mine)


def test_a_request_is_bit_identical_alone_batched_chunked_and_cached(run_dir):
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    # intermediate 128: every K (64, 128) a whole number of 32-wide groups
    ckpt = build_once(run_dir, "hf-gemma3-i128", lambda out: make_tiny_checkpoint(
        "gemma3", out, intermediate_size=128, max_position_embeddings=512))
    config = BuildConfig(target="cuda", dtype="bfloat16", kv_block_size=4, max_num_tokens=24, max_seq_len=512,
                         quant=QuantConfig("w4a16", group_size=32))
    engine = build_once(run_dir, "cuda-invariance-gemma3-w4a16",
                        lambda out: build_engine(ckpt, out / "engine", config)) / "engine"
    rng = np.random.default_rng(0)
    fresh = LLM(engine, interpret=True, enable_prefix_caching=False)
    target = prompts(rng, fresh.vocab_size, 1, 69, 70)[0]  # 17 KV blocks of 4 and one token
    want = run_alone(fresh, target, GREEDY)
    assert len(want[0]) == 3 and len(want[2]) == len(target)

    # chunks of 16 and 15 (want's: 24, 24, 21), then positions 63-68 as decode rows: 63 sees one
    # 64-key block (the second split empty), 64-68 two (both splits); 64 and 68 start a KV
    # block of 4, 65-67 read one part-filled
    assert run_with_decode_rows(fresh, target, (16, 16, 16, 15)) == want, \
        "prefill in chunks of 16, 16, 16, 15, then prompt tokens 64-69 one a step"

    cached = LLM(engine, interpret=True, enable_prefix_caching=True)
    mixed, hit = run_mixed_then_hit(cached, target, prompts(rng, cached.vocab_size, 3, 1, 20), rng, 68)
    assert mixed == want, "alone vs in a batch of 4 (prefix cache on; the target's miss)"
    assert hit == want[:2], "prefix-cache hit on 68 tokens: the last prompt token a decode row"


def test_fp8_and_grouped_expert_engines_are_bit_identical_alone_batched_and_cached(run_dir, tiny_checkpoint_i128):
    """The same oracle for the kernels the Gemma 3 engine does not reach, on fewer scenarios
    (each interpreted step costs about a second): a tiny Llama in fp8 at intermediate 128
    (per-token E4M3 activation scales inside the GEMM; down_proj's K of 128 split in two at
    decode) and a tiny Qwen3-MoE with w4a16 experts (tokens grouped by expert: a token's
    expert tile holds whichever other tokens that expert got). Alone vs in a batch of 4 (its
    prefill beside their decodes) and after a prefix-cache hit."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    cases = {"llama-fp8": ("llama-untied", QuantConfig("fp8", fp8_rounding="nearest")),
             "qwen3-moe-w4a16": ("qwen3-moe", QuantConfig("w4a16", group_size=32))}
    for name, (kind, quant) in cases.items():
        ckpt = tiny_checkpoint_i128(kind)
        config = BuildConfig(target="cuda", dtype="bfloat16", kv_block_size=4, max_num_tokens=24, max_seq_len=128,
                             quant=quant)
        engine = build_once(run_dir, f"cuda-invariance-{name}",
                            lambda out, ckpt=ckpt, config=config: build_engine(ckpt, out / "engine", config)) / "engine"
        rng = np.random.default_rng(1)
        fresh = LLM(engine, interpret=True, enable_prefix_caching=False)
        target = prompts(rng, fresh.vocab_size, 1, 21, 22)[0]
        want = run_alone(fresh, target, GREEDY)
        cached = LLM(engine, interpret=True, enable_prefix_caching=True)
        mixed, hit = run_mixed_then_hit(cached, target, prompts(rng, cached.vocab_size, 3, 1, 12), rng, 20)
        assert mixed == want, f"{name}: alone vs in a batch of 4"
        assert hit == want[:2], f"{name}: prefix-cache hit on 20 tokens"
