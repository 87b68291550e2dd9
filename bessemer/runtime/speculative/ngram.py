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

    def propose(self, requests: list[tuple[Sequence, int]]) -> list[tuple[list[int], None]]:
        """requests: (sequence, at most k drafts). Returns (drafts, None: point masses)."""
        return [(lookup(seq.token_ids, k, self.ngram_min, self.ngram_max), None) for seq, k in requests]

    def release(self, seq: Sequence) -> None:
        pass


def lookup(token_ids: list[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix
    (ngram_max down to ngram_min tokens) of `token_ids`."""
    tokens = np.asarray(token_ids, dtype=np.int64)  # (L,)
    length = len(tokens)
    for n in range(min(ngram_max, length - 1), ngram_min - 1, -1):
        # windows starting at 0..L-n-1: every occurrence but the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # (L - n, n)
        hits = np.flatnonzero((windows == tokens[length - n:]).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start:start + k].tolist()
    return []
