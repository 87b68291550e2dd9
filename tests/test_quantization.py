"""Quantization: primitives, the quantize pass, and engines vs HF with the same
fake-quantized weights (the quantization error is then not the engine's to explain)."""

import json

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.quantization import primitives as prim
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.scale_search import int4_grid
from bessemer.runtime.llm import LLM
from conftest import _hf_model
from tolerances import (FAKE_QUANT_LOGITS_ATOL, FAKE_QUANT_LOGITS_RTOL, SQNR_INT4_G64_DB, SQNR_INT8_DB,
                        W4_BF16_FAKE_QUANT_LOGITS_RTOL)


def _gaussian(n=96, k=192, seed=0):
    return np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)


def test_int8_round_trip_and_sqnr():
    w = _gaussian()
    q, s = prim.quantize_int8_per_channel(w)
    assert q.dtype == np.int8 and np.abs(q).max() == 127
    assert np.abs(prim.dequantize_int8_per_channel(q, s) - w).max() <= s.max() / 2 + 1e-6
    assert prim.sqnr_db(w, prim.dequantize_int8_per_channel(q, s)) >= SQNR_INT8_DB


@pytest.mark.parametrize("zero_point", [False, True])
def test_int4_round_trip_and_sqnr(zero_point):
    w = _gaussian()
    scale, offset = prim.int4_group_params(w, 64, zero_point)
    codes = prim.quantize_int4(w, scale, offset, 64)
    assert codes.max() <= 15
    approx = prim.dequantize_int4(codes, scale, offset, 64)
    # requantizing the dequantized weight is exact: the grid is consistent
    assert (prim.quantize_int4(approx, scale, offset, 64) == codes).all()
    assert prim.sqnr_db(w, approx) >= SQNR_INT4_G64_DB
    assert (prim.round_to_bf16(scale) == scale).all() and (prim.round_to_bf16(offset) == offset).all()
    zero_codes = np.rint(-offset / scale)
    if zero_point:  # zero is representable up to the offset's bf16 rounding (half an ulp: <= 2^-8 relative)
        assert (np.abs(zero_codes * scale + offset) <= 2.0 ** -8 * np.abs(offset)).all()
    else:  # -8 * scale is exact in bf16: zero is exact
        assert (zero_codes * scale + offset == 0).all()


def test_group_size_rule_for_dimensions_it_does_not_divide():
    assert prim.effective_group_size(576, 128) == 96  # SmolLM2 hidden size
    assert prim.effective_group_size(576, 64) == 64
    assert prim.effective_group_size(1536, 128) == 128
    assert prim.effective_group_size(40, 32) == 40  # no multiple of 16 divides: one group


def test_bad_quant_options():
    with pytest.raises(InvalidOptionError, match="group-size"):
        QuantConfig("w4a16", group_size=48)
    with pytest.raises(InvalidOptionError, match="--calib-data"):
        QuantConfig("w8a8-sq")
    with pytest.raises(InvalidOptionError, match="smoothquant-alpha must be in"):
        QuantConfig("w8a8-sq", calib_data="x.txt", smoothquant_alpha=1.5)
    with pytest.raises(InvalidOptionError, match="apply to --quant w8a8-sq only"):
        QuantConfig("w8a16", calib_backend="native")
    with pytest.raises(InvalidOptionError, match="--calib-data"):
        QuantConfig("w4a16-awq")
    with pytest.raises(InvalidOptionError, match="not supported"):
        QuantConfig("w3a16")


def _C_header(engine) -> str:
    from bessemer import _C

    return _C.EngineFile(str(engine / "rank0.engine")).header


def fake_quantize_rows(w: np.ndarray, quant: QuantConfig, int8: bool = False) -> np.ndarray:
    """dequantize(quantize(w)) of (N, K) rows by the primitives (int8: per channel, as lm_head)."""
    if quant.bits == 8 or int8:
        return prim.dequantize_int8_per_channel(*prim.quantize_int8_per_channel(w))
    g = prim.effective_group_size(w.shape[1], quant.group_size)
    scale, offset = int4_grid(w, g, quant.zero_point)  # the builder's grid
    return prim.dequantize_int4(prim.quantize_int4(w, scale, offset, g), scale, offset, g)


def _fake_quantize_hf(model, quant: QuantConfig):
    """HF model whose quantized linears and MoE experts hold dequantize(quantize(w)) (same primitives)."""
    import torch

    from test_moe_quant import fake_quantize_experts

    fake_quantize_experts(model, quant)
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear) or (name == "lm_head" and quant.lm_head == "none"):
                continue
            # a tied lm_head shares its Parameter with the embedding: both see the int8 table
            w = mod.weight.detach().numpy().astype(np.float32)
            approx = fake_quantize_rows(w, quant, int8=name == "lm_head")
            mod.weight.copy_(torch.from_numpy(approx))
            if quant.bits == 4 and name != "lm_head":
                # linear_w4a16@2 reads its activations rounded to bf16 (nearest even): the
                # reference rounds the same inputs so the comparison stays at fp32 tolerance
                mod.register_forward_pre_hook(lambda _m, args: (args[0].bfloat16().float(),))
    return model


QUANT_CASES = [("llama-untied", QuantConfig("w8a16")), ("llama-untied", QuantConfig("w4a16", group_size=32)),
               ("qwen2", QuantConfig("w8a16")), ("qwen2", QuantConfig("w4a16", group_size=64, zero_point=True)),
               ("llama-tied", QuantConfig("w8a16")), ("llama-tied", QuantConfig("w4a16", group_size=32)),
               ("llama-tied", QuantConfig("w4a16", group_size=64, zero_point=True, lm_head="none")),
               # one weight-only mode for each family added with issue 23
               ("llama-yarn", QuantConfig("w8a16")), ("llama-dynamic", QuantConfig("w4a16", group_size=32)),
               ("seed-oss", QuantConfig("w4a16", group_size=32, zero_point=True)), ("smollm3", QuantConfig("w8a16")),
               ("olmo2", QuantConfig("w4a16", group_size=32)), ("phi3", QuantConfig("w4a16", group_size=32)),
               ("qwen3", QuantConfig("w4a16", group_size=32)), ("granite", QuantConfig("w8a16")),
               ("gemma3", QuantConfig("w4a16", group_size=32)),
               # MoE: attention, experts (and Qwen3-MoE's dense layer 1) quantized; routers in fp32
               ("qwen3-moe", QuantConfig("w8a16")), ("mixtral", QuantConfig("w4a16", group_size=32)),
               ("gpt-oss", QuantConfig("w8a16")), ("qwen2-moe", QuantConfig("w8a16"))]
# quantized weights besides lm_head: qkv, o, gate_up, down per layer; a moe layer's router
# stays fp32 and its experts' gate_up and down are quantized (tests/test_moe_quant.py)
QUANTIZED_LINEARS = {"qwen3-moe": 2 + 4 + 2, "mixtral": 2 * 4, "gpt-oss": 2 * 4,
                     "qwen2-moe": 2 * 5 + 2 * 2}  # + the shared expert's gate_up, down and its sigmoid gate


@pytest.mark.parametrize("kind,quant", QUANT_CASES,
                         ids=[f"{k}-{q.mode}-g{q.group_size}-{q.lm_head}" for k, q in QUANT_CASES])
def test_quantized_engine_matches_fake_quantized_hf(kind, quant, tiny_checkpoint, tmp_path):
    import copy

    import torch

    ckpt = tiny_checkpoint(kind)
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    report = json.loads((engine / "build_report.json").read_text())
    # qkv, o, gate_up, down per layer, and lm_head (int8) unless lm_head="none"
    assert len(report["quant_error"]) == QUANTIZED_LINEARS.get(kind, 2 * 4) + (quant.lm_head == "int8")
    plan_ops = {s["op"] for s in json.loads(_C_header(engine))["plan"]["steps"]}
    tied = json.loads((ckpt / "config.json").read_text()).get("tie_word_embeddings", False)
    tied_int8 = tied and quant.lm_head == "int8"
    assert ("embedding_w8a16" in plan_ops) == tied_int8 and ("embedding" in plan_ops) != tied_int8
    from bessemer.runtime.inspect import describe, format_description

    text = format_description(describe(engine))
    # symmetric int4 stores scales only (4 + 16/G bits per weight), asymmetric offsets too
    header = json.loads(_C_header(engine))
    names = {t["name"] for t in header["tensors"]}
    has_offsets = any(n.endswith(".offsets") for n in names)
    assert has_offsets == (quant.bits == 4 and quant.zero_point)
    w4_versions = {s["version"] for s in header["plan"]["steps"] if s["op"] == "linear_w4a16"}
    assert w4_versions == (set() if quant.bits == 8 else {2} if quant.zero_point else {3})
    bits = report["bits_per_weight"]
    assert describe(engine)["bits_per_weight"] == bits and f"decoder {bits['decoder']['bpw']:.2f}" in text
    if quant.bits == 4 and kind not in QUANTIZED_LINEARS:  # MoE experts stay fp32 and count as such
        # bf16 parameters per group; down_proj's K = 88 is one group
        per_group = 16 * (2 if quant.zero_point else 1)
        assert 4 + per_group / 88 <= bits["decoder"]["bpw"] <= 4 + per_group / quant.group_size
    worst = min(report["quant_error"].items(), key=lambda kv: kv[1]["sqnr_db"])
    assert f"SQNR min {worst[1]['sqnr_db']:.1f} dB" in text and worst[0] in text  # inspect shows them
    config = json.loads((engine / "config.json").read_text())
    assert config["quant"]["mode"] == quant.mode and config["quant"]["exclude_modules"] == ["model.embed_tokens"]
    assert config["quant"]["lm_head"] == quant.lm_head
    hf = _fake_quantize_hf(copy.deepcopy(_hf_model(str(ckpt), "float32")), quant)
    llm = LLM(engine, num_threads=2)
    prompts = [list(range(5, 25)), [7, 8, 9]]
    rtol = W4_BF16_FAKE_QUANT_LOGITS_RTOL if quant.bits == 4 else FAKE_QUANT_LOGITS_RTOL
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=2)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
        err = np.abs(got - ref).max()
        assert err <= FAKE_QUANT_LOGITS_ATOL + rtol * np.abs(ref).max(), err
