"""The rule for two greedy decodings whose logits may differ within a tolerance: the same
tokens, or a first difference where the reference's two best logits nearly tie (there the
other side may pick the other token, and the sequences differ after it). Used where an engine
is held to HF on fake-quantized KV (test_kv_quant.py) and TP=2 to TP=1 (test_tensor_parallel.py)."""

from __future__ import annotations

from typing import Callable

import numpy as np


def assert_same_but_at_a_tie(got: list[int], want: list[int], last_logits: Callable[[list[int]], np.ndarray],
                             margin: float | Callable[[np.ndarray], float], what) -> None:
    """`got` equals the reference's `want`, or parts from it first at a position k where the
    reference's next-token logits after want[:k] (last_logits(want[:k]), (vocab,)) have their
    top two closer than `margin` (a number, or a function of those logits). One sequence a
    prefix of the other fails: that is a length bug, not a tie."""
    if got == want:
        return
    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    assert k < min(len(got), len(want)), (what, got, want)
    logits = np.asarray(last_logits(list(want[:k])))
    bound = margin(logits) if callable(margin) else margin
    top2 = np.sort(logits)[-2:]
    assert top2[1] - top2[0] < bound, \
        f"{what}: tokens part at {k} where the reference's top-2 logits are {top2[1] - top2[0]:.3g} apart " \
        f"(a tie is closer than {bound:.3g}): {got} vs {want}"
