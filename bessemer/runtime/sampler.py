"""Sampling over one row of logits, seeded per request, with the vLLM/OpenAI controls.

Order (as vLLM): penalties on the raw logits (repetition on prompt and output tokens,
presence and frequency on output tokens), the min_tokens mask on stop tokens, then
greedy, or temperature -> top-k -> top-p -> min-p -> draw. NumPy only: the full-vocabulary
work is one partition for top-k and one sort of the surviving candidates.
"""

from __future__ import annotations

import numpy as np


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def apply_penalties(logits: np.ndarray, prompt_ids: list[int], output_ids: list[int],
                    repetition: float, presence: float, frequency: float) -> np.ndarray:
    """logits: (vocab,). Returns a penalized copy (or the input when no penalty is set)."""
    if repetition == 1.0 and presence == 0.0 and frequency == 0.0:
        return logits
    out = logits.astype(np.float32, copy=True)
    if repetition != 1.0:
        seen = np.unique(np.asarray(prompt_ids + output_ids, dtype=np.int64))
        vals = out[seen]
        out[seen] = np.where(vals > 0, vals / repetition, vals * repetition)
    if output_ids and (presence or frequency):
        ids, counts = np.unique(np.asarray(output_ids, dtype=np.int64), return_counts=True)
        out[ids] -= presence + frequency * counts
    return out


def process_logits(logits: np.ndarray, params, prompt_ids: list[int], output_ids: list[int],
                   banned: list[int]) -> np.ndarray:
    """One sequence's logits as sampling sees them: penalties, then `banned` tokens (stop
    tokens before min_tokens) at -inf. logits: (vocab,) raw; `params` a SamplingParams.
    Returns the input itself when nothing applies."""
    x = apply_penalties(logits, prompt_ids, output_ids, params.repetition_penalty, params.presence_penalty,
                        params.frequency_penalty)
    if banned:
        x = x.copy() if x is logits else x
        x[banned] = -np.inf
    return x


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
           rng: np.random.Generator, min_p: float = 0.0) -> int:
    """logits: (vocab,) float32 -> token id."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    candidates, probs = distribution(logits, temperature, top_k, top_p, min_p)
    return int(candidates[rng.choice(len(candidates), p=probs)])


def distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float,
                 min_p: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The distribution `sample` draws from (temperature > 0): candidate ids, most likely
    first, and their probabilities (float64, summing to 1); every other token has 0."""
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
    keep = len(candidates)
    if top_p < 1.0:
        # the smallest prefix whose mass reaches top_p (always at least one token)
        keep = min(keep, int(np.searchsorted(np.cumsum(probs), top_p) + 1))
    if min_p > 0.0:
        keep = min(keep, max(1, int((probs >= min_p * probs[0]).sum())))
    return candidates[:keep], probs[:keep] / probs[:keep].sum()


def top_logprobs(logits: np.ndarray, chosen: int, k: int) -> dict[int, float]:
    """Log-probabilities (of the unmodified distribution) of the top k tokens and the chosen one."""
    lp = log_softmax(logits)
    top = np.argpartition(-lp, k - 1)[:k] if k > 0 else np.array([], dtype=np.int64)
    out = {int(t): float(lp[t]) for t in top[np.argsort(-lp[top])]}
    out.setdefault(int(chosen), float(lp[chosen]))
    return out
