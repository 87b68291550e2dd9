"""The prompt sets `bessemer bench serve` sends.

- `synthetic`: random prompts of exactly --input-len tokens for /v1/completions (token ids,
  which vLLM, llama.cpp and Bessemer all accept, so the length is exact without the server's
  tokenizer); for chat, which takes text only, --input-len words drawn from the shipped prompts
  (the server's usage chunk then reports the real token count).
- `shipped`: prompts.jsonl in this package, a few dozen prompts written for this benchmark
  (public domain), each with the reply length it asks for.
- any other value: a JSONL file, one object a line: {"prompt": "...", "output_len": N} or
  ShareGPT's {"conversations": [{"from": "human", "value": "..."}, ...]} (its first human turn).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bessemer.errors import InvalidOptionError

SHIPPED = Path(__file__).resolve().parent / "prompts.jsonl"
DATASETS = ("synthetic", "shipped")
# Synthetic ids stay clear of both ends of the vocabulary, where tokenizers keep their special
# tokens (SmolLM2 0-16, Mistral's control tokens below ~800, Llama 3's above 128000), and
# below 32000, the smallest vocabulary of the models people serve.
SYNTHETIC_IDS = (1000, 30000)


@dataclass(frozen=True)
class Prompt:
    text: str | None  # one of text / ids
    ids: tuple[int, ...] | None
    num_tokens_hint: int  # input tokens when the server reports no usage (ids: exact; text: words)
    output_len: int


def synthetic(num_prompts: int, input_len: int, output_len: int, seed: int, as_text: bool) -> list[Prompt]:
    rng = np.random.default_rng(seed)
    if as_text:
        words = shipped_words()
        return [Prompt(" ".join(words[i] for i in rng.integers(0, len(words), input_len)), None, input_len,
                       output_len) for _ in range(num_prompts)]
    lo, hi = SYNTHETIC_IDS
    return [Prompt(None, tuple(int(t) for t in rng.integers(lo, hi, input_len)), input_len, output_len)
            for _ in range(num_prompts)]


def shipped_words() -> list[str]:
    return [w for p in read_jsonl(SHIPPED, None) for w in p.text.split()]


def read_jsonl(path: Path, output_len: int | None) -> list[Prompt]:
    """Every prompt in the file; `output_len` (when given) replaces each line's own."""
    if not path.is_file():
        raise InvalidOptionError(f"--dataset {path}: no such file; pass synthetic, shipped or a JSONL file")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            text = row["prompt"] if "prompt" in row else next(
                turn["value"] for turn in row["conversations"] if turn["from"] == "human")
        except (ValueError, KeyError, TypeError, StopIteration):
            raise InvalidOptionError(f"--dataset {path} line {n}: expected a JSON object with \"prompt\" "
                                     "or ShareGPT's \"conversations\"") from None
        length = output_len or row.get("output_len") or 128
        prompts.append(Prompt(text, None, len(text.split()), int(length)))
    return prompts


def load(dataset: str, num_prompts: int, input_len: int, output_len: int | None, seed: int,
         as_text: bool) -> list[Prompt]:
    """`num_prompts` prompts of `dataset`; a file's prompts are shuffled with `seed` and cycled
    when there are fewer than asked for."""
    if dataset == "synthetic":
        return synthetic(num_prompts, input_len, output_len or 128, seed, as_text)
    pool = read_jsonl(SHIPPED if dataset == "shipped" else Path(dataset), output_len)
    if not pool:
        raise InvalidOptionError(f"--dataset {dataset} holds no prompts")
    order = np.random.default_rng(seed).permutation(len(pool))
    return [pool[order[i % len(pool)]] for i in range(num_prompts)]
