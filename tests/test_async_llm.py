"""AsyncLLM in-process: the engine thread serves concurrent consumers exactly as the
synchronous LLM would, and cancelling or closing frees every KV block."""

from __future__ import annotations

import asyncio

import pytest

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.async_llm import AsyncLLM, SequenceFailedError
from bessemer.runtime.llm import SamplingParams


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    e = AsyncLLM(smollm2_engine("bfloat16"))
    yield e
    e.shutdown()


async def collect(engine, ids, params):
    texts, tokens, last = {}, {}, {}
    async for d in engine.generate(ids, params):
        texts[d.index] = texts.get(d.index, "") + d.text
        tokens[d.index] = tokens.get(d.index, []) + d.token_ids
        last[d.index] = d
    return texts, tokens, last


async def wait_idle(engine, timeout=10.0):
    for _ in range(int(timeout / 0.05)):
        s = engine.stats()
        if s.num_running == s.num_waiting == 0 and s.num_free_blocks == s.num_blocks:
            return s
        await asyncio.sleep(0.05)
    raise AssertionError(f"engine not idle: {engine.stats()}")


def test_concurrent_streams_match_sync_llm(engine):
    tok = engine.llm.tokenizer
    prompts = [tok.encode(f"Fact {i} about cats:") for i in range(4)]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    async def main():
        return await asyncio.gather(*(collect(engine, ids, params) for ids in prompts))

    results = asyncio.run(main())
    for (texts, tokens, last), ids in zip(results, prompts):
        d = last[0]
        assert d.finish_reason == "length" and d.num_output_tokens == 8 and d.num_prompt_tokens == len(ids)
        assert d.arrival_time <= d.first_token_time <= d.time
        assert texts[0] == tok.decode(tokens[0])
    # the same requests one by one through the synchronous API (the engine thread is idle)
    asyncio.run(wait_idle(engine))
    sync = [engine.llm.generate([ids], params)[0] for ids in prompts]
    assert [r[1][0] for r in results] == [s.token_ids for s in sync]


def test_held_deltas_arrive_together_unchanged(engine):
    # a consumer of the whole request (delivery_interval_s) gets the first delta at once,
    # the others together when the sequence ends: the same deltas, token times included,
    # as a consumer woken at every step
    ids = engine.llm.tokenizer.encode("Three facts about owls:")
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def read(interval_s):
        stream = await engine.add_request(ids, params, delivery_interval_s=interval_s)
        deltas, waiting = [], []
        async for d in stream:
            deltas.append(d)
            waiting.append(len(stream._items))  # delivered, not read yet
        return deltas, waiting

    eager, _ = asyncio.run(read(0.0))
    held, waiting = asyncio.run(read(600.0))
    assert waiting == [0] + list(range(len(held) - 2, -1, -1))
    assert [(d.token_ids, d.text, d.finish_reason, d.num_output_tokens) for d in held] == \
        [(d.token_ids, d.text, d.finish_reason, d.num_output_tokens) for d in eager]
    times = [d.time for d in held]
    assert times == sorted(times) and len(set(times)) == len(times) == 12


def test_n_sequences_and_errors(engine):
    async def main():
        texts, tokens, last = await collect(engine, [1, 2, 3], SamplingParams(max_tokens=3, n=2, seed=5))
        assert sorted(last) == [0, 1] and all(len(t) == 3 for t in tokens.values())
        with pytest.raises(RequestError):
            await engine.add_request([1] * (engine.llm.max_seq_len + 1), SamplingParams())
        await wait_idle(engine)

    asyncio.run(main())


def test_cancel_aborts_and_frees_blocks(engine):
    async def main():
        async def consume():
            async for _ in engine.generate([1, 2, 3, 4], SamplingParams(max_tokens=1000, ignore_eos=True)):
                pass

        task = asyncio.ensure_future(consume())
        while engine.stats().num_running == 0:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_idle(engine)

        # a generator closed early (consumer broke out of the loop) aborts too
        gen = engine.generate([5, 6, 7], SamplingParams(max_tokens=1000, ignore_eos=True))
        await gen.__anext__()
        await gen.aclose()
        await wait_idle(engine)

    asyncio.run(main())


def test_limits_only_lower(smollm2_engine):
    with pytest.raises(InvalidOptionError, match="exceeds"):
        AsyncLLM(smollm2_engine("bfloat16"), max_num_seqs=10_000)


def test_close_ends_running_streams(smollm2_engine):
    engine = AsyncLLM(smollm2_engine("bfloat16"), max_num_seqs=2, max_num_tokens=64)
    assert engine.llm.scheduler.max_batch_size == 2 and engine.llm.scheduler.max_num_tokens == 64

    async def main():
        stream = await engine.add_request([1, 2, 3], SamplingParams(max_tokens=1000, ignore_eos=True))
        await stream.__anext__()
        engine.close()
        reasons = [d.finish_reason async for d in stream]
        assert reasons[-1] == "abort"

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert not engine.is_alive


def test_a_failing_request_fails_alone(engine):
    # more logprobs than the vocabulary: valid for SamplingParams, fails in the sampler
    # inside a step that also runs the good request
    good = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    bad = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=engine.llm.vocab_size + 1)
    ids = engine.llm.tokenizer.encode("A long story about a lighthouse:")

    async def main():
        alone = await collect(engine, ids, good)
        results = await asyncio.gather(collect(engine, ids, good), collect(engine, [1, 2, 3], bad),
                                       return_exceptions=True)
        assert isinstance(results[1], SequenceFailedError) and "kth" in str(results[1])
        assert results[0][1] == alone[1] and results[0][2][0].finish_reason == "length"
        await wait_idle(engine)

    asyncio.run(main())
