"""What the batch-invariance tests share (tests/test_batch_invariance.py on the cpu target,
tests/cuda_interpreter/test_batch_invariance_cuda.py on the cuda one): a greedy request with
logprobs run alone, or joining random batches of other requests, and what of it must be
bit-identical."""

from __future__ import annotations

import numpy as np

from bessemer.runtime.llm import LLM
from bessemer.runtime.sampling_params import SamplingParams

MAX_TOKENS = 6
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3, prompt_logprobs=2)
# GREEDY without prompt logprobs: a request that asks for them computes every prompt row and
# takes no block from the prefix cache (runtime/scheduler.py), so a hit is asked with this
HIT = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=3)


def bits(a) -> np.ndarray:
    """fp32 values as their raw bits, for comparisons where -0.0 vs 0.0 or two NaNs count."""
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def skip_if_auto_runs_avx2(engine, isa: str, auto_case_exists: bool) -> None:
    """Skips an isa="avx2" case whose isa="auto" twin runs in the same test on this CPU:
    where auto picks AVX2 (no AVX-512), the two cases run the same kernels on the same
    inputs. The executor, not a copy of its rule, says what auto picks."""
    import pytest

    if isa == "avx2" and auto_case_exists and LLM(engine, num_threads=1).executor.info.isa == "avx2":
        pytest.skip("isa auto runs AVX2 on this CPU: the auto case of this engine runs these kernels")


def result(seq) -> tuple:
    """What must be bit-identical: generated ids, their logprobs, the prompt logprobs."""
    return seq.output_token_ids, seq.logprobs, seq.prompt_logprobs


def run_alone(llm: LLM, prompt: list[int], params: SamplingParams = GREEDY) -> tuple:
    out = llm.generate([prompt], params)[0]
    return out.outputs[0].token_ids, out.outputs[0].logprobs, out.prompt_logprobs


def run_mixed(llm: LLM, target: list[int], others: list[list[int]], rng: np.random.Generator,
              params: SamplingParams = GREEDY) -> tuple:
    """`target` joins after a random number of steps of some of `others` (its prefill then
    shares steps with their decodes), the rest join with it; all run to the end."""
    split = int(rng.integers(0, len(others) + 1))
    for ids in others[:split]:
        llm.add_request(ids, SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 8)), ignore_eos=True))
    for _ in range(int(rng.integers(0, 4))):
        llm.step()
    (mine,) = llm.add_request(target, params)
    for ids in others[split:]:
        llm.add_request(ids, SamplingParams(temperature=0.0, max_tokens=int(rng.integers(1, 8)), ignore_eos=True))
    while llm.has_unfinished():
        llm.step()
    return result(mine)


def prompts(rng: np.random.Generator, vocab: int, n: int, lo: int, hi: int) -> list[list[int]]:
    return [[int(t) for t in rng.integers(3, vocab, int(rng.integers(lo, hi)))] for _ in range(n)]


def assert_same_alone_and_in_batches(llm: LLM, sizes: tuple[int, ...] = (3, 16), seed: int = 0) -> None:
    """A 35..45-token request's tokens and logprobs are bit-identical alone and inside batches
    of each size in `sizes` other requests (1..40 tokens each, mixed into its steps)."""
    rng = np.random.default_rng(seed)
    target = prompts(rng, llm.vocab_size, 1, 35, 45)[0]
    want = run_alone(llm, target)
    for k in sizes:
        assert run_mixed(llm, target, prompts(rng, llm.vocab_size, k, 1, 40), rng) == want, f"batch of {k + 1}"
