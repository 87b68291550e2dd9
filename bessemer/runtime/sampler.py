"""Sampling over one row of logits: greedy, temperature, top-k, top-p, seeded per request.

NumPy only. The full-vocabulary work is one partition for top-k and one sort of the
surviving candidates for top-p, so a 49k vocabulary costs well under a millisecond.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
           rng: np.random.Generator) -> int:
    """logits: (vocab,) float32 -> token id."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    vocab = logits.shape[0]
    if 0 < top_k < vocab:
        candidates = np.argpartition(-logits, top_k - 1)[:top_k]
    else:
        candidates = np.arange(vocab)
    scaled = logits[candidates].astype(np.float64) / temperature
    order = np.argsort(-scaled, kind="stable")
    candidates, scaled = candidates[order], scaled[order]
    probs = np.exp(scaled - scaled[0])
    probs /= probs.sum()
    if top_p < 1.0:
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = int(np.searchsorted(np.cumsum(probs), top_p) + 1)
        candidates, probs = candidates[:keep], probs[:keep] / probs[:keep].sum()
    return int(candidates[rng.choice(len(candidates), p=probs)])


def top_logprobs(logits: np.ndarray, chosen: int, k: int) -> dict[int, float]:
    """Log-probabilities (of the unmodified distribution) of the top k tokens and the chosen one."""
    lp = log_softmax(logits)
    top = np.argpartition(-lp, k - 1)[:k] if k > 0 else np.array([], dtype=np.int64)
    out = {int(t): float(lp[t]) for t in top[np.argsort(-lp[top])]}
    out.setdefault(int(chosen), float(lp[chosen]))
    return out
