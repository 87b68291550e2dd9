"""AWQ and GPTQ against round-to-nearest on the quantity each one minimises (output error
on real-looking activations), and their folding/storage invariants."""

import numpy as np
import pytest

from bessemer.quantization import primitives as prim
from bessemer.quantization.awq import fake_quant_int4, search_scale
from bessemer.quantization.channel_scales import Transform
from bessemer.quantization import fp8
from bessemer.quantization.gptq import gptq_fp8, gptq_int4


def _activations(rows=512, k=128, seed=0):
    """Correlated activations with a few salient channels, as in real LLM layers."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)).astype(np.float32) / np.sqrt(k)
    x = rng.standard_normal((rows, k)).astype(np.float32) @ (np.eye(k, dtype=np.float32) + mix)
    x[:, rng.choice(k, 4, replace=False)] *= 12.0
    return x


def _out_err(x, w, approx):
    return float(((x @ (w - approx).T) ** 2).mean())


def test_gptq_beats_rtn_on_output_error_and_stays_on_the_grid():
    rng = np.random.default_rng(1)
    x, w = _activations(), rng.standard_normal((48, 128)).astype(np.float32)
    codes, scale, offset = gptq_int4(w, x.T.astype(np.float64) @ x, 32, zero_point=False)
    gptq = prim.dequantize_int4(codes, scale, offset, 32)
    rtn = fake_quant_int4(w, 32, False)
    assert _out_err(x, w, gptq) < 0.8 * _out_err(x, w, rtn)
    assert codes.max() <= 15 and (prim.quantize_int4(gptq, scale, offset, 32) == codes).all()
    ordered, _, _ = gptq_int4(w, x.T.astype(np.float64) @ x, 32, zero_point=True, act_order=True)
    assert ordered.shape == codes.shape


def _unblocked_gptq(w, hessian, round_column, act_order):
    """GPTQ as the paper states it (Frantar et al., 2022, without lazy batch updates), in
    float64: each column rounded, its error spread at once over every later column through
    the upper Cholesky factor of the inverse (dampened) Hessian."""
    from bessemer.quantization.gptq import DAMP

    W, H, k = np.array(w, np.float64), np.array(hessian, np.float64), w.shape[1]
    dead = np.diag(H) == 0
    H[dead, dead], W[:, dead] = 1.0, 0.0
    H += DAMP * np.diag(H).mean() * np.eye(k)
    perm = np.argsort(-np.diag(H), kind="stable") if act_order else np.arange(k)
    W, H = W[:, perm], H[perm][:, perm]
    U = np.linalg.cholesky(np.linalg.inv(H)).T  # H^-1 = U^T U
    Q = np.zeros_like(W)
    for i in range(k):
        Q[:, i] = round_column(W[:, i].astype(np.float32), perm[i])
        W[:, i:] -= np.outer((W[:, i] - Q[:, i]) / U[i, i], U[i, i:])
    return Q[:, np.argsort(perm)]


def test_gptq_blocks_and_column_order_match_the_unblocked_algorithm():
    """The builder's GPTQ (float32, columns in blocks of BLOCK with lazy updates, act-order
    permutation) chooses the codes of the unblocked float64 statement: K = 320 spans three
    blocks, with a dead input channel. A code may flip only where a value lies within float32
    rounding of a grid midpoint: at most 1% of them (none measured)."""
    from bessemer.quantization.gptq import BLOCK, gptq

    rng = np.random.default_rng(3)
    x, w = _activations(rows=1024, k=320, seed=2), rng.standard_normal((64, 320)).astype(np.float32)
    x[:, 7] = 0.0
    h = x.T.astype(np.float64) @ x
    assert w.shape[1] > 2 * BLOCK
    for name, grid in _grids(w).items():
        for act_order in (False, True):
            got = gptq(w, h, grid, act_order)
            want = _unblocked_gptq(w, h, grid.round, act_order)
            same = np.isclose(got, want, rtol=1e-6, atol=0).mean()
            assert same >= 0.99, (name, act_order, same)


def _grids(w):
    """The grids GPTQ rounds to (gptq.ColumnGrid): E4M3 per output row, int4 groups of 32 with
    offsets, and the two-level format's sub-block grid, whose divisor is 1 where a scale is 0."""
    from bessemer.quantization.gptq import ColumnGrid

    scale, offset = (v.T.copy() for v in prim.int4_group_params(w, 32, zero_point=True))  # (K/32, N)
    zeroed = scale.copy()
    zeroed[1, ::5] = 0.0
    return {"e4m3": ColumnGrid("e4m3", fp8.channel_scales(w)),
            "int4 g32": ColumnGrid("int4", scale, offset, scale, 32),
            "int4 zero scales": ColumnGrid("int4", zeroed, offset, np.where(zeroed > 0, zeroed, np.float32(1)), 32)}


@pytest.mark.parametrize("n,k", [(37, 320), (200, 96)])
def test_native_gptq_columns_are_the_numpy_reference_bit_for_bit(n, k):
    """gptq's native column loop (gptq_block_columns: its rounding to each grid, the in-block
    error updates, rows over threads) against its NumPy statement gptq_columns_reference, bit
    for bit: K = 320 spans three blocks of 128 (the last partial), N = 37 is no multiple of a
    vector, an input channel is dead; act-order permutes the columns; 1 and 3 threads."""
    from bessemer import _C
    from bessemer.quantization.gptq import gptq, gptq_columns_reference

    rng = np.random.default_rng(5)
    x, w = _activations(rows=512, k=k, seed=6), rng.standard_normal((n, k)).astype(np.float32)
    x[:, 3] = 0.0
    h = x.T.astype(np.float64) @ x
    for name, grid in _grids(w).items():
        for act_order in (False, True):
            got = gptq(w, h, grid, act_order)
            want = gptq(w, h, grid, act_order, columns=gptq_columns_reference)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (name, act_order)
        hinv = np.triu(rng.standard_normal((k, k)).astype(np.float32)) + 4 * np.eye(k, dtype=np.float32)
        order = rng.permutation(k)
        outs = []
        for threads in (1, 3):
            wt, qt = w.T.copy(), np.zeros((k, n), np.float32)
            err = _C.gptq_block_columns(wt, hinv, 0, min(k, 128), order, qt, grid.kind, grid.scale, grid.offset,
                                        grid.divisor, grid.group, threads)
            outs.append((wt, qt, err))
        wt, qt = w.T.copy(), np.zeros((k, n), np.float32)
        err = gptq_columns_reference(wt, hinv, 0, min(k, 128), order, qt, grid)
        for threads, (got_wt, got_qt, got_err) in zip((1, 3), outs):
            assert np.array_equal(got_qt, qt) and np.array_equal(got_err, err), (name, threads)
            assert np.array_equal(got_wt, wt), (name, threads)


def test_native_e4m3_rounding_is_the_reference_at_ties_edges_and_nan():
    """The native loop's E4M3 rounding (the KV cache's encoder, kv_codec.h) against
    ColumnGrid.round (fp8.round_to_e4m3) on the values where roundings part: every midpoint
    between E4M3 values and its float32 neighbours, subnormals, +-0, beyond +-448, NaN; both the
    8-wide and the scalar path (N = 8 * m + 5)."""
    from bessemer import _C
    from bessemer.quantization.gptq import ColumnGrid, gptq_columns_reference

    vals = np.unique(np.abs(fp8._code_values()[np.isfinite(fp8._code_values())]))
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    row = np.concatenate([mids, -mids, np.nextafter(mids, np.float32(0)), np.nextafter(mids, np.float32(1e4)),
                          np.float32([0.0, -0.0, 2 ** -10, -2 ** -12, 500.0, -1e30, np.nan, 448.0])])
    n = len(row) // 8 * 8 + 5
    row = np.resize(row, n).astype(np.float32)
    grid = ColumnGrid("e4m3", np.ones(n, np.float32))
    hinv = np.eye(2, dtype=np.float32)
    order = np.arange(2)
    outs = []
    for native in (True, False):
        wt, qt = np.stack([row, row]), np.zeros((2, n), np.float32)
        if native:
            _C.gptq_block_columns(wt, hinv, 0, 2, order, qt, "e4m3", grid.scale, None, None, 0, 1)
        else:
            gptq_columns_reference(wt, hinv, 0, 2, order, qt, grid)
        outs.append(qt[0])
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("k,rows", [(96, 1024), (320, 200)])
def test_inverse_cholesky_factor_is_the_textbook_one(k, rows):
    """gptq.inverse_cholesky_upper against numpy's chol(inv(H)).T: upper triangular, the same
    factor to float64 rounding (relative 1e-9 of its largest entry), on a well-conditioned
    Hessian and on one with fewer rows than columns (singular until GPTQ's dampening)."""
    import torch

    from bessemer.quantization.gptq import DAMP, inverse_cholesky_upper

    x = _activations(rows=rows, k=k, seed=4).astype(np.float64)
    h = x.T @ x
    h += DAMP * np.diag(h).mean() * np.eye(k)
    got = inverse_cholesky_upper(torch.from_numpy(h)).numpy()
    want = np.linalg.cholesky(np.linalg.inv(h)).T
    assert np.array_equal(got, np.triu(got)) and (np.diag(got) > 0).all()
    assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max()


def test_gptq_fp8_beats_nearest_on_output_error_and_stays_on_the_e4m3_grid():
    """E4M3 codes chosen by GPTQ on the round-to-nearest per-channel grid (same scales, so
    the same kernel reads them) leave a smaller layer-output error than round to nearest."""
    rng = np.random.default_rng(3)
    x, w = _activations(), rng.standard_normal((48, 128)).astype(np.float32)
    h = x.T.astype(np.float64) @ x
    codes, scale = gptq_fp8(w, h)
    nearest_codes, nearest_scale = fp8.quantize_fp8_per_channel(w)
    np.testing.assert_array_equal(scale, nearest_scale)
    chosen = fp8.dequantize_fp8_per_channel(codes, scale)
    nearest = fp8.dequantize_fp8_per_channel(nearest_codes, nearest_scale)
    assert _out_err(x, w, chosen) < 0.8 * _out_err(x, w, nearest)
    assert not np.isin(codes, fp8.NAN_CODES).any()
    assert (codes != nearest_codes).mean() > 0.05  # the search moved codes off the nearest ones
    ordered, ordered_scale = gptq_fp8(w, h, act_order=True)
    assert ordered.shape == codes.shape and (ordered_scale == scale).all()


def test_awq_scales_reduce_output_error_and_fold_exactly():
    rng = np.random.default_rng(2)
    x, w = _activations(), rng.standard_normal((64, 128)).astype(np.float32)
    s, alpha, ratio = search_scale([w[:32], w[32:]], np.abs(x).mean(axis=0), x, 32, zero_point=False)
    assert ratio < 1.0 and 0.0 <= alpha < 1.0
    awq = fake_quant_int4(w * s[None, :], 32, False) / s[None, :]
    assert _out_err(x, w, awq) < _out_err(x, w, fake_quant_int4(w, 32, False))
    # folding: (x / s) @ (w * s)^T == x @ w^T, with the 1/s applied to what produced x
    norm = rng.standard_normal(128).astype(np.float32)
    folded_norm = Transform(row=(1 / s).astype(np.float32)).apply(norm)
    scaled_w = Transform(col=s).apply(w)
    assert np.allclose((x * folded_norm) @ scaled_w.T, (x * norm) @ w.T, rtol=1e-4, atol=1e-3)


def test_calibration_statistics_match_a_direct_forward(smollm2_dir, tmp_path, monkeypatch):
    """collect() over two windows vs the same windows run through HF by hand: the
    per-channel statistics of one linear's input aggregate over every row of every window."""
    import torch

    from bessemer.quantization.calibration import CalibrationSpec, calibration_windows, collect
    from conftest import WIKITEXT, _hf_model, linear_input_keys

    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path))
    spec = CalibrationSpec(WIKITEXT, num_samples=2, seq_len=32)
    keys = set(linear_input_keys(smollm2_dir).values())
    stats = collect(smollm2_dir, spec, keys)["model.layers.1.mlp.down_proj"]
    model, rows = _hf_model(str(smollm2_dir), "float32"), []
    handle = model.model.layers[1].mlp.down_proj.register_forward_hook(
        lambda m, args, out: rows.append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for w in calibration_windows(smollm2_dir, spec):
            model(torch.tensor([w]))
    handle.remove()
    x = torch.cat(rows).double().numpy()  # (64, intermediate)
    assert int(stats["rows"]) == len(x) == 64
    np.testing.assert_allclose(stats["abs_max"], np.abs(x).max(axis=0), rtol=1e-5)
    np.testing.assert_allclose(stats["abs_mean"], np.abs(x).mean(axis=0), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(stats["hessian"], x.T @ x, rtol=1e-4, atol=1e-4 * np.abs(x.T @ x).max())
    cached = collect(smollm2_dir, spec, keys)["model.layers.1.mlp.down_proj"]  # second call: from the cache
    np.testing.assert_array_equal(cached["abs_max"], stats["abs_max"])
