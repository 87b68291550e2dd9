"""Weights quantized ahead of the writer on several threads (builder/weights.py) give the
same engine, byte for byte, as one weight at a time: each weight is quantized alone, so
only the order of the work changes. The oracle is the single-threaded build's rank file."""

import hashlib

import pytest

from bessemer.builder import build as build_module
from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization.config import QuantConfig


def rank_digest(engine) -> str:
    return hashlib.sha256((engine / "rank0.engine").read_bytes()).hexdigest()


@pytest.mark.parametrize("quant", [QuantConfig("w4a16", group_size=32), QuantConfig("w8a16"),
                                   QuantConfig("fp8", fp8_rounding="nearest")], ids=["w4a16", "w8a16", "fp8"])
def test_threads_quantizing_ahead_write_the_same_engine(quant, tiny_checkpoint, tmp_path, monkeypatch):
    ckpt = tiny_checkpoint("llama-untied")
    digests = []
    for threads in (1, 4):
        monkeypatch.setattr(build_module, "quantize_threads", lambda build, calibration, n=threads: n)
        out = build_engine(ckpt, tmp_path / f"t{threads}", BuildConfig(dtype="bfloat16", quant=quant))
        digests.append(rank_digest(out))
    assert digests[0] == digests[1]


def test_an_uncalibrated_single_rank_build_uses_every_core_it_may():
    import os

    cores = len(os.sched_getaffinity(0))
    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16")), None) == cores
    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16")), object()) == 1  # calibrated
    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16"), tp_size=2), None) == 1
