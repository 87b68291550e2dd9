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


def test_an_uncalibrated_single_rank_build_uses_the_native_thread_budget():
    from bessemer.quantization.native_threads import thread_budget

    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16")), None) == thread_budget()
    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16")), object()) == 1  # calibrated
    assert build_module.quantize_threads(BuildConfig(quant=QuantConfig("w4a16"), tp_size=2), None) == 1


def test_omp_num_threads_1_quantizes_one_weight_at_a_time():
    import os
    import subprocess
    import sys

    code = ("from bessemer.builder.build import quantize_threads; from bessemer.builder.config import BuildConfig; "
            "from bessemer.quantization.config import QuantConfig; "
            "print(quantize_threads(BuildConfig(quant=QuantConfig('w4a16')), None))")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "1"


def test_weights_in_flight_split_the_native_thread_budget(tiny_checkpoint, tmp_path, monkeypatch):
    """W weights quantized at once run their native helpers on budget // W threads each (at
    least 1), not on the whole budget each; the writer's own weights (none in flight) on all."""
    from bessemer.builder.weights import WeightSource
    from bessemer.quantization.native_threads import native_threads, thread_budget

    seen = []
    quantize = WeightSource._quantize

    def recording(self, spec):
        seen.append(native_threads())
        return quantize(self, spec)

    monkeypatch.setattr(WeightSource, "_quantize", recording)
    monkeypatch.setattr(build_module, "quantize_threads", lambda build, calibration: 2)
    build_engine(tiny_checkpoint("llama-untied"), tmp_path / "e", BuildConfig(quant=QuantConfig("w4a16", group_size=32)))
    assert seen and set(seen) == {max(1, thread_budget() // 2)}, seen
