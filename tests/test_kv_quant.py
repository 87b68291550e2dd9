"""Quantized KV cache (--kv-cache-dtype int8 | fp8): the reference codecs, tiny engines vs HF
with the same fake quantization of K (after RoPE) and V, KV accounting, SmolLM2 perplexity.

The HF oracle runs its own eager attention on K and V passed through
quantization/kv_cache.fake_quantize_kv (per (token, KV head) rows, the cache write's
reference), registered as an attention implementation, so prefill and generate (whose
DynamicCache holds float rows, re-quantized identically at every step) both see what the
engine's cache gives back.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bessemer.quantization import fp8
from bessemer.quantization import kv_cache as kvq
from bessemer.runtime.llm import LLM, SamplingParams
from conftest import WIKITEXT
from greedy_ties import assert_same_but_at_a_tie
from hf_kv_quant import register_hf_kvq
from tolerances import (KVQ_ERROR_RATIO, KVQ_GREEDY_TIE_MARGIN, KVQ_INT8_PPL_REL, KVQ_FP8_PPL_REL,
                        KVQ_LOGITS_ATOL, KVQ_LOGITS_RTOL, KVQ_FP8_MIN_SQNR_DB, KVQ_INT8_MIN_SQNR_DB)

KINDS = ["int8", "fp8"]


# ---------------------------------------------------------------- reference codecs

def test_e4m3_codec_equals_torch_float8_e4m3fn():
    import torch

    rng = np.random.default_rng(0)
    values = fp8.decode_e4m3(np.arange(256, dtype=np.uint8))
    finite = np.unique(values[np.isfinite(values)]).astype(np.float64)
    ties = ((finite[1:] + finite[:-1]) / 2).astype(np.float32)  # exact midpoints: ties to even
    y = np.concatenate([rng.uniform(-448, 448, 20000), rng.standard_normal(20000) * 0.02, ties, finite,
                        [-0.0, 2.0 ** -10, 2.0 ** -6 - 2.0 ** -12]]).astype(np.float32)
    ours = fp8.encode_e4m3(y)
    theirs = torch.from_numpy(y).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    np.testing.assert_array_equal(ours, theirs)
    decoded = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    ok = np.isfinite(decoded)
    np.testing.assert_array_equal(values[ok], decoded[ok])


@pytest.mark.parametrize("kind,min_db", [("int8", KVQ_INT8_MIN_SQNR_DB), ("fp8", KVQ_FP8_MIN_SQNR_DB)])
def test_kv_quantization_round_trip(kind, min_db):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 3, 64)).astype(np.float32)  # (tokens, heads, D)
    x[5, 1] *= 40.0  # an outlier row coarsens only itself
    x[7, 2] = 0.0    # a zero row round-trips exactly
    back = kvq.fake_quantize_kv(x, kind)
    assert np.array_equal(back[7, 2], x[7, 2])
    amax = np.abs(x).max(axis=-1, keepdims=True)
    if kind == "int8":  # RTN: at most half a step per element
        assert np.all(np.abs(back - x) <= amax / 127 * (0.5 + 1e-6))
    else:  # 3 mantissa bits: at most 2^-4 relative (normals) or half a subnormal step
        assert np.all(np.abs(back - x) <= np.maximum(np.abs(x) * 2.0 ** -4, amax / 448 * 2.0 ** -10) * (1 + 1e-6))
    noise = np.maximum(((back - x) ** 2).sum(axis=-1), 1e-30)
    sqnr = 10 * np.log10(np.maximum((x ** 2).sum(axis=-1), 1e-30) / noise)
    assert np.median(sqnr) >= min_db, np.median(sqnr)
    assert abs(sqnr[5, 1] - np.median(sqnr)) < 6  # per-row scale: the outlier row keeps its SQNR


# ---------------------------------------------------------------- tiny engines vs HF

_HF: dict = {}


def _hf(ckpt, kind: str | None):
    import torch
    from transformers import AutoModelForCausalLM

    key = (str(ckpt), kind)
    if key not in _HF:
        impl = register_hf_kvq(kind) if kind else "eager"
        _HF[key] = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32, attn_implementation=impl).eval()
    return _HF[key]


def _hf_logits(ckpt, kind, ids):
    import torch

    with torch.no_grad():
        return _hf(ckpt, kind)(torch.tensor([ids])).logits[0].numpy()


def _prompts(lengths, seed=2):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 250, n).tolist() for n in lengths]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", ["llama-untied", "mistral"])  # GQA; sliding window 8
def test_tiny_engine_matches_hf_with_fake_quantized_kv(family, kind, tiny_checkpoint, tiny_engine):
    ckpt = tiny_checkpoint(family)
    llm = LLM(tiny_engine(family, kv_block_size=4, max_num_tokens=24, kv_cache_dtype=kind), num_threads=2)
    prompts = _prompts([11, 23, 6, 39])
    for num_prefill in (None, 3):  # all prefill (chunked by 24), then prefill 3 + decode steps
        for ids, got in zip(prompts, llm.score(prompts, num_prefill=num_prefill)):
            ref_q, ref = _hf_logits(ckpt, kind, ids), _hf_logits(ckpt, None, ids)
            err = np.abs(got - ref_q).max()
            bound = KVQ_LOGITS_ATOL + KVQ_LOGITS_RTOL * np.abs(ref_q).max()
            assert err <= bound, f"{family} {kind}: max |engine - HF fake-quant| = {err:.3g} > {bound:.3g}"
            ours, theirs = np.abs(got - ref).max(), np.abs(ref_q - ref).max()
            assert theirs > 0 and ours <= KVQ_ERROR_RATIO * theirs, (ours, theirs)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_greedy_matches_hf_generate_with_fake_quantized_kv(kind, tiny_checkpoint, tiny_engine):
    import torch

    ckpt = tiny_checkpoint("llama-untied")
    model = _hf(ckpt, kind)
    llm = LLM(tiny_engine("llama-untied", kv_cache_dtype=kind), num_threads=2)
    prompts = _prompts([4, 13, 30], seed=3)
    outs = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    for p, out in zip(prompts, outs):
        with torch.no_grad():
            ids = torch.tensor([p])  # explicit mask: generate would mask prompt tokens equal to pad_token_id
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
        assert_same_but_at_a_tie(out.token_ids, ref, lambda prefix, p=p: _hf_logits(ckpt, kind, p + prefix)[-1],
                                 KVQ_GREEDY_TIE_MARGIN, (kind, p))


@pytest.mark.parametrize("kind", KINDS)
def test_kv_accounting_and_engine_record(kind, tiny_engine):
    f32, q = tiny_engine("llama-untied"), tiny_engine("llama-untied", kv_cache_dtype=kind)
    cfg = json.loads((q / "config.json").read_text())
    assert cfg["build"]["kv_cache_dtype"] == kind and cfg["build"]["dtype"] == "float32"
    gib = 512 * 1024 / 2**30  # binds between one sequence and max_batch_size x max_seq_len
    a, b = LLM(f32, num_threads=1, kv_cache_gib=gib), LLM(q, num_threads=1, kv_cache_gib=gib)
    kv = b.engine.header["plan"]["kv_cache"]
    assert kv["dtype"] == {"int8": "int8", "fp8": "float8_e4m3"}[kind] and kv["scales"] == "dynamic_per_token_head_float32"
    L, Hkv, D = kv["num_layers"], kv["num_kv_heads"], kv["head_dim"]
    assert b.engine.kv_bytes_per_token() == 2 * L * Hkv * (D + 4)  # codes + one fp32 scale per head
    assert a.engine.kv_bytes_per_token() == 2 * L * Hkv * D * 4
    for llm in (a, b):  # the executor allocates exactly what the block manager was told
        assert llm.executor.kv_cache_bytes == llm.num_kv_blocks * llm.block_size * llm.engine.kv_bytes_per_token()
        assert llm.executor.kv_cache_bytes <= gib * 2**30
    ratio = a.engine.kv_bytes_per_token() / b.engine.kv_bytes_per_token()
    assert b.num_kv_blocks == (gib * 2**30) // (b.engine.kv_bytes_per_token() * b.block_size)
    assert b.num_kv_blocks >= int(a.num_kv_blocks * ratio) - 1


# ---------------------------------------------------------------- SmolLM2 end to end

@pytest.mark.slow
def test_smollm2_perplexity_with_quantized_kv(smollm2_dir, tmp_path):
    """Short CI protocol (context 512, 2048 tokens): int8 KV <= +0.5% over the same engine
    with a float KV cache (the issue's target), fp8 KV within a loose bound."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig
    from bessemer.runtime.evaluate import perplexity, read_dataset, windows

    ppl = {}
    for kind in (None, "int8", "fp8"):
        out = build_engine(smollm2_dir, tmp_path / f"e-{kind}", BuildConfig(
            dtype="bfloat16", kv_cache_dtype=kind or "float32", max_seq_len=1024))
        llm = LLM(out, num_threads=2, enable_prefix_caching=False)
        ids = llm.tokenizer.encode(read_dataset(WIKITEXT), add_special_tokens=False)
        ppl[kind] = perplexity(llm.score, windows(ids, 512, 2048)).perplexity
    assert ppl["int8"] <= ppl[None] * (1 + KVQ_INT8_PPL_REL), ppl
    assert ppl["fp8"] <= ppl[None] * (1 + KVQ_FP8_PPL_REL), ppl


def test_cli_kv_cache_dtype(tiny_checkpoint, tmp_path):
    import subprocess

    ckpt = tiny_checkpoint("llama-untied")
    out = tmp_path / "engine"
    proc = subprocess.run(["build-engine", str(ckpt), "--output", str(out), "--kv-cache-dtype", "fp8", "-q"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["build"]["kv_cache_dtype"] == "fp8"
    info = subprocess.run(["bessemer", "inspect", str(out)], capture_output=True, text=True, timeout=600)
    assert "kv cache fp8" in info.stdout, info.stdout
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("kv_cache_dtype: int4\n")
    bad = subprocess.run(["build-engine", str(ckpt), "--output", str(tmp_path / "bad"), "--config", str(cfg)],
                         capture_output=True, text=True, timeout=600)
    errors = [line for line in bad.stderr.splitlines() if line.startswith("error:")]
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and len(errors) == 1, bad.stderr
    assert "--kv-cache-dtype" in errors[0] and "int8" in errors[0] and not (tmp_path / "bad").exists()
