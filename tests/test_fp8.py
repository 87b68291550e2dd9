"""--quant fp8: E4M3 primitives vs torch.float8_e4m3fn, the build (calibrated static
activation scales recorded in the engine), a tiny model's engine vs HF running the same
fake-quantized weights and activations, and SmolLM2 perplexity vs the fp32 engine."""

import json
from pathlib import Path

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.quantization import fp8
from bessemer.quantization.calibration import CalibrationSpec, collect
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.primitives import sqnr_db
from bessemer.runtime.llm import LLM
from conftest import SMOLLM2_CALIB, WIKITEXT, _hf_model, linear_input_keys, llama_input_key
from tolerances import FP8_FAKE_QUANT_LOGITS_RTOL, FP8_PPL_REL_TARGET, FP8_WEIGHT_MIN_SQNR_DB


def _torch_e4m3(x: np.ndarray) -> np.ndarray:
    import torch

    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.float8_e4m3fn).float().numpy()


# ---------------------------------------------------------------- primitives

def test_all_256_codes_match_torch():
    import torch

    codes = np.arange(256, dtype=np.uint8)
    ours = fp8.decode_e4m3(codes)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    np.testing.assert_array_equal(np.isnan(ours), np.isnan(theirs))
    assert set(codes[np.isnan(ours)]) == set(fp8.NAN_CODES)
    finite = ~np.isnan(ours)
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.nanmax(ours) == fp8.E4M3_MAX and ours[1] == 2.0 ** -9  # largest finite, smallest subnormal
    # round trip: every finite code encodes back to itself (including -0.0 -> 0x80)
    np.testing.assert_array_equal(fp8.encode_e4m3(ours[finite]), codes[finite])
    np.testing.assert_array_equal(fp8.round_to_e4m3(ours[finite]), ours[finite])


def test_rounding_matches_torch_on_random_values_and_ties():
    import torch

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.exp2(rng.uniform(-14, 9.5, 200_000))).astype(np.float32)
    grid = fp8.decode_e4m3(np.arange(0x7F, dtype=np.uint8))
    ties = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact midpoints: ties to even
    x = np.concatenate([x, ties, -ties])
    inside = np.abs(x) <= fp8.E4M3_MAX  # torch does not saturate (beyond 464 it gives NaN)
    np.testing.assert_array_equal(fp8.round_to_e4m3(x[inside]), _torch_e4m3(x[inside]))
    np.testing.assert_array_equal(fp8.encode_e4m3(x[inside]),
                                  torch.from_numpy(x[inside]).to(torch.float8_e4m3fn).view(torch.uint8).numpy())
    # saturation: beyond the range we clamp to +-448 (torch agrees once clamped)
    big = x[~inside]
    np.testing.assert_array_equal(fp8.round_to_e4m3(big), np.sign(big) * fp8.E4M3_MAX)
    np.testing.assert_array_equal(fp8.round_to_e4m3(big), _torch_e4m3(np.clip(big, -448, 448)))


def test_per_channel_weights_round_trip_and_sqnr():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((96, 192)).astype(np.float32)
    w[3] = 0.0  # an all-zero row keeps scale 1 and codes 0
    codes, scale = fp8.quantize_fp8_per_channel(w)
    approx = fp8.dequantize_fp8_per_channel(codes, scale)
    np.testing.assert_allclose(np.abs(approx).max(axis=1)[np.arange(96) != 3],
                               np.abs(w).max(axis=1)[np.arange(96) != 3], rtol=1e-6)  # amax -> 448 exactly
    assert scale[3] == 1.0 and not approx[3].any()
    assert sqnr_db(w, approx) >= FP8_WEIGHT_MIN_SQNR_DB
    # requantizing is exact; the relative error of a normal value is at most 2^-4
    np.testing.assert_array_equal(fp8.quantize_fp8_per_channel(approx)[0], codes)
    normal = np.abs(w / scale[:, None]) >= fp8.E4M3_MIN_NORMAL
    assert (np.abs(approx - w)[normal] <= np.abs(w)[normal] * 2.0 ** -4 + 1e-12).all()


def test_smoothed_statistics_are_those_of_the_smoothed_input():
    """GPTQ and the static scales of fp8 with smoothing read the statistics of x / s: the
    transformed ones equal statistics computed on x / s directly (and the input is unchanged)."""
    from bessemer.quantization.channel_scales import InputGroup
    from bessemer.quantization.smoothquant import smoothed_statistics

    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 12)).astype(np.float32) * np.exp2(rng.integers(-3, 6, 12)).astype(np.float32)
    inv = np.exp2(rng.integers(-4, 4, 12)).astype(np.float32)  # 1/s
    stats_of = lambda v: {"hessian": (v.T.astype(np.float64) @ v).astype(np.float32),  # noqa: E731
                          "abs_max": np.abs(v).max(0), "abs_mean": np.abs(v).mean(0), "sample": v[:5], "rows": 300}
    stats = {"a": stats_of(x), "b": stats_of(x)}
    out = smoothed_statistics(stats, [InputGroup("a", ("m",), ("m.weight",), None)], {"a": inv})
    want = stats_of(x * inv)
    for k in ("hessian", "abs_max", "abs_mean", "sample"):
        np.testing.assert_allclose(out["a"][k], want[k], rtol=1e-5, err_msg=k)
    assert out["b"] is stats["b"] and stats["a"]["abs_max"] is not out["a"]["abs_max"]
    np.testing.assert_array_equal(stats["a"]["abs_max"], np.abs(x).max(0))


def test_activation_fake_quant():
    x = np.array([[0.1, -3.0, 7.5, 1000.0]], np.float32)
    s = fp8.activation_scale(7.5)
    assert s == np.float32(7.5) / np.float32(448)
    q = fp8.quantize_activation(x, s)
    assert q[0, 2] == 448 and q[0, 3] == 448  # the calibrated max maps to 448; beyond saturates
    np.testing.assert_array_equal(fp8.fake_quant_activation(x, s), q * s)
    assert fp8.activation_scale(0.0) == 1.0


def test_fp8_config_and_options():
    with pytest.raises(InvalidOptionError, match="--quant fp8 .static activation scales or GPTQ rounding. needs "
                                                 "calibration text: pass --calib-data FILE"):
        QuantConfig("fp8")
    with pytest.raises(InvalidOptionError, match="needs calibration text"):
        QuantConfig("fp8", fp8_rounding="nearest", fp8_activations="static")
    # dynamic per-token activation scales and round-to-nearest codes: nothing to calibrate
    j = QuantConfig("fp8", fp8_rounding="nearest").to_json()
    assert j["fp8_activations"] == "dynamic" and j["activation_granularity"] == "per_token" and "calib_data" not in j
    with pytest.raises(InvalidOptionError, match="--fp8-activations applies to --quant fp8 only"):
        QuantConfig("w8a16", fp8_activations="static")
    with pytest.raises(InvalidOptionError, match="--fp8-activations must be one of dynamic, static"):
        QuantConfig("fp8", fp8_activations="per-tensor", calib_data="x.txt")
    with pytest.raises(InvalidOptionError, match="--zero-point applies to 4-bit modes only; fp8"):
        QuantConfig("fp8", zero_point=True, calib_data="x.txt")
    j = QuantConfig("fp8", calib_data="/some/dir/calib.txt").to_json()
    assert j["weight_dtype"] == j["activation_dtype"] == "float8_e4m3" and j["algorithm"] == "max"
    assert j["activation_granularity"] == "per_token" and j["granularity"] == "per_channel"
    assert QuantConfig("fp8", calib_data="x.txt", fp8_activations="static").to_json()["activation_granularity"] == \
        "per_tensor"
    assert j["calib_data"] == "calib.txt" and "group_size" not in j
    assert j["fp8_rounding"] == "gptq" and j["act_order"] is False  # the defaults, recorded
    assert QuantConfig("w4a16-gptq", calib_data="x.txt").act_order is True
    assert "fp8_rounding" not in QuantConfig("w4a16-gptq", calib_data="x.txt").to_json()
    with pytest.raises(InvalidOptionError, match="--fp8-rounding applies to --quant fp8 only"):
        QuantConfig("w8a16", fp8_rounding="gptq")
    with pytest.raises(InvalidOptionError, match="--fp8-rounding must be one of nearest, gptq"):
        QuantConfig("fp8", fp8_rounding="stochastic", calib_data="x.txt")
    with pytest.raises(InvalidOptionError, match="--act-order applies to w4a16-gptq, w4k-gptq and fp8"):
        QuantConfig("fp8", fp8_rounding="nearest", act_order=True, calib_data="x.txt")
    # per-group activation scales: dynamic fp8 only, supported widths; recorded only when set
    j = QuantConfig("fp8", fp8_rounding="nearest", fp8_act_group=32).to_json()
    assert j["fp8_act_group"] == 32 and j["activation_granularity"] == "per_token_pow2_group32"
    assert "fp8_act_group" not in QuantConfig("fp8", fp8_rounding="nearest").to_json()
    with pytest.raises(InvalidOptionError, match="--fp8-act-group must be one of 16, 32, 64, 128, got 48"):
        QuantConfig("fp8", fp8_rounding="nearest", fp8_act_group=48)
    with pytest.raises(InvalidOptionError, match="--fp8-act-group applies to --quant fp8 with dynamic"):
        QuantConfig("fp8", fp8_activations="static", fp8_act_group=32, calib_data="x.txt")
    with pytest.raises(InvalidOptionError, match="--fp8-act-group applies"):
        QuantConfig("w8a16", fp8_act_group=32)
    # SmoothQuant migration for fp8: calibrated, alpha in [0, 1], fp8 only
    assert QuantConfig("fp8", fp8_rounding="nearest", fp8_smoothing_alpha=0.5, calib_data="x.txt").needs_calibration
    with pytest.raises(InvalidOptionError, match="needs calibration text"):
        QuantConfig("fp8", fp8_rounding="nearest", fp8_smoothing_alpha=0.5)
    with pytest.raises(InvalidOptionError, match=r"--fp8-smoothing-alpha must be in \[0, 1\], got 1.5"):
        QuantConfig("fp8", fp8_smoothing_alpha=1.5, calib_data="x.txt")
    with pytest.raises(InvalidOptionError, match="applies to --quant fp8 only; w8a8-sq takes --smoothquant-alpha"):
        QuantConfig("w8a8-sq", fp8_smoothing_alpha=0.5, calib_data="x.txt")


# ---------------------------------------------------------------- engines

def _calib_text(tmp_path: Path) -> Path:
    """Calibration text from the second half of WikiText-2 valid: the perplexity protocol
    scores its first tokens, which calibration must not see."""
    text = WIKITEXT.read_text(encoding="utf-8")
    path = tmp_path / "calib.txt"
    path.write_text(text[len(text) // 2:], encoding="utf-8")
    return path


def _with_tokenizer(ckpt: Path, out: Path) -> Path:
    """A copy of a tiny checkpoint with a 250-token BPE trained on WikiText (calibration
    tokenizes its text with the checkpoint's tokenizer)."""
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    shutil.copytree(ckpt, out)
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([WIKITEXT.read_text(encoding="utf-8")[:200_000]],
                            trainers.BpeTrainer(vocab_size=250, special_tokens=["[UNK]"], limit_alphabet=120,
                                                show_progress=False))
    assert tok.get_vocab_size() <= 250
    tok.save(str(out / "tokenizer.json"))
    return out


def _fake_quantize_hf(model, scales: dict | None, act_group: int = 0):
    """HF model with dequantize(quantize(w)) weights and a pre-hook that rounds each linear's
    input to E4M3 with the static scale of that input (scales: input key -> s_x), or with
    each token's own scale (scales None: dynamic), refined per act_group columns."""
    import torch

    handles = []
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear) or name == "lm_head":
                continue
            w = mod.weight.detach().numpy().astype(np.float32)
            mod.weight.copy_(torch.from_numpy(fp8.dequantize_fp8_per_channel(*fp8.quantize_fp8_per_channel(w))))
            def round_input(m, args, s=scales[llama_input_key(name)] if scales else None):
                x = args[0].numpy()
                shape = x.shape
                x = x.reshape(-1, shape[-1])  # (tokens, K)
                xs = fp8.token_scales(x) if s is None else s
                if act_group:
                    xq = fp8.quantize_activation_grouped(x, xs, act_group) * xs
                    return (torch.from_numpy(xq.reshape(shape)),)
                return (torch.from_numpy(fp8.fake_quant_activation(x, xs).reshape(shape)),)

            handles.append(mod.register_forward_pre_hook(round_input))
    return model, handles


@pytest.mark.parametrize("kind,activations", [("llama-untied", "static"), ("qwen2", "static"),
                                              ("llama-untied", "dynamic"), ("qwen2", "dynamic"),
                                              ("llama-untied", "dynamic-g16"), ("qwen2", "dynamic-g16")])
def test_fp8_engine_matches_fake_quantized_hf(kind, activations, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    ckpt = _with_tokenizer(tiny_checkpoint(kind), tmp_path / "hf")
    calib = _calib_text(tmp_path)
    # the oracle below runs lm_head in fp32 (the int8 lm_head has its own test in test_quantization)
    # and rounds weights to nearest (GPTQ's codes: test_calibrated_quant, SmolLM2 gate below)
    activations, _, group = activations.partition("-g")
    quant = QuantConfig("fp8", calib_data=str(calib), calib_samples=4, calib_seq_len=64, lm_head="none",
                        fp8_rounding="nearest", fp8_activations=activations,
                        fp8_act_group=int(group) if group else None)
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    report = json.loads((engine / "build_report.json").read_text())
    config = json.loads((engine / "config.json").read_text())
    tensors = {t["name"]: t for t in report["tensors"]}
    assert tensors["model.layers.0.self_attn.o_proj.weight"]["dtype"] == "float8_e4m3"
    if activations == "dynamic":  # per-token scales in the kernel: nothing stored, nothing calibrated
        assert "linear_fp8@2" in config["plugins"] and "linear_fp8@1" not in config["plugins"]
        assert not any(n.endswith(".input_scale") for n in tensors) and report["calibration"] is None
        if group:  # the kernel's attr, recorded per weight
            assert all(e["activation_scales"] == f"dynamic per token, 2^-e per {group} columns"
                       for e in report["quant_error"].values())
        _check_logits(LLM(engine, num_threads=2), kind, tiny_checkpoint, scales=None, act_group=int(group or 0))
        return

    # the engine records a static scale per linear input: calibrated max|x| / 448
    stats = collect(ckpt, CalibrationSpec(calib, 4, 64), set(linear_input_keys(ckpt).values()))
    scales = {key: fp8.activation_scale(s["abs_max"].max()) for key, s in stats.items()}
    assert len(report["quant_error"]) == 2 * 4  # qkv, o, gate_up, down per layer; lm_head excluded
    for weight, e in report["quant_error"].items():
        module = weight.replace("qkv_proj", "q_proj").replace("gate_up_proj", "gate_proj").rsplit(".", 1)[0]
        assert e["input_scale"] == float(scales[llama_input_key(module)]) and e["dtype"] == "float8_e4m3", weight
    assert config["quant"]["mode"] == "fp8" and "linear_fp8@1" in config["plugins"]
    assert tensors["model.layers.0.self_attn.o_proj.weight.input_scale"]["shape"] == [1]
    _check_logits(LLM(engine, num_threads=2), kind, tiny_checkpoint, scales)


def _check_logits(llm, kind, tiny_checkpoint, scales, act_group=0):
    """The engine's logits vs HF with the same fake-quantized weights and activations."""
    import copy

    import torch

    hf_fp32 = _hf_model(str(tiny_checkpoint(kind)), "float32")
    hf, handles = _fake_quantize_hf(copy.deepcopy(hf_fp32), scales, act_group)
    prompts = [list(range(5, 45)), [7, 8, 9], list(range(100, 240, 3))]
    try:
        for ids, got in zip(prompts, llm.score(prompts, num_prefill=2)):
            with torch.no_grad():
                ref = hf(torch.tensor([ids])).logits[0].numpy()
                plain = hf_fp32(torch.tensor([ids])).logits[0].numpy()
            err, quant_err = np.abs(got - ref).max(), np.abs(got - plain).max()
            # matches the fake-quantized model, and far better than it matches the fp32 one
            assert err <= FP8_FAKE_QUANT_LOGITS_RTOL * np.abs(ref).max(), (err, quant_err)
            assert err <= 0.02 * quant_err, (err, quant_err)
    finally:
        for h in handles:
            h.remove()


@pytest.mark.slow
def test_smollm2_fp8_perplexity(smollm2_dir, smollm2_engine, tmp_path, smollm2_calibration):
    """WikiText-2 by the issue's protocol (8192 tokens, windows of 1024), calibration on the
    held-out second half: fp8 (GPTQ-rounded E4M3 weights, static E4M3 activations) within
    FP8_PPL_REL_TARGET of the fp32 engine. The calibration is the run's shared one (16 x 256
    tokens, collected once for this test and the 4-bit ones of test_quant_smollm2:
    conftest.smollm2_calibration); statistics computed afresh are tested against a direct
    forward of SmolLM2 in test_calibrated_quant."""
    from bessemer.runtime.evaluate import perplexity, read_dataset, windows

    quant = QuantConfig("fp8", calib_data=str(smollm2_calibration), **SMOLLM2_CALIB)
    engine = build_engine(smollm2_dir, tmp_path / "fp8", BuildConfig(quant=quant, max_seq_len=2048))
    base = LLM(smollm2_engine("float32"), num_threads=2, enable_prefix_caching=False)
    wins = windows(base.tokenizer.encode(read_dataset(WIKITEXT), add_special_tokens=False), 1024, 8192)
    ppl32 = perplexity(base.score, wins).perplexity
    ppl8 = perplexity(LLM(engine, num_threads=2, enable_prefix_caching=False).score, wins).perplexity
    assert ppl8 != ppl32  # the quantization is in effect
    print(f"fp8 ppl {ppl8:.4f} vs fp32 {ppl32:.4f}: {100 * (ppl8 / ppl32 - 1):+.2f}%")
    assert ppl8 <= ppl32 * (1 + FP8_PPL_REL_TARGET), (ppl8, ppl32)
    size = lambda e: (e / "rank0.engine").stat().st_size  # noqa: E731
    assert size(engine) < 0.6 * size(smollm2_engine("float32"))


def test_float32_encoder_equals_the_rounding_reference_at_every_boundary():
    """encode_e4m3 encodes float32 from its bits; the oracle is round_to_e4m3 (float64
    arithmetic) then the grid's code. Every midpoint between neighbouring codes, one float32
    ulp either side, the codes themselves, both signs, float32 subnormals, values beyond 448,
    infinities and NaN; float64 input keeps the float64 rounding (no double rounding)."""
    rng = np.random.default_rng(3)
    grid = fp8.decode_e4m3(np.arange(0x7F, dtype=np.uint8))
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)  # exact in float32
    up, down = np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf))
    special = np.array([0.0, 1e-45, 2.0 ** -10, 3 * 2.0 ** -11, 448, 449, 464, 465, 480, 1e30, np.inf, np.nan],
                       np.float32)
    x = np.concatenate([mids, up, down, grid, special,
                        (rng.standard_normal(100_000) * np.exp2(rng.uniform(-30, 12, 100_000))).astype(np.float32)])
    x = np.concatenate([x, -x])
    want = fp8._encode_rounded(fp8.round_to_e4m3(x))
    np.testing.assert_array_equal(fp8.encode_e4m3(x), want)
    np.testing.assert_array_equal(fp8.encode_e4m3(x.reshape(2, -1)), want.reshape(2, -1))  # shape kept
    # float64 just above the midpoint of codes 40 and 41: as float32 it would be the tie itself
    # (which goes to the even code 40); as float64 it rounds up to 41
    above = np.nextafter(np.float64(mids[40]), np.inf)
    assert np.float32(above) == mids[40] and fp8.encode_e4m3(mids[40:41])[0] == 40
    assert fp8.encode_e4m3(np.array([above]))[0] == 41
