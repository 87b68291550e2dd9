"""Which draft tokens the target model accepts, so that the output distribution is exactly
the target's (Leviathan et al. 2023, Chen et al. 2023).

The target scored the sequence's last token and the k drafts d_0..d_{k-1} in one step:
row i holds its logits for the token after d_{i-1}. For position i, p_i is the target's
sampling distribution there (after penalties, masks, temperature, top-k/p, min-p, given
that d_0..d_{i-1} were accepted) and q_i the distribution d_i was drawn from (a point mass
for n-gram drafts, which have none).

- Greedy: accept d_i while it is argmax p_i; the first mismatch is replaced by the argmax,
  and when all k match the last row gives one more token. Equal to decoding without drafts.
- Sampled: accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); on the first rejection
  draw from the residual max(0, p_i - q_i) (normalized) and stop; when all k are accepted
  draw one more token from p_k. Each emitted token is then distributed as p.

Both emit between 1 and k + 1 tokens.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from bessemer.runtime.sampler import distribution

# candidate ids (most likely first) and their probabilities, as sampler.distribution returns
Dist = tuple[np.ndarray, np.ndarray]


def accept_greedy(logits_at: Callable[[int], np.ndarray], drafts: list[int]) -> list[int]:
    """logits_at(i): (vocab,) processed logits of position i."""
    out = []
    for i, d in enumerate(drafts):
        best = int(np.argmax(logits_at(i)))
        out.append(best)
        if best != d:
            return out
    out.append(int(np.argmax(logits_at(len(drafts)))))
    return out


def accept_sampled(logits_at: Callable[[int], np.ndarray], drafts: list[int], draft_dists: list[Dist] | None,
                   params, rng: np.random.Generator) -> list[int]:
    """`params`: temperature (> 0), top_k, top_p, min_p of the target's sampling;
    `draft_dists[i]`: q_i, or None for point masses (n-gram drafts)."""
    out = []
    for i, d in enumerate(drafts):
        cands, p = distribution(logits_at(i), params.temperature, params.top_k, params.top_p, params.min_p)
        p_d = _prob(cands, p, d)
        q_d = 1.0 if draft_dists is None else _prob(*draft_dists[i], d)
        if q_d > 0 and rng.random() * q_d < p_d:  # u < p/q without dividing by a tiny q
            out.append(d)
            continue
        out.append(_draw_residual(cands, p, None if draft_dists is None else draft_dists[i], d, rng))
        return out
    cands, p = distribution(logits_at(len(drafts)), params.temperature, params.top_k, params.top_p, params.min_p)
    out.append(int(cands[rng.choice(len(cands), p=p)]))
    return out


def _prob(cands: np.ndarray, probs: np.ndarray, token: int) -> float:
    hit = np.flatnonzero(cands == token)
    return float(probs[hit[0]]) if len(hit) else 0.0


def _draw_residual(cands: np.ndarray, p: np.ndarray, q: Dist | None, draft: int, rng: np.random.Generator) -> int:
    """A draw from max(0, p - q) normalized; q a point mass at `draft` when None."""
    residual = p.copy()
    if q is None:
        residual[cands == draft] = 0.0
    else:
        q_cands, q_probs = q
        order = np.argsort(q_cands)
        pos = np.searchsorted(q_cands[order], cands)
        pos = np.minimum(pos, len(order) - 1)
        found = q_cands[order][pos] == cands
        residual -= np.where(found, q_probs[order][pos], 0.0)
        np.maximum(residual, 0.0, out=residual)
    total = residual.sum()
    if total <= 0.0:  # p <= q everywhere happens only when p == q: then nothing was rejected
        return int(cands[rng.choice(len(cands), p=p)])
    return int(cands[rng.choice(len(cands), p=residual / total)])
