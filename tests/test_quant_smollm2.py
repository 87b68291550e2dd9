"""Quantized SmolLM2 engines end to end: WikiText-2 perplexity relative to the fp32 engine
(the protocol of `bessemer eval`), within the accuracy bounds of issue 3.

Calibration uses the held-out second half of the file, statistics collected once per run
(conftest.smollm2_calibration).
"""

import copy
import json

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization import primitives as prim
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.evaluate import perplexity
from bessemer.runtime.llm import LLM
from conftest import SMOLLM2_CALIB as CALIB
from tolerances import MIXED_4_85_PPL_MAX_INCREASE, W8A16_PPL_MAX_INCREASE

# the real SmolLM2 end to end: each test builds and scores a quantized 135M engine
pytestmark = pytest.mark.slow


def _ppl(smollm2_dir, tmp_path, wins, quant: QuantConfig) -> float:
    engine = build_engine(smollm2_dir, tmp_path / quant.mode, BuildConfig(max_seq_len=1024, quant=quant))
    return perplexity(LLM(engine, num_threads=2).score, wins).perplexity


def test_w8a16_within_half_a_percent_of_fp32(smollm2_dir, smollm2_fp32_perplexity, tmp_path):
    wins, base = smollm2_fp32_perplexity
    ppl = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w8a16"))
    print(f"w8a16 ppl {ppl:.4f} vs fp32 {base:.4f} ({100 * (ppl / base - 1):+.2f}%)")
    assert ppl / base - 1 <= W8A16_PPL_MAX_INCREASE


@pytest.fixture(scope="module")
def rtn_g64_ppl(smollm2_dir, smollm2_fp32_perplexity, tmp_path_factory) -> float:
    """Round-to-nearest w4a16 g64: what calibrated rounding must beat."""
    wins, _ = smollm2_fp32_perplexity
    return _ppl(smollm2_dir, tmp_path_factory.mktemp("rtn-g64"), wins, QuantConfig("w4a16", group_size=64))


# AWQ and GPTQ are separate tests (one calibration each, about a minute apiece on 2 cores), so
# each claim passes or fails on its own; they share the RTN build above (conftest groups a
# module's tests that use its module fixtures onto one xdist worker) and, with every test
# here, the fp32 baseline of the run (conftest.smollm2_fp32_perplexity).
def test_w4a16_awq_beats_round_to_nearest(smollm2_dir, smollm2_fp32_perplexity, rtn_g64_ppl, tmp_path,
                                          smollm2_calibration):
    wins, base = smollm2_fp32_perplexity
    awq = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16-awq", group_size=64,
                                                         calib_data=str(smollm2_calibration), **CALIB))
    print(f"w4a16 g64 ppl vs fp32 {base:.4f}: RTN {rtn_g64_ppl:.4f}, AWQ {awq:.4f}")
    assert awq < rtn_g64_ppl


def test_w4a16_gptq_beats_round_to_nearest(smollm2_dir, smollm2_fp32_perplexity, rtn_g64_ppl, tmp_path,
                                           smollm2_calibration):
    wins, base = smollm2_fp32_perplexity
    # act-order: with 16 x 256 calibration rows, plain column order over-fits the Hessian of
    # the 1536-wide down_proj inputs (held-out ppl 27.3 vs RTN 25.1 when chosen); act-order gave
    # 23.4 then, and 20.52 vs RTN 27.45 here today (2048 tokens, searched scales).
    # Groups are static, so act-order costs nothing at run time.
    gptq = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16-gptq", group_size=64, act_order=True,
                                                          calib_data=str(smollm2_calibration), **CALIB))
    print(f"w4a16 g64 ppl vs fp32 {base:.4f}: RTN {rtn_g64_ppl:.4f}, GPTQ {gptq:.4f}")
    assert gptq < rtn_g64_ppl


def _q4_0_rule(w: np.ndarray) -> np.ndarray:
    """llama.cpp's Q4_0 (quantize_row_q4_0_ref, no importance matrix), as the reference of
    "4.5 bits per weight": groups of 32, d = v / -8 for the weight v of largest magnitude,
    stored in fp16, codes min(15, trunc(x / d + 8.5)), w = d * (code - 8)."""
    g = w.reshape(w.shape[0], -1, 32).astype(np.float32)
    v = np.take_along_axis(g, np.abs(g).argmax(axis=2)[..., None], axis=2)
    d = (v / -8.0).astype(np.float16).astype(np.float32)
    inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1.0), 0.0)
    codes = np.minimum(15, np.trunc(g * inv + 8.5))
    return ((codes - 8) * d).reshape(w.shape)


def test_w4a16_gptq_g32_beats_q4_0_at_equal_bits(smollm2_dir, smollm2_fp32_perplexity, tmp_path, smollm2_calibration):
    """Symmetric g32 (bf16 scales, no offsets: 4.5 bits per weight, Q4_0's price) with GPTQ
    codes on searched scales: lower held-out perplexity than HF running the same checkpoint
    with Q4_0-rounded decoder weights (and the engine's int8 lm_head table)."""
    import torch

    from bessemer.runtime.evaluate import hf_score_fn
    from conftest import _hf_model

    wins, base = smollm2_fp32_perplexity
    quant = QuantConfig("w4a16-gptq", group_size=32, calib_data=str(smollm2_calibration), **CALIB)
    engine = build_engine(smollm2_dir, tmp_path / "gptq-g32", BuildConfig(max_seq_len=1024, quant=quant))
    bits = json.loads((engine / "build_report.json").read_text())["bits_per_weight"]
    assert bits["decoder"]["bpw"] == 4.5
    ppl = perplexity(LLM(engine, num_threads=2).score, wins).perplexity
    hf = copy.deepcopy(_hf_model(str(smollm2_dir), "float32"))
    with torch.no_grad():
        for name, mod in hf.named_modules():
            if isinstance(mod, torch.nn.Linear):  # lm_head: the tied table, int8 as in the engine
                w = mod.weight.numpy()
                approx = (prim.dequantize_int8_per_channel(*prim.quantize_int8_per_channel(w)) if name == "lm_head"
                          else _q4_0_rule(w))
                mod.weight.copy_(torch.from_numpy(approx))
    q4_0 = perplexity(hf_score_fn(hf), wins).perplexity
    print(f"4.5 bpw ppl vs fp32 {base:.4f}: gptq g32 {ppl:.4f}, Q4_0 rule {q4_0:.4f}")
    assert ppl < q4_0


def test_mixed_precision_within_budget_beats_uniform_g32_with_the_same_table(smollm2_dir, smollm2_fp32_perplexity,
                                                                             tmp_path, smollm2_calibration):
    """--bits-per-weight 4.85 (all matrices, the tied table included, which a budget under
    ~5.2 stores in int4; round to nearest, so that the plan alone makes the difference): the
    engine's bits per weight stay within the budget, and the 0.35 bits per weight it spends on
    the most sensitive linears lower held-out perplexity below uniform w4a16 g32 with the
    same int4 table (4.5 bits per weight). Measured (this protocol): mixed 25.24, uniform
    26.02, fp32 18.51; uniform g32 with the int8 table (5.25 bits) 23.37 is better than both:
    the int4 table costs more than the plan wins back (see quantization/mixed_precision.py)."""
    wins, base = smollm2_fp32_perplexity
    mixed = QuantConfig("w4a16", group_size=32, bits_per_weight=4.85, calib_data=str(smollm2_calibration), **CALIB)
    engine = build_engine(smollm2_dir, tmp_path / "mixed", BuildConfig(max_seq_len=1024, quant=mixed))
    bits = json.loads((engine / "build_report.json").read_text())["bits_per_weight"]
    assert bits["all"]["bpw"] <= 4.85
    ppl = perplexity(LLM(engine, num_threads=2).score, wins).perplexity
    uniform = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16", group_size=32, lm_head="int4"))
    print(f"ppl vs fp32 {base:.4f}: mixed 4.85 {ppl:.4f} ({100 * (ppl / base - 1):+.2f}%), "
          f"uniform g32, int4 table {uniform:.4f} ({100 * (uniform / base - 1):+.2f}%)")
    assert ppl < uniform
    assert ppl / base - 1 <= MIXED_4_85_PPL_MAX_INCREASE
