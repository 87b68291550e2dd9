"""Which draft tokens the target accepts: those equal to the token it draws itself.

The target scored the sequence's last token and the k drafts d_0..d_{k-1} in one step: row
i holds its logits for the token after d_{i-1}. At each position the target draws its own
token t_i exactly as decoding without drafts would (sampler.sample: argmax, or the inverse
CDF of its distribution at the sequence's uniform for that position, runtime/random_stream.py)
and accepts d_i iff d_i == t_i; the first mismatch emits t_i and stops, and when all k
match the last row gives one more token. Every emitted token is the one decoding without
drafts gives (the same logits, bit for bit, with batch-invariant kernels; the same
uniform), so greedy and sampled output alike are exactly the target's, seed for seed.

The price, against the rejection-sampling rule (accept with min(1, p/q), else draw from
max(0, p - q); Leviathan et al. 2023): a draft is accepted with probability P(t_i = d_i)
instead of sum min(p, q). For n-gram drafts (a point mass q) both are p(d_i). A draft
engine draws its drafts with the same uniforms (draft_model.py), so where its distribution
q is close to p the two inverse CDFs pick the same token; its acceptance is the overlap of
the two CDFs' intervals in vocabulary order, at most sum min(p, q) and close to it when q is
close to p.

Emits between 1 and k + 1 tokens.
"""

from __future__ import annotations

from typing import Callable


def accept(draw_at: Callable[[int], int], drafts: list[int]) -> list[int]:
    """draw_at(i): the target's own token at draft position i (after drafts[:i]), drawn
    from its processed logits there. Returns the tokens to emit."""
    out = []
    for i, d in enumerate(drafts):
        token = draw_at(i)
        out.append(token)
        if token != d:
            return out
    out.append(draw_at(len(drafts)))
    return out
