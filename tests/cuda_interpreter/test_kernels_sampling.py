"""The device sampler (greedy argmax, temperature + top-k + top-p) under the Triton
interpreter vs ops.ref_sample_rows: the same token for every row and draw."""

import numpy as np

from interp_support import torch

from bessemer.plugins import ops
from bessemer.targets.cuda.kernels import sampling


def _run(logits, temperature, top_k, top_p, uniform, block):
    rows, vocab = logits.shape
    tokens = torch.full((rows,), -1, dtype=torch.int32)
    f32 = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))  # noqa: E731
    sampling.sample_kernel[(rows,)](f32(logits), f32(temperature), torch.from_numpy(np.asarray(top_k, np.int32)),
                                    f32(top_p), f32(uniform), tokens, V=vocab, LOGITS_STRIDE=vocab, BLOCK=block,
                                    SEARCH_STEPS=32)
    return tokens.numpy()


def test_greedy_is_the_first_index_of_the_maximum():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 300)).astype(np.float32)
    logits[1, [17, 250]] = 9.0  # a tie: the first wins, across chunks of 64
    logits[2] = -np.inf
    logits[2, 299] = -5.0  # the last index, everything else -inf
    zeros = np.zeros(3)
    tokens = _run(logits, zeros, zeros, np.ones(3), zeros, block=64)
    assert tokens.tolist() == [int(np.argmax(logits[0])), 17, 299]


def test_top_k_top_p_temperature_draws_match_the_reference():
    rng = np.random.default_rng(1)
    rows, vocab = 12, 250
    logits = (3 * rng.normal(size=(rows, vocab))).astype(np.float32)
    logits[5, :40] = logits[5, 0]  # 40-way tie at the top: top-k 10 keeps all 40 (ties are kept)
    temperature = np.array([0.7, 1.0, 1.5, 0.3, 1.0, 1.0, 0.9, 2.0, 1.0, 0.5, 1.2, 1.0])
    top_k = np.array([0, 5, 0, 50, 1, 10, 249, 0, 3, 0, 20, 250])
    top_p = np.array([1.0, 1.0, 0.9, 0.5, 1.0, 1.0, 0.95, 0.3, 0.99, 0.8, 0.7, 1.0])
    uniform = rng.random(rows)
    uniform[0], uniform[1] = 0.0, 1 - 2 ** -24  # the two ends of the draw
    tokens = _run(logits, temperature, top_k, top_p, uniform, block=256)
    expected = ops.ref_sample_rows(logits, temperature, top_k, top_p, uniform)
    assert tokens.tolist() == expected.tolist()
    # the draws are not trivially the argmax: the filters and the uniform decide
    assert len(set(tokens.tolist()) - set(np.argmax(logits, axis=1).tolist())) >= 6


def test_sampling_follows_the_kept_distribution():
    """Draws of one row at evenly spaced uniforms: each kept token is drawn for the share of
    them its renormalized probability covers (within one draw), nothing else is drawn."""
    rng = np.random.default_rng(2)
    vocab, draws = 32, 20
    logits = rng.normal(size=vocab).astype(np.float32)
    row = np.tile(logits, (draws, 1))
    uniform = (np.arange(draws) + 0.5) / draws
    tokens = _run(row, np.full(draws, 0.8), np.full(draws, 8), np.full(draws, 0.9), uniform, block=32)
    x = logits.astype(np.float64)
    keep = x >= np.sort(x)[-8]
    w = np.where(keep, np.exp((x - x.max()) / 0.8), 0.0)
    order = np.argsort(-x)
    mass = np.cumsum(w[order]) / w.sum()
    kept = order[: int(np.searchsorted(mass, 0.9) + 1)]
    p = np.zeros(vocab)
    p[kept] = w[kept] / w[kept].sum()
    counts = np.bincount(tokens, minlength=vocab)
    assert set(np.flatnonzero(counts)) <= set(kept.tolist())
    assert np.all(np.abs(counts - draws * p) <= 1.0 + 1e-9)
