"""Prompt-lookup (n-gram) drafting: no model. The sequence's last n tokens are searched for
in its earlier tokens (prompt and output); the tokens that followed the latest earlier
occurrence are the draft. Pays off when the answer copies from the input (rewriting,
correcting, quoting, code edits); costs one NumPy scan per step otherwise.
"""

from __future__ import annotations

import numpy as np

from bessemer.runtime.sequence import Sequence


class NgramProposer:
    def __init__(self, ngram_min: int, ngram_max: int):
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[list[int]]:
        """requests: (sequence, at most k drafts). Returns each one's drafts."""
        return [lookup(seq.token_ids, k, self.ngram_min, self.ngram_max) for seq, k in requests]

    def release(self, seq: Sequence) -> None:
        pass

    def close(self) -> None:
        pass


def lookup(token_ids: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix
    (ngram_max down to ngram_min tokens) of `token_ids`.

    One pass over the sequence finds where its last token occurred before; each longer
    suffix only filters those candidates, so a step costs O(L) plus the candidates'
    count per length, and stops at the first length nothing matches."""
    tokens = np.asarray(token_ids, dtype=np.int64)  # (L,)
    length = len(tokens)
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])  # earlier occurrences of the 1-gram suffix, by last index
    latest = None
    for n in range(1, min(ngram_max, length - 1) + 1):
        if n > 1:  # keep the ends whose occurrence extends to the n-gram suffix
            ends = ends[ends >= n - 1]
            ends = ends[tokens[ends - (n - 1)] == tokens[length - n]]
        if not len(ends):
            break
        if n >= ngram_min:
            latest = int(ends[-1])
    if latest is None:
        return []
    return tokens[latest + 1:latest + 1 + k].tolist()
