"""Requests are validated once, at the boundary: a bad value is one InvalidOptionError (a
400 in the server, one `error:` line in the CLI) before anything is queued, so it can never
fail a step that other requests share."""

import math

import pytest

from bessemer.errors import InvalidOptionError
from bessemer.runtime.llm import LLM, SamplingParams
from test_cli import assert_clean_error, run


@pytest.mark.parametrize("field, value", [
    ("temperature", math.nan), ("temperature", math.inf), ("top_p", math.nan), ("min_p", math.nan),
    ("repetition_penalty", math.nan), ("presence_penalty", -math.inf), ("frequency_penalty", math.nan),
    ("seed", -1), ("seed", 2**64), ("seed", 1.5), ("stop", ""), ("stop", ["end", ""]), ("top_k", 2.5),
])
def test_bad_sampling_values_are_refused_by_name(field, value):
    with pytest.raises(InvalidOptionError, match=field if field != "stop" else "stop strings"):
        SamplingParams(**{field: value})


def test_generate_refuses_a_params_list_of_another_length(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=1)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(InvalidOptionError, match="3 prompts but 2 sampling params"):
        llm.generate(prompts, [SamplingParams(max_tokens=2)] * 2)
    outs = llm.generate(prompts, [SamplingParams(max_tokens=2, temperature=0)] * 3)
    assert len(outs) == 3 and all(len(o.outputs[0].token_ids) == 2 for o in outs)
    assert llm.blocks.num_free == llm.num_kv_blocks  # nothing left queued or holding blocks


def test_a_refused_prompt_leaves_the_others_unqueued(tiny_engine):
    llm = LLM(tiny_engine("llama-untied"), num_threads=1)
    too_long = list(range(1, llm.max_seq_len + 5))
    with pytest.raises(Exception, match="prompt has"):
        llm.generate([[1, 2, 3], too_long], SamplingParams(max_tokens=2))
    assert not llm.has_unfinished() and llm.blocks.num_free == llm.num_kv_blocks


@pytest.mark.parametrize("flag, value, needle", [("--temperature", "nan", "temperature"), ("--seed", "-1", "seed")])
def test_run_engine_refuses_bad_sampling_flags(tiny_engine, flag, value, needle):
    assert_clean_error(run("run-engine", str(tiny_engine("llama-untied")), "--prompt", "x", flag, value), needle)


def test_an_absurd_thread_count_is_refused(tiny_engine):
    with pytest.raises(InvalidOptionError, match="--threads 10000"):
        LLM(tiny_engine("llama-untied"), num_threads=10000)


def test_a_window_of_the_engines_full_length_can_be_scored(tiny_engine):
    """bessemer eval's default window equals a 1024-token engine's max_seq_len: scoring needs no
    room for output, so a sequence of exactly max_seq_len tokens is scored; its logits are the
    shorter prefix's on the shared positions (causal attention)."""
    import numpy as np

    llm = LLM(tiny_engine("llama-untied", max_seq_len=64), num_threads=1)
    ids = [(7 * i + 3) % 200 + 1 for i in range(64)]
    full, prefix = llm.score([ids, ids[:40]])
    assert full.shape[0] == 64
    np.testing.assert_allclose(full[:40], prefix, rtol=0, atol=1e-5)
    with pytest.raises(Exception, match="prompt has 64 tokens"):
        llm.generate([ids], SamplingParams(max_tokens=1))  # generating still needs room


def test_eval_refuses_max_tokens_below_two():
    from bessemer.errors import BessemerError
    from bessemer.runtime.evaluate import windows

    with pytest.raises(BessemerError, match="--max-tokens must be at least 2"):
        windows(list(range(100)), 16, 0)


def test_tokenizing_a_large_prompt_lets_other_threads_run(smollm2_dir):
    # the server tokenizes on a worker thread so that its event loop (/health, other
    # streams) goes on; that only helps if the tokenizer lets go of the GIL meanwhile
    import threading
    import time

    from bessemer.runtime.tokenizer import Tokenizer

    tok = Tokenizer(smollm2_dir)
    text = "many words " * 300_000  # 3.3 MB: about a second to tokenize
    worker = threading.Thread(target=tok.encode, args=(text,))
    t = time.monotonic()
    worker.start()
    ticks = 0
    while worker.is_alive():
        time.sleep(0.01)
        ticks += 1
    elapsed = time.monotonic() - t
    assert ticks >= elapsed / 0.01 / 4, f"this thread ran {ticks} times in {elapsed:.2f} s of tokenizing"
    assert tok.encode("many words many") == tok._tok.encode("many words many").ids


@pytest.mark.parametrize("field, value", [
    ("stop", [f"s{i}" for i in range(65)]), ("stop", "x" * 1025),
    ("bad_words", [f"w{i}" for i in range(257)]), ("bad_words", ["y" * 1025]),
    ("allowed_token_ids", [1] * (2**18 + 1)),
])
def test_stop_strings_and_bad_words_are_bounded(field, value):
    """Both are matched at every step on the engine thread that serves everyone."""
    with pytest.raises(InvalidOptionError, match=f"{field} holds .* at most"):
        SamplingParams(**{field: value})
    if field == "allowed_token_ids":
        return
    bounded = value[:1024] if isinstance(value, str) else [w[:1024] for w in value[:64]]
    SamplingParams(**{field: bounded})  # at the bounds it passes
