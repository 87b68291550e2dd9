"""SamplingParams' logit controls (logit_bias, allowed_token_ids, bad_words), text controls
(include_stop_str_in_output, skip_special_tokens) and prompt_logprobs (vLLM's semantics),
each against an oracle computed from the engine's own raw logits (LLM.score, teacher-forced
as the engine serves: the prompt as one prefill, then one decode step per token), with and
without n-gram speculation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.llm import LLM, SamplingParams
from bessemer.runtime.sampler import bad_word_bans, process_logits

# prompt_logprobs vs the log-softmax of LLM.score's rows: the same rows of the same engine
# (the same chunks, every row computed), both in float64: only summation order may differ
PROMPT_LOGPROB_ATOL = 1e-6
NGRAM = {"method": "ngram", "num_tokens": 3, "ngram_max": 3}
# repeated stretches, so that prompt lookup proposes drafts
TINY_PROMPT = ([17, 43, 99, 5, 128, 61, 77] * 5)[:30]


@pytest.fixture(scope="module")
def tiny(tiny_engine):
    """The tiny model (vocabulary 250, no tokenizer), plain and with n-gram speculation."""
    engine = tiny_engine("llama-untied", kv_block_size=4)
    return LLM(engine, num_threads=2), LLM(engine, num_threads=2, speculative=NGRAM)


@pytest.fixture(scope="module")
def smol(smollm2_engine):
    """SmolLM2 (bf16; a tokenizer with special tokens), plain and with n-gram speculation."""
    engine = smollm2_engine("bfloat16")
    return LLM(engine, num_threads=2), LLM(engine, num_threads=2, speculative=NGRAM)


def greedy(max_tokens: int, **controls) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **controls)


def log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    return x - x.max() - math.log(np.exp(x - x.max()).sum())


def assert_greedy_under(llm: LLM, prompt: list[int], out_ids: list[int], adjust) -> None:
    """Each output token is the argmax of the raw logits after `adjust(row, output so far)`
    (the oracle of one control)."""
    rows = llm.score([prompt + out_ids], num_prefill=len(prompt))[0][len(prompt) - 1:]  # (len(out) + 1, vocab)
    for j, token in enumerate(out_ids):
        assert token == int(np.argmax(adjust(rows[j].astype(np.float64), out_ids[:j]))), (j, out_ids)


def generate_both(llms, prompt, params) -> list[int]:
    """The tokens of `prompt` without and with speculation, checked equal (greedy)."""
    (plain, spec) = llms
    drafts = spec.llm_engine.stats().num_draft_tokens
    out = plain.generate([prompt], params)[0].token_ids
    assert spec.generate([prompt], params)[0].token_ids == out
    assert spec.llm_engine.stats().num_draft_tokens > drafts  # the controls ran on drafts too
    return out


def test_process_logits_order_follows_vllm():
    """Bias before the penalties (repetition divides the biased logit), masks at -inf."""
    logits = np.array([2.0, -1.0, 0.5, 3.0, -2.0, 1.0], dtype=np.float32)
    params = SamplingParams(logit_bias={0: 2.0, 1: -1.0}, repetition_penalty=2.0, allowed_token_ids=[0, 1, 2, 3, 5])
    out = process_logits(logits, params, [0], [1], banned=[5], bad_words=[[3], [1, 2], [4, 2]])
    # 0: (2 + 2) / 2; 1: (-1 - 1) * 2; 2: banned after [1]; 3: one-token bad word; 4: not allowed
    assert out.tolist() == [2.0, -4.0, -np.inf, -np.inf, -np.inf, -np.inf]
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0, 1.0]  # the raw row is untouched
    assert bad_word_bans([[7], [8, 9], [1, 8, 9]], []) == [7]  # a longer word needs its prefix in the output
    assert process_logits(logits, SamplingParams(), [0], [1], banned=[]) is logits


def test_logit_bias(tiny):
    plain = tiny[0].generate([TINY_PROMPT], greedy(8))[0].token_ids
    # +100 on a token the model never picks here: greedy picks it at every step
    forced = next(t for t in range(3, 250) if t not in plain)
    assert generate_both(tiny, TINY_PROMPT, greedy(8, logit_bias={forced: 100})) == [forced] * 8
    # -100 on the greedy token: the first token is the second best of the unbiased logits
    raw = tiny[0].score([TINY_PROMPT])[0][-1]  # (vocab,) at the prompt's last position
    assert generate_both(tiny, TINY_PROMPT, greedy(8, logit_bias={plain[0]: -100}))[0] == int(np.argsort(-raw)[1])
    # any bias: every step is the argmax of the raw logits plus the bias
    bias = {plain[0]: -100.0, plain[1]: -100.0, 42: 3.5}
    out = generate_both(tiny, TINY_PROMPT, greedy(8, logit_bias=bias))
    bias_row = np.zeros(250)
    bias_row[list(bias)] = list(bias.values())
    assert_greedy_under(tiny[0], TINY_PROMPT, out, lambda row, _: row + bias_row)
    assert plain[0] not in out and plain[1] not in out


def test_allowed_token_ids(tiny):
    plain = tiny[0].generate([TINY_PROMPT], greedy(8))[0].token_ids
    allowed = [5, 17, 43, 61, 200, 231]  # prompt tokens (n-gram drafts) and others, not the greedy first
    assert plain[0] not in allowed
    out = generate_both(tiny, TINY_PROMPT, greedy(8, allowed_token_ids=allowed))
    mask = np.full(250, -np.inf)
    mask[allowed] = 0.0
    assert_greedy_under(tiny[0], TINY_PROMPT, out, lambda row, _: row + mask)
    for llm in tiny:  # sampled: never outside the set
        sampled = llm.generate([TINY_PROMPT], SamplingParams(max_tokens=24, temperature=1.5, seed=7, ignore_eos=True,
                                                             allowed_token_ids=allowed))[0].token_ids
        assert set(sampled) <= set(allowed) and len(set(sampled)) > 1


def bad_word_oracle(tokenizer, word: str):
    """vLLM's rule spelled out: the word alone and after a space are banned sequences; a
    sequence's last token is banned when the output ends with the rest of it."""
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    sequences = {tuple(encode(word)), tuple(encode(" " + word))}

    def adjust(row, out_so_far):
        for s in sequences:
            if len(s) == 1 or tuple(out_so_far[len(out_so_far) - len(s) + 1:]) == s[:-1]:
                row[s[-1]] = -np.inf
        return row

    return sequences, adjust


@pytest.mark.parametrize("prompt, word, pieces", [
    ("The capital of France is", "Paris", 1),  # greedy: " Paris"; both spellings one token
    # greedy: " E" "iffel" " Tower"; the repeated question gives n-gram drafts
    ("Q: What is the most famous landmark in Paris?\nA: The Eiffel Tower.\n"
     "Q: What is the most famous landmark in Paris?\nA: The", "Eiffel", 2),
])
def test_bad_words(smol, prompt, word, pieces):
    llm = smol[0]
    ids = llm.tokenizer.encode(prompt)
    sequences, adjust = bad_word_oracle(llm.tokenizer, word)
    assert {len(s) for s in sequences} == {pieces}
    plain = llm.generate([ids], greedy(8))[0]
    assert word in plain.text
    out = generate_both(smol, ids, greedy(8, bad_words=[word]))
    assert word not in llm.tokenizer.decode(out)
    assert_greedy_under(llm, ids, out, adjust)
    if pieces == 2:  # only the last token is banned, and only after the others
        assert out[0] == plain.token_ids[0] and out[1] != plain.token_ids[1]


def test_include_stop_str_in_output(smol):
    plain = smol[0]
    prompt = "The capital of France is"  # greedy: " Paris.\n\nThe answer is: ..."
    free = plain.generate([prompt], greedy(16))[0].text
    end = free.index("answer") + len("answer")
    for llm in smol:
        for include, expected in ((False, free[:free.index("answer")]), (True, free[:end])):
            deltas: list[str] = []
            params = SamplingParams(max_tokens=16, temperature=0, stop=["answer"], include_stop_str_in_output=include)
            out = llm.generate([prompt], params, on_delta=lambda i, d: deltas.append(d))[0]
            assert (out.text, out.finish_reason, "".join(deltas)) == (expected, "stop", expected)
    # a stop token: its text is kept too (vLLM), streamed or not
    period = plain.tokenizer.encode(".", add_special_tokens=False)[0]
    for include, expected in ((False, " Paris"), (True, " Paris.")):
        params = SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[period],
                                include_stop_str_in_output=include)
        streamed: list[str] = []
        assert plain.generate([prompt], params)[0].text == expected
        assert plain.generate([prompt], params, on_delta=lambda i, d: streamed.append(d))[0].text == expected
        assert "".join(streamed) == expected


def test_skip_special_tokens(smol):
    llm = smol[0]
    eos = llm.tokenizer.eos_token  # <|im_end|>
    chat = [{"role": "user", "content": "What is 2+2? Answer with just the number."}]
    ids = llm.tokenizer.encode_chat(chat)
    kept = llm.generate([ids], greedy(10, skip_special_tokens=False))[0]
    assert llm.tokenizer.eos_token_id in kept.token_ids  # ignore_eos generates past it
    assert eos in kept.text and kept.text == llm.tokenizer.decode(kept.token_ids, skip_special_tokens=False)
    streamed: list[str] = []
    assert llm.generate([ids], greedy(10, skip_special_tokens=False),
                        on_delta=lambda i, d: streamed.append(d))[0].text == kept.text == "".join(streamed)
    default = llm.generate([ids], greedy(10))[0]
    assert eos not in default.text and default.text == llm.tokenizer.decode(default.token_ids)
    # EOS that ends the output is a stop token: out of the text unless include_stop_str_in_output
    stopped = SamplingParams(max_tokens=10, temperature=0, skip_special_tokens=False)
    assert llm.generate([ids], stopped)[0].text == kept.text[:kept.text.index(eos)]
    with_eos = SamplingParams(max_tokens=10, temperature=0, skip_special_tokens=False, include_stop_str_in_output=True)
    assert llm.generate([ids], with_eos)[0].text == kept.text[:kept.text.index(eos) + len(eos)]


def assert_prompt_logprobs(entries, prompt: list[int], scores: np.ndarray, k: int) -> None:
    """entries[i] holds prompt[i] and the top k of log_softmax(row i - 1) with their values."""
    assert len(entries) == len(prompt) and entries[0] is None
    for i in range(1, len(prompt)):
        lp = log_softmax(scores[i - 1])
        top = set(np.argsort(-lp, kind="stable")[:k].tolist()) | {prompt[i]}
        assert set(entries[i]) == top, i
        assert max(abs(v - lp[t]) for t, v in entries[i].items()) <= PROMPT_LOGPROB_ATOL, i


def test_prompt_logprobs(tiny):
    llm, spec = tiny
    scores = llm.score([TINY_PROMPT])[0]  # (30, vocab), all rows of one prefill
    plain = llm.generate([TINY_PROMPT], greedy(6))[0]  # now the prompt's blocks are in the cache
    hits = llm.blocks.num_hit_tokens
    out = llm.generate([TINY_PROMPT], greedy(6, prompt_logprobs=3))[0]
    assert llm.blocks.num_hit_tokens == hits  # the whole prompt was computed, not read from the cache
    assert out.token_ids == plain.token_ids  # the sampled row is the chunk's last
    assert_prompt_logprobs(out.prompt_logprobs, TINY_PROMPT, scores, 3)
    assert llm.generate([TINY_PROMPT], greedy(6))[0].token_ids == plain.token_ids
    assert llm.blocks.num_hit_tokens > hits  # ...and the cache still serves the prompt afterwards
    assert plain.prompt_logprobs is None
    only_own = llm.generate([TINY_PROMPT], greedy(2, prompt_logprobs=0))[0].prompt_logprobs
    assert [list(e) for e in only_own[1:]] == [[t] for t in TINY_PROMPT[1:]]
    spec_out = spec.generate([TINY_PROMPT], greedy(6, prompt_logprobs=3))[0]
    assert spec_out.token_ids == plain.token_ids and spec_out.prompt_logprobs == out.prompt_logprobs
    # n = 2: reported once for the request
    two = llm.generate([TINY_PROMPT], SamplingParams(max_tokens=4, temperature=1.0, seed=3, n=2, prompt_logprobs=2))[0]
    assert len(two.outputs) == 2 and all(len(c.token_ids) == 4 for c in two.outputs)
    assert_prompt_logprobs(two.prompt_logprobs, TINY_PROMPT, scores, 2)
    assert llm.blocks.num_free == llm.num_kv_blocks


def test_prompt_logprobs_with_chunked_prefill(tiny_engine):
    llm = LLM(tiny_engine("llama-untied", kv_block_size=4), num_threads=2)
    llm.llm_engine.set_limits(None, 7)  # chunks of 7 rows: 5 chunks for 30 tokens
    scores = llm.score([TINY_PROMPT])[0]  # scored in the same chunks
    batch = llm.generate([TINY_PROMPT, TINY_PROMPT[:11]], [greedy(4, prompt_logprobs=4), greedy(4)])
    assert_prompt_logprobs(batch[0].prompt_logprobs, TINY_PROMPT, scores, 4)
    assert batch[0].token_ids == llm.generate([TINY_PROMPT], greedy(4))[0].token_ids
    assert llm.llm_engine.num_steps > 5 and llm.blocks.num_free == llm.num_kv_blocks


def test_prompt_logprobs_survive_preemption(tiny_engine):
    engine = tiny_engine("llama-untied", kv_block_size=4, max_seq_len=64)
    prompts = [[(7 * i + j) % 240 + 3 for j in range(10 + 3 * i)] for i in range(6)]
    params = greedy(16, prompt_logprobs=2)
    roomy = LLM(engine, num_threads=2).generate(prompts, params)
    # 16 blocks of 4 tokens, chunks of 7 rows: sequences are preempted, some in mid-prompt
    tight = LLM(engine, num_threads=2, kv_cache_gib=0)
    tight.llm_engine.set_limits(None, 7)
    got = tight.generate(prompts, params)
    assert tight.num_preemptions > 0 and tight.blocks.num_free == tight.num_kv_blocks
    for g, r in zip(got, roomy):
        assert g.token_ids == r.token_ids and g.prompt_logprobs[0] is None
        for mine, ref in zip(g.prompt_logprobs[1:], r.prompt_logprobs[1:], strict=True):
            assert set(mine) == set(ref) and max(abs(mine[t] - ref[t]) for t in ref) <= PROMPT_LOGPROB_ATOL


@pytest.mark.parametrize("field, value", [
    ("logit_bias", {1: 100.5}), ("logit_bias", {1: math.nan}), ("logit_bias", {1: math.inf}), ("logit_bias", {-1: 1.0}),
    ("logit_bias", {"5": 1.0}), ("logit_bias", {True: 1.0}), ("logit_bias", {1: "2"}), ("logit_bias", [1, 2]),
    ("allowed_token_ids", []), ("allowed_token_ids", [1, -2]), ("allowed_token_ids", [1.5]), ("allowed_token_ids", 3),
    ("bad_words", "word"), ("bad_words", ["ok", ""]), ("bad_words", ["  "]), ("bad_words", [3]),
    ("include_stop_str_in_output", 1), ("skip_special_tokens", None), ("prompt_logprobs", -1),
    ("prompt_logprobs", 1.5), ("prompt_logprobs", True),
])
def test_bad_control_values_are_refused_by_name(field, value):
    with pytest.raises(InvalidOptionError, match=field) as e:
        SamplingParams(**{field: value})
    assert "\n" not in str(e.value)


def test_controls_beyond_the_engine_are_refused_when_added(tiny):
    llm = tiny[0]
    for params, needle in ((greedy(2, logit_bias={3: 1.0, 250: 1.0}), "token id 250 in logit_bias"),
                           (greedy(2, allowed_token_ids=[0, 999]), "token id 999 in allowed_token_ids"),
                           (greedy(2, prompt_logprobs=251), "prompt_logprobs 251 exceeds"),
                           (greedy(2, bad_words=["x"]), "bad_words needs the engine's tokenizer")):
        with pytest.raises(RequestError, match=needle):
            llm.generate([[1, 2, 3]], params)
    # every token masked (the only allowed one is a stop token before min_tokens): this sequence fails alone
    none_left = SamplingParams(max_tokens=4, temperature=0, allowed_token_ids=[5], stop_token_ids=[5], min_tokens=2)
    out = llm.generate([[1, 2, 3], [4, 5, 6]], [none_left, greedy(3)])
    assert out[0].finish_reason == "error" and "every token is excluded" in out[0].outputs[0].error
    assert out[1].finish_reason == "length" and llm.blocks.num_free == llm.num_kv_blocks
