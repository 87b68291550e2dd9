"""The perplexity protocol's per-window score (runtime/evaluate.window_nll) against torch's
cross entropy in fp64: windows shorter and longer than its row blocks (NLL_ROWS)."""

import numpy as np
import pytest

from bessemer.runtime.evaluate import NLL_ROWS, window_nll


@pytest.mark.parametrize("length", [2, NLL_ROWS, NLL_ROWS + 1, 3 * NLL_ROWS + 5])
def test_window_nll_is_the_summed_cross_entropy(length):
    import torch

    rng = np.random.default_rng(length)
    logits = (rng.standard_normal((length, 3000)) * 4).astype(np.float32)  # (tokens, vocab)
    logits[0, 7] = 80.0  # a peaked row: the log-sum-exp must not overflow
    window = rng.integers(0, 3000, length).tolist()
    want = torch.nn.functional.cross_entropy(torch.from_numpy(logits[:-1]).double(), torch.tensor(window[1:]),
                                             reduction="sum").item()
    assert window_nll(logits, window) == pytest.approx(want, rel=1e-12)
