"""Oracle 2: the real SmolLM2-135M-Instruct against HF transformers on the same weights."""

import numpy as np
import pytest

from bessemer.runtime.evaluate import perplexity
from bessemer.runtime.llm import LLM, SamplingParams
from conftest import _hf_model
from tolerances import BF16_PPL_REL, FP32_PPL_REL_VS_HF

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
]


@pytest.fixture(scope="module")
def fp32_llm(smollm2_engine):
    return LLM(smollm2_engine("float32"), num_threads=2)


def test_tokenizer_and_chat_template_match_hf(smollm2_dir, fp32_llm):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(smollm2_dir)
    for p in PROMPTS:
        assert fp32_llm.tokenizer.encode(p) == hf(p)["input_ids"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    ours = fp32_llm.tokenizer.encode_chat(messages)
    theirs = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    theirs = theirs["input_ids"] if isinstance(theirs, dict) or hasattr(theirs, "keys") else theirs
    assert ours == list(theirs)


@pytest.mark.slow
def test_greedy_48_tokens_identical_to_hf(smollm2_dir, fp32_llm):
    import torch

    model = _hf_model(str(smollm2_dir), "float32")
    outs = fp32_llm.generate(PROMPTS, SamplingParams(max_tokens=48, temperature=0))
    for prompt, out in zip(PROMPTS, outs):
        ids = fp32_llm.tokenizer.encode(prompt)
        with torch.no_grad():
            ref = model.generate(torch.tensor([ids]), max_new_tokens=48, do_sample=False)[0, len(ids):].tolist()
        assert out.token_ids == ref, f"{prompt!r}: engine {out.text!r}"


def test_chat_generation_answers(fp32_llm):
    out = fp32_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                        SamplingParams(max_tokens=24, temperature=0))[0]
    assert "Paris" in out.text


@pytest.mark.slow
def test_perplexity_fp32_matches_hf_and_bf16_within_1_percent(smollm2_dir, smollm2_engine, smollm2_fp32_perplexity):
    import torch

    wins, ppl32 = smollm2_fp32_perplexity  # the fp32 engine's, shared with the quantization tests
    ppl16 = perplexity(LLM(smollm2_engine("bfloat16"), num_threads=2).score, wins).perplexity
    # HF's own loss (labels=...) is the oracle here, not our window_nll
    model = _hf_model(str(smollm2_dir), "float32")
    nll, count = 0.0, 0
    for w in wins:
        with torch.no_grad():
            out = model(torch.tensor([w]), labels=torch.tensor([w]))
        nll += out.loss.item() * (len(w) - 1)
        count += len(w) - 1
    ppl_hf = float(np.exp(nll / count))
    print(f"wikitext ppl: HF fp32 {ppl_hf:.4f}, engine fp32 {ppl32:.4f}, engine bf16 {ppl16:.4f}")
    assert abs(ppl32 / ppl_hf - 1) <= FP32_PPL_REL_VS_HF, (ppl32, ppl_hf)
    assert abs(ppl16 / ppl32 - 1) <= BF16_PPL_REL, (ppl16, ppl32)


def test_stop_strings_and_stop_token_ids(fp32_llm):
    prompt = "def fibonacci(n):"
    free = fp32_llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0))[0]
    assert "return" in free.text
    cut = fp32_llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0, stop=["return"]))[0]
    assert cut.finish_reason == "stop" and "return" not in cut.text
    assert free.text.startswith(cut.text) and len(cut.text) < len(free.text)
    # a stop token id ends generation at that token (kept in token_ids, as vLLM does)
    stop_id = free.token_ids[5]
    by_id = fp32_llm.generate([prompt], SamplingParams(max_tokens=48, temperature=0, stop_token_ids=[stop_id]))[0]
    assert by_id.token_ids == free.token_ids[: free.token_ids.index(stop_id) + 1]
    assert by_id.finish_reason == "stop"


def test_streaming_deltas_concatenate_to_the_text(fp32_llm):
    deltas: list[str] = []
    out = fp32_llm.generate(["Once upon a time"], SamplingParams(max_tokens=24, temperature=0),
                            on_delta=lambda i, d: deltas.append(d))[0]
    assert "".join(deltas) == out.text and len(deltas) > 3
