"""Constraints are bounded before they compile and compiled off the engine thread; the
scheduler admits requests round-robin. Through the public LLM / AsyncLLM API on SmolLM2
bf16 (the server-level cases are in tests/test_serve_fields.py)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.constraint_limits import ConstraintLimits
from bessemer.runtime.llm import LLM, SamplingParams

pytest.importorskip("llguidance")


@pytest.fixture(scope="module")
def llm(smollm2_engine):
    return LLM(smollm2_engine("bfloat16"), num_threads=2)


def chain(n: int) -> str:
    return "start: r0\n" + "".join(f'r{i}: r{i + 1} | "x"\n' for i in range(n)) + f'r{n}: "y"\n'


def test_limits_are_checked_before_compiling_and_name_the_flag(llm):
    ids = llm.tokenizer.encode("Hi")
    cases = [(dict(grammar=chain(10_500)), "--max-grammar-rules"),
             (dict(regex="a" * 300_000), "--max-constraint-bytes"),
             (dict(json_schema='{"type": "array", "items": ' * 70 + "{}" + "}" * 70), "--max-schema-depth"),
             (dict(json_schema="{not json"), "not valid JSON")]
    for constraint, needle in cases:
        start = time.monotonic()
        with pytest.raises(RequestError, match=needle):
            llm.generate([ids], SamplingParams(max_tokens=2, **constraint))
        assert time.monotonic() - start < 2  # refused before anything compiled
    assert llm.blocks.num_free == llm.num_kv_blocks and not llm.has_unfinished()
    with pytest.raises(InvalidOptionError, match="--max-grammar-rules"):
        ConstraintLimits(max_rules=0)


def test_constraint_failures_end_the_sequence_with_error_not_stop(llm):
    ids = llm.tokenizer.encode("Say something:")
    failing = [SamplingParams(max_tokens=8, temperature=0, grammar=g)
               for g in (chain(3000), 'start: "a" start\n', "start: " + " | ".join(f'"w{i}"' for i in range(2001)))]
    free = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outs = llm.generate([ids] * 4, failing + [free])  # in one batch with an unconstrained request
    for out in outs[:3]:
        assert out.finish_reason == "error" and out.outputs[0].error.startswith("the constraint failed"), out.outputs
    assert outs[3].finish_reason == "length" and len(outs[3].token_ids) == 8
    assert outs[3].token_ids == llm.generate([ids], free)[0].token_ids
    for grammar_kind in (dict(json_schema={"$ref": "#"}), dict(grammar="root ::= root")):
        with pytest.raises(RequestError, match="matches no output"):
            llm.generate([ids], SamplingParams(max_tokens=4, **grammar_kind))


def test_a_grammar_that_crashes_the_compiler_is_a_request_error(smollm2_engine):
    llm = LLM(smollm2_engine("bfloat16"), num_threads=2,
              constraint_limits=ConstraintLimits(max_bytes=10**8, max_rules=10**7))
    ids = llm.tokenizer.encode("Hi")
    with pytest.raises(RequestError, match="crashed|failed on it"):
        llm.generate([ids], SamplingParams(max_tokens=2, grammar=chain(100_000)))
    out = llm.generate([ids], SamplingParams(max_tokens=4, temperature=0, regex="[ab]{3}"))[0]  # a new helper
    assert len(out.text) == 3 and set(out.text) <= {"a", "b"} and out.finish_reason == "stop"
    llm.close()


def test_one_request_cannot_hold_every_admission(llm):
    """64 prompts of one request, then another request's prompt: round-robin admission and
    the half-step share start the second within two steps, while the first is still queued."""
    engine = llm.llm_engine
    words = " ".join(f"w{i}" for i in range(150))
    params = SamplingParams(max_tokens=1, temperature=0)
    big = []
    for i in range(64):
        big += engine.add_request(llm.tokenizer.encode(f"{i} {words}"), params, group=-1)
    small = engine.add_request(llm.tokenizer.encode("Hello"), SamplingParams(max_tokens=2, temperature=0))[0]
    steps = 0
    try:
        while small.finish_reason is None:
            engine.step()
            steps += 1
        assert steps <= 3, steps  # admitted in the first step, decoded in the second
        assert sum(s.finish_reason is None for s in big) > 48
    finally:
        for s in big + [small]:
            engine.abort(s)
    assert llm.blocks.num_free == llm.num_kv_blocks


def test_compiling_a_large_schema_does_not_pause_other_streams(smollm2_engine):
    from bessemer.runtime.async_llm import AsyncLLM

    engine = AsyncLLM(smollm2_engine("bfloat16"), num_threads=2)
    schema = {"type": "object", "properties": {"v": {"enum": [f"value-{i}" for i in range(5000)]}}, "required": ["v"]}
    ids = engine.llm.tokenizer.encode("Write a story:")

    async def main():
        stream = await engine.add_request(ids, SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
        times = []

        async def read():
            async for _ in stream:
                times.append(time.perf_counter())

        reader = asyncio.ensure_future(read())
        while len(times) < 5:
            await asyncio.sleep(0.01)
        start = time.perf_counter()
        constrained = await engine.add_request(ids, SamplingParams(max_tokens=4, json_schema=json.dumps(schema)))
        compiled = time.perf_counter() - start
        stream.abort()
        constrained.abort()
        reader.cancel()
        gaps = [b - a for a, b in zip(times, times[1:]) if b > start and a < start + compiled]
        return compiled, max(gaps, default=0.0), sorted(b - a for a, b in zip(times, times[1:]))

    try:
        compiled, worst, all_gaps = asyncio.run(main())
    finally:
        engine.shutdown()
    typical = all_gaps[len(all_gaps) // 2]
    print(f"schema compiled in {compiled:.2f} s; the other stream's worst gap meanwhile {worst:.3f} s "
          f"(median {typical:.3f} s)")
    # on the engine thread, one gap would have held the whole compile
    assert worst < max(0.5 * compiled, 4 * typical), (compiled, worst, typical)
