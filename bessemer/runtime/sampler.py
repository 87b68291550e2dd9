"""Sampling over one row of logits with the vLLM/OpenAI controls, drawn with the uniform of
the sequence's stream for the position (runtime/random_stream.py).

Order (as vLLM): logit_bias added to the raw logits, then the penalties (repetition on
prompt and output tokens, presence and frequency on output tokens), then the masks that set
tokens to -inf (those outside allowed_token_ids, bad words, stop tokens before min_tokens),
then greedy, or temperature -> top-k -> top-p -> min-p -> draw. vLLM masks first; a -inf
stays -inf under bias and penalties, so the one order that changes results is the bias's
before the penalties (repetition divides a biased logit). NumPy only: the full-vocabulary
work is one partition for top-k and one sort of the surviving candidates (and one of
their ids for the draw).
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


def apply_bias(logits: np.ndarray, bias: dict[int, float] | None) -> np.ndarray:
    """logits: (vocab,). Returns a copy with `bias` ({token: value}) added (or the input when
    there is none)."""
    if not bias:
        return logits
    out = logits.astype(np.float32, copy=True)
    out[np.fromiter(bias.keys(), np.int64, len(bias))] += np.fromiter(bias.values(), np.float32, len(bias))
    return out


def bad_words_token_ids(words: list[str], encode) -> list[list[int]]:
    """vLLM's token sequences of `bad_words`: each word with its leading spaces stripped, and
    also after one space (the word inside a text) when that starts with another token and
    has as many tokens. `encode(text)` -> ids, without special tokens."""
    out = []
    for word in words:
        alone, spaced = encode(word.lstrip()), encode(" " + word.lstrip())
        out.append(alone)
        if spaced and alone and spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(spaced)
    return [ids for ids in out if ids]


def bad_word_bans(bad_words: list[list[int]], output_ids: list[int]) -> list[int]:
    """The tokens bad words forbid next (vLLM's rule): a word's last token when the output
    so far ends with its other tokens (a one-token word: always). Only the output counts,
    not the prompt."""
    bans = []
    for word in bad_words:
        prefix = word[:-1]
        if len(prefix) <= len(output_ids) and output_ids[len(output_ids) - len(prefix):] == prefix:
            bans.append(word[-1])
    return bans


def process_logits(logits: np.ndarray, params, prompt_ids: list[int], output_ids: list[int],
                   banned: list[int], bad_words: list[list[int]] = ()) -> np.ndarray:
    """One sequence's logits as sampling sees them, in the module docstring's order: bias,
    penalties, then tokens outside allowed_token_ids, bad words and `banned` (stop tokens
    before min_tokens) at -inf. logits: (vocab,) raw; `params` a SamplingParams;
    `bad_words` the token sequences of params.bad_words (bad_words_token_ids). Returns the
    input itself when nothing applies."""
    x = apply_bias(logits, params.logit_bias)
    x = apply_penalties(x, prompt_ids, output_ids, params.repetition_penalty, params.presence_penalty,
                        params.frequency_penalty)
    banned = list(banned) + bad_word_bans(bad_words, output_ids)
    if params.allowed_token_ids is None and not banned:
        return x
    if params.allowed_token_ids is not None:
        allowed = np.asarray(params.allowed_token_ids, dtype=np.int64)
        only = np.full_like(x, -np.inf)  # a new array: x is never written
        only[allowed] = x[allowed]
        x = only
    elif x is logits:
        x = x.copy()
    x[banned] = -np.inf
    if not np.isfinite(x).any():  # greedy would pick token 0, a draw would divide by zero
        raise ValueError("every token is excluded by allowed_token_ids, bad_words, the stop tokens masked "
                         "until min_tokens and the output constraint; allow more tokens or lower min_tokens")
    return x


def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, uniform: float,
           min_p: float = 0.0) -> int:
    """logits: (vocab,) float32 -> token id: argmax when temperature <= 0, else the inverse
    CDF of `distribution` at `uniform` (in [0, 1)), the kept tokens taken in vocabulary
    order: the first whose cumulative probability exceeds uniform (the device sampler's
    rule, plugins/ops.ref_sample_rows). A fixed order, not one that depends on the
    distribution, makes two close distributions draw the same token from one uniform (a
    draft engine's and the target's: speculative/acceptance.py)."""
    if temperature <= 0.0:
        return int(np.argmax(logits))
    candidates, probs = distribution(logits, temperature, top_k, top_p, min_p)
    if len(candidates) * 16 < len(logits):  # few kept: sort them into vocabulary order
        ids = np.sort(candidates)  # (kept,)
        weights = probs[np.argsort(candidates)]
    else:  # many: scatter over the vocabulary (O(vocab), no sort); adding the zeros is exact
        ids = None
        weights = np.zeros(len(logits))  # (vocab,)
        weights[candidates] = probs
    cdf = np.cumsum(weights)
    if not np.isfinite(cdf[-1]):  # a search over NaN would return a token, not fail
        raise ValueError("the sampling probabilities contain NaN (a NaN temperature or logit); "
                         "give a finite temperature")
    # the first entry whose cumulative probability exceeds uniform (it only rises at kept
    # tokens); past the end only through rounding at uniform ~ 1: the last kept token
    i = min(int(np.searchsorted(cdf, uniform * cdf[-1], side="right")), len(cdf) - 1)
    while weights[i] == 0.0:  # the vocabulary's tail after the last kept token
        i -= 1
    return int(ids[i]) if ids is not None else i


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
