"""Perplexity by one protocol for engines and for HF models, so the two are comparable.

Protocol: tokenize the text (no BOS added), keep the first `max_tokens` tokens, cut them
into non-overlapping windows of `context_len` tokens (the last may be shorter); in every
window each token after the first is scored given the ones before it;
ppl = exp(mean negative log-likelihood over all scored tokens).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from bessemer.builder.hf_loader import load_hf_model
from bessemer.datasets import BUILTIN_TEXTS, text_path
from bessemer.errors import BessemerError


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    scored_tokens: int
    nll_sum: float

    def to_json(self) -> dict:
        return {"perplexity": self.perplexity, "scored_tokens": self.scored_tokens, "nll_sum": self.nll_sum}


def read_dataset(path: str | Path) -> str:
    """The text of a --dataset value: a built-in name (bessemer/datasets) or a file."""
    p = text_path(path)
    if not p.is_file():
        raise BessemerError(f"dataset {p} does not exist; pass a plain-text file or a built-in name "
                            f"({', '.join(BUILTIN_TEXTS)}) with --dataset")
    text = p.read_text(encoding="utf-8", errors="replace")
    if not text.strip():
        raise BessemerError(f"dataset {p} is empty; pass a plain-text file with --dataset")
    return text


def windows(token_ids: list[int], context_len: int, max_tokens: int | None) -> list[list[int]]:
    if context_len < 2:
        raise BessemerError(f"--context-len must be at least 2, got {context_len}")
    if max_tokens is not None and max_tokens < 2:
        raise BessemerError(f"--max-tokens must be at least 2 (tokens to score), got {max_tokens}; "
                            "omit it to score the first 8192")
    ids = token_ids[:max_tokens] if max_tokens else token_ids
    out = [ids[i:i + context_len] for i in range(0, len(ids), context_len)]
    return [w for w in out if len(w) > 1]


# Rows of logits per log-sum-exp pass: a 1024-token window of SmolLM2's 49152-word vocabulary
# in fp64 at once is 400 MB per NumPy temporary; in blocks of 32 rows (12 MB) the same sums
# take a sixth of the CPU time (1.7 s -> 0.3 s a window).
NLL_ROWS = 32


def window_nll(logits: np.ndarray, window: list[int]) -> float:
    """Sum of -log p(window[t] | window[:t]) for t >= 1; logits: (len(window), vocab).
    In fp64, each row's log-sum-exp on its own (rows in blocks of NLL_ROWS). One fp64
    buffer serves every block (x - max written into it, exponentiated in place): the same
    values as fresh temporaries per block, which cost a third of the time in page faults."""
    n = len(window) - 1
    lse = np.empty(n, np.float64)  # (n,)
    buf = np.empty((min(NLL_ROWS, n), logits.shape[1]), np.float64)
    for r in range(0, n, NLL_ROWS):
        rows = logits[r:min(r + NLL_ROWS, n)]  # (rows, vocab)
        top = rows.max(axis=1).astype(np.float64)  # the max is exact in either precision
        x = np.subtract(rows, top[:, None], out=buf[:len(rows)], dtype=np.float64)
        lse[r:r + len(x)] = np.log(np.exp(x, out=x).sum(axis=1)) + top
    picked = logits[np.arange(n), window[1:]].astype(np.float64)  # (n,)
    return float((lse - picked).sum())


def perplexity(score: Callable[[list[list[int]]], Iterable[np.ndarray]], wins: list[list[int]],
               batch: int = 1, progress: Callable[[str], None] | None = None) -> Perplexity:
    """`score(windows) -> logits per window`: an engine's LLM.score or a HF forward."""
    nll, count = 0.0, 0
    for i in range(0, len(wins), batch):
        group = wins[i:i + batch]
        for w, logits in zip(group, score(group)):
            nll += window_nll(logits, w)
            count += len(w) - 1
        if progress:
            progress(f"scored {min(i + batch, len(wins))}/{len(wins)} windows, ppl so far {np.exp(nll / count):.4f}")
    return Perplexity(float(np.exp(nll / count)), count, nll)


def hf_score_fn(model):
    """A `score` function (see `perplexity`) backed by a loaded HF model."""
    import torch

    def score(group: list[list[int]]):
        with torch.no_grad():
            return [model(torch.tensor([w])).logits[0].numpy() for w in group]

    return score


def hf_scorer(model_dir: str | Path, threads: int | None = None, vocab_size: int | None = None):
    """A `score` function backed by HF transformers in fp32 (the reference)."""
    return hf_score_fn(load_hf_model(model_dir, "--reference", threads, vocab_size))
