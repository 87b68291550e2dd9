"""Quantized SmolLM2 engines end to end: WikiText-2 perplexity relative to the fp32 engine
(the protocol of `bessemer eval`), within the accuracy bounds of issue 3.

Calibration uses the held-out second half of the file (conftest.calibration_text), few
samples so CI stays quick; the closing notes' table uses bench/quant.py's larger protocol.
"""

import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.evaluate import perplexity, windows
from bessemer.runtime.llm import LLM
from conftest import WIKITEXT
from tolerances import W8A16_PPL_MAX_INCREASE

CALIB = dict(calib_samples=16, calib_seq_len=256)


@pytest.fixture(scope="module")
def score_windows(smollm2_engine):
    llm = LLM(smollm2_engine("float32"), num_threads=2)
    text = WIKITEXT.read_text()[:20000]
    wins = windows(llm.tokenizer.encode(text, add_special_tokens=False), 512, 2048)
    return wins, perplexity(llm.score, wins).perplexity


def _ppl(smollm2_dir, tmp_path, wins, quant: QuantConfig) -> float:
    engine = build_engine(smollm2_dir, tmp_path / quant.mode, BuildConfig(max_seq_len=1024, quant=quant))
    return perplexity(LLM(engine, num_threads=2).score, wins).perplexity


def test_w8a16_within_half_a_percent_of_fp32(smollm2_dir, score_windows, tmp_path):
    wins, base = score_windows
    ppl = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w8a16"))
    print(f"w8a16 ppl {ppl:.4f} vs fp32 {base:.4f} ({100 * (ppl / base - 1):+.2f}%)")
    assert ppl / base - 1 <= W8A16_PPL_MAX_INCREASE


def test_w4a16_awq_and_gptq_beat_round_to_nearest(smollm2_dir, score_windows, tmp_path, calibration_text):
    wins, base = score_windows
    rtn = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16", group_size=64))
    awq = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16-awq", group_size=64,
                                                         calib_data=str(calibration_text), **CALIB))
    # act-order: with 16 x 256 calibration rows, plain column order over-fits the Hessian of
    # the 1536-wide down_proj inputs (held-out ppl 27.3 vs RTN 25.1); act-order gives 23.4.
    # Groups are static, so act-order costs nothing at run time.
    gptq = _ppl(smollm2_dir, tmp_path, wins, QuantConfig("w4a16-gptq", group_size=64, act_order=True,
                                                          calib_data=str(calibration_text), **CALIB))
    print(f"w4a16 g64 ppl vs fp32 {base:.4f}: RTN {rtn:.4f}, AWQ {awq:.4f}, GPTQ {gptq:.4f}")
    assert awq < rtn and gptq < rtn
