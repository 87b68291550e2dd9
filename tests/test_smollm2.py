"""Oracle 2: the real SmolLM2-135M-Instruct against HF transformers on the same weights."""

import numpy as np
import pytest

from bessemer.runtime.llm import LLM, SamplingParams
from conftest import WIKITEXT, _hf_model
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


def perplexity(llm: LLM, token_ids: list[int], window: int) -> float:
    windows = [token_ids[i:i + window] for i in range(0, len(token_ids) - 1, window)]
    windows = [w for w in windows if len(w) > 1]
    nll, count = 0.0, 0
    for w, logits in zip(windows, llm.score(windows)):
        x = logits[:-1].astype(np.float64)
        lse = np.log(np.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1)) + x.max(axis=1)
        nll += float((lse - x[np.arange(len(w) - 1), w[1:]]).sum())
        count += len(w) - 1
    return float(np.exp(nll / count))


def test_perplexity_fp32_matches_hf_and_bf16_within_1_percent(smollm2_dir, smollm2_engine, fp32_llm):
    import torch

    text = WIKITEXT.read_text()[:20000]
    ids = fp32_llm.tokenizer.encode(text, add_special_tokens=False)[:2048]
    ppl32 = perplexity(fp32_llm, ids, 512)
    ppl16 = perplexity(LLM(smollm2_engine("bfloat16"), num_threads=2), ids, 512)
    model = _hf_model(str(smollm2_dir), "float32")
    nll, count = 0.0, 0
    for i in range(0, len(ids) - 1, 512):
        w = ids[i:i + 512]
        if len(w) < 2:
            continue
        with torch.no_grad():
            out = model(torch.tensor([w]), labels=torch.tensor([w]))
        nll += out.loss.item() * (len(w) - 1)
        count += len(w) - 1
    ppl_hf = float(np.exp(nll / count))
    assert abs(ppl32 / ppl_hf - 1) <= FP32_PPL_REL_VS_HF, (ppl32, ppl_hf)
    assert abs(ppl16 / ppl32 - 1) <= BF16_PPL_REL, (ppl16, ppl32)
