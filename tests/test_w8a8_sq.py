"""w8a8-sq end to end: a tiny random model's engine against HF running the same
SmoothQuant math unfused (hooks on every nn.Linear: input / s, per-token int8 fake quant;
weight * s, per-channel int8 fake quant), the modelopt backend's statistics against the
native ones, and SmolLM2's WikiText-2 perplexity within +3% of the fp32 engine."""

from __future__ import annotations

import copy
import json
from collections import Counter

import numpy as np
import pytest
from conftest import WIKITEXT, _hf_model, linear_input_keys, llama_input_key
from tolerances import W8A8_FAKE_QUANT_LOGITS_RTOL, W8A8_SQ_PPL_REL

from bessemer import LLM
from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization import primitives as prim
from bessemer.quantization.calibration import CalibrationSpec, collect
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.modelopt_calib import modelopt_available
from bessemer.quantization.smoothquant import smooth_factors, weight_in_amax
from bessemer.runtime.evaluate import perplexity

needs_modelopt = pytest.mark.skipif(not modelopt_available(), reason="nvidia-modelopt not installed (extra 'quant')")


def _with_word_tokenizer(ckpt, out):
    """The tiny checkpoint plus a word-level tokenizer over its 250 ids (calibration reads
    text through the checkpoint's tokenizer)."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(ckpt, out)
    words = [w for w, _ in Counter(WIKITEXT.read_text(encoding="utf-8")[:200_000].split()).most_common(249)]
    tok = Tokenizer(models.WordLevel({"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    return out


def _smoothquant_hf(model, stats, alpha, smooth_o_proj=True):
    """HF model computing w8a8-sq unfused: each linear sees fake_quant_per_token(x / s) and
    holds fake_quant_per_channel(W * s), s from the reference functions."""
    import torch

    linears = {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and n != "lm_head"}
    groups: dict[str, list[str]] = {}
    for n in linears:
        groups.setdefault(llama_input_key(n), []).append(n)
    for key, names in groups.items():
        smooth = smooth_o_proj or not key.endswith("o_proj")
        ws = [linears[n].weight.detach().numpy() for n in names]
        s = smooth_factors(stats[key]["abs_max"], weight_in_amax(ws), alpha) if smooth else np.ones(ws[0].shape[1], np.float32)
        for n, w in zip(names, ws):
            q, sc = prim.quantize_int8_per_channel(w * s[None, :])
            with torch.no_grad():
                linears[n].weight.copy_(torch.from_numpy(prim.dequantize_int8_per_channel(q, sc)))

            def pre(mod, args, inv=(1.0 / s).astype(np.float32)):
                x = args[0].detach().numpy()
                flat = prim.fake_quant_int8_per_token(x.reshape(-1, x.shape[-1]), inv)
                return (torch.from_numpy(flat.reshape(x.shape)),)
            linears[n].register_forward_pre_hook(pre)
    return model


@pytest.fixture(scope="module")
def tiny_sq(tiny_checkpoint, tmp_path_factory):
    return _with_word_tokenizer(tiny_checkpoint("llama-untied"), tmp_path_factory.mktemp("sq") / "ckpt")


@pytest.mark.parametrize("o_proj", ["kernel", "none"])
def test_w8a8_sq_engine_matches_unfused_hf(tiny_sq, tmp_path, monkeypatch, o_proj):
    import torch

    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    quant = QuantConfig("w8a8-sq", calib_data=str(WIKITEXT), calib_samples=8, calib_seq_len=64,
                        calib_backend="native", o_proj_smoothing=o_proj, smoothquant_alpha=0.5,
                        lm_head="none")  # the oracle below runs lm_head in fp32; int8 lm_head: test_quantization
    engine = build_engine(tiny_sq, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    config = json.loads((engine / "config.json").read_text())
    assert config["quant"]["mode"] == "w8a8-sq" and config["quant"]["calib_backend"] == "native"
    assert config["quant"]["act_granularity"] == "per_token_dynamic" and "linear_w8a8@1" in config["plugins"]
    stats = collect(tiny_sq, CalibrationSpec(WIKITEXT, 8, 64), set(linear_input_keys(tiny_sq).values()))  # cached
    hf = _smoothquant_hf(copy.deepcopy(_hf_model(str(tiny_sq), "float32")), stats, 0.5, o_proj == "kernel")
    plain = _hf_model(str(tiny_sq), "float32")
    llm = LLM(engine, num_threads=2)
    prompts = [list(range(5, 45)), [7, 8, 9]]
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=2)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
            fp = plain(torch.tensor([ids])).logits[0].numpy()
        err, quant_err = np.abs(got - ref).max(), np.abs(fp - ref).max()
        # the engine is the unfused reference up to rare +-1 code flips, far below the
        # quantization error itself
        assert err <= W8A8_FAKE_QUANT_LOGITS_RTOL * np.abs(ref).max(), (err, quant_err)
        assert err < 0.1 * quant_err, (err, quant_err)


@needs_modelopt
def test_modelopt_statistics_match_native(tiny_sq, tmp_path, monkeypatch):
    """modelopt's per-channel activation maxima equal our hooks' abs_max, and its own
    pre_quant_scale for a linear alone (o_proj, down_proj) is our 1/s for that linear."""
    from bessemer.quantization.calibration import calibration_windows
    from bessemer.quantization.modelopt_calib import run_modelopt_smoothquant

    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path))
    spec = CalibrationSpec(WIKITEXT, 4, 64)
    native = collect(tiny_sq, spec, set(linear_input_keys(tiny_sq).values()))
    model = _hf_model(str(tiny_sq), "float32")
    weights = {n: m.weight.detach().numpy().copy() for n, m in copy.deepcopy(model).named_modules()
               if n.endswith("_proj")}
    mo = run_modelopt_smoothquant(copy.deepcopy(model), calibration_windows(tiny_sq, spec), 0.5)
    assert set(llama_input_key(n) for n in mo if n != "lm_head") == set(native)
    for name, st in mo.items():
        if name == "lm_head":
            continue
        np.testing.assert_allclose(st["abs_max"], native[llama_input_key(name)]["abs_max"], rtol=1e-5)
        s = smooth_factors(st["abs_max"], weight_in_amax([weights[name]]), 0.5)
        np.testing.assert_allclose(st["pre_quant_scale"], 1.0 / s, rtol=1e-4)


@needs_modelopt
def test_modelopt_backend_builds_and_is_recorded(tiny_sq, tmp_path, monkeypatch):
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    quant = QuantConfig("w8a8-sq", calib_data=str(WIKITEXT), calib_samples=4, calib_seq_len=64)  # auto
    engine = build_engine(tiny_sq, tmp_path / "e", BuildConfig(quant=quant))
    assert json.loads((engine / "config.json").read_text())["quant"]["calib_backend"] == "modelopt"
    native = build_engine(tiny_sq, tmp_path / "n", BuildConfig(quant=QuantConfig(
        "w8a8-sq", calib_data=str(WIKITEXT), calib_samples=4, calib_seq_len=64, calib_backend="native")))
    a, b = LLM(engine, num_threads=1), LLM(native, num_threads=1)
    ids = [list(range(3, 30))]
    np.testing.assert_allclose(a.score(ids)[0], b.score(ids)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_smollm2_w8a8_sq_perplexity_within_3_percent(smollm2_dir, smollm2_fp32_perplexity, tmp_path,
                                                     calibration_text):
    """Protocol of `bessemer eval`, lean for CI: 2048 tokens of WikiText-2, windows of 512
    (with the fp32 engine's score on them: conftest.smollm2_fp32_perplexity); calibrated on
    the held-out second half of the file."""
    quant = QuantConfig("w8a8-sq", calib_data=str(calibration_text), calib_samples=16, calib_seq_len=256,
                        calib_backend="native")
    engine = build_engine(smollm2_dir, tmp_path / "sq", BuildConfig(quant=quant))
    wins, ppl32 = smollm2_fp32_perplexity
    ppl_sq = perplexity(LLM(engine, num_threads=2).score, wins).perplexity
    print(f"wikitext ppl (2048 tokens, ctx 512): fp32 {ppl32:.4f}, w8a8-sq {ppl_sq:.4f} ({ppl_sq / ppl32 - 1:+.2%})")
    assert ppl_sq / ppl32 - 1 <= W8A8_SQ_PPL_REL, (ppl_sq, ppl32)


def test_smoothquant_factors_and_folds_are_exact():
    """s follows the formula, flattens an outlier channel, and the folds of
    smoothquant_transforms leave the fp32 layer outputs unchanged."""
    from bessemer.quantization.channel_scales import Fold, InputGroup
    from bessemer.quantization.smoothquant import smoothquant_transforms

    rng = np.random.default_rng(3)
    a, w = np.array([1.0, 16.0, 0.0, 4.0], np.float32), np.array([4.0, 1.0, 2.0, 0.25], np.float32)
    np.testing.assert_allclose(smooth_factors(a, w, 0.5), [0.5, 4.0, 1.0, 4.0], rtol=1e-6)  # dead channel: 1
    np.testing.assert_allclose(smooth_factors(a, w, 1.0), [1.0, 16.0, 1.0, 4.0], rtol=1e-6)
    H, I = 8, 12
    p = "model.layers.0"
    t = {f"{p}.input_layernorm.weight": rng.uniform(0.5, 1.5, H), f"{p}.post_attention_layernorm.weight":
         rng.uniform(0.5, 1.5, H), f"{p}.self_attn.q_proj.weight": rng.standard_normal((H, H)),
         f"{p}.self_attn.k_proj.weight": rng.standard_normal((4, H)), f"{p}.self_attn.v_proj.weight":
         rng.standard_normal((4, H)), f"{p}.self_attn.o_proj.weight": rng.standard_normal((H, H)),
         f"{p}.mlp.gate_proj.weight": rng.standard_normal((I, H)), f"{p}.mlp.up_proj.weight": rng.standard_normal((I, H)),
         f"{p}.mlp.down_proj.weight": rng.standard_normal((H, I))}
    t = {k: v.astype(np.float32) for k, v in t.items()}
    amax = {f"{p}.self_attn.q_proj": rng.uniform(0.1, 20, H), f"{p}.self_attn.o_proj": rng.uniform(0.1, 20, H),
            f"{p}.mlp.gate_proj": rng.uniform(0.1, 20, H), f"{p}.mlp.down_proj": rng.uniform(0.1, 20, I)}
    a, m = f"{p}.self_attn", f"{p}.mlp"
    groups = [InputGroup(f"{a}.q_proj", (), tuple(f"{a}.{x}_proj.weight" for x in "qkv"),
                         Fold((f"{p}.input_layernorm.weight",))),
              InputGroup(f"{a}.o_proj", (), (f"{a}.o_proj.weight",), None),
              InputGroup(f"{m}.gate_proj", (), (f"{m}.gate_proj.weight", f"{m}.up_proj.weight"),
                         Fold((f"{p}.post_attention_layernorm.weight",))),
              InputGroup(f"{m}.down_proj", (), (f"{m}.down_proj.weight",), Fold((f"{m}.up_proj.weight",)))]
    transforms, mult, report = smoothquant_transforms(t.get, groups, amax, 0.5, {f"{a}.o_proj.weight"})
    g = {k: transforms[k].apply(v) if k in transforms else v for k, v in t.items()}
    x = rng.standard_normal((5, H)).astype(np.float32)
    for norm, lin in [("input_layernorm", "self_attn.v_proj"), ("post_attention_layernorm", "mlp.gate_proj")]:
        np.testing.assert_allclose((x * g[f"{p}.{norm}.weight"]) @ g[f"{p}.{lin}.weight"].T,
                                   (x * t[f"{p}.{norm}.weight"]) @ t[f"{p}.{lin}.weight"].T, rtol=1e-4, atol=1e-4)
    o = f"{p}.self_attn.o_proj.weight"
    np.testing.assert_allclose((x * mult[o]) @ g[o].T, x @ t[o].T, rtol=1e-4, atol=1e-4)
    n = f"{p}.post_attention_layernorm.weight"
    xt, xg = x * t[n], x * g[n]
    h = (xt @ t[f"{p}.mlp.gate_proj.weight"].T) * (xt @ t[f"{p}.mlp.up_proj.weight"].T)
    h2 = (xg @ g[f"{p}.mlp.gate_proj.weight"].T) * (xg @ g[f"{p}.mlp.up_proj.weight"].T)
    np.testing.assert_allclose(h2 @ g[f"{p}.mlp.down_proj.weight"].T, h @ t[f"{p}.mlp.down_proj.weight"].T,
                               rtol=1e-4, atol=1e-4)
    assert set(report) == set(amax)
    _, mult_none, _ = smoothquant_transforms(t.get, groups, amax, 0.5)
    assert mult_none == {}
