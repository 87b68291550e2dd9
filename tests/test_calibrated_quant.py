"""AWQ and GPTQ against round-to-nearest on the quantity each one minimises (output error
on real-looking activations), and their folding/storage invariants."""

import numpy as np

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
