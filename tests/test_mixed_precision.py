"""Mixed precision within a bits-per-weight budget (quantization/mixed_precision.py,
builder/precision_plan.py): the allocation on known errors, and built engines whose bits per
weight, counted from their rank files, match the build report and stay within the budget.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.format.container import read_rank_header
from bessemer.quantization.config import PRECISION_SCHEMES, QuantConfig
from bessemer.quantization.formats import WeightCalibration, scheme_format
from bessemer.quantization.mixed_precision import Unit, allocate, scheme_bits
from conftest import assert_engine_matches_hf_model, make_tiny_checkpoint
from test_families import _with_word_tokenizer
from tolerances import W4_BF16_FAKE_QUANT_LOGITS_RTOL

PARTS = ("scales", "offsets", "super_scales", "super_offsets", "wsum", "smooth", "input_scale")


def _units(n: int, shape=(64, 64)) -> list[Unit]:
    return [Unit(f"layer{i}", (f"w{i}",), (), shape, f"x{i}") for i in range(n)]


def _errors(units, scale: dict) -> dict:
    """Errors that fall with bits as quantization errors do, times a per-unit sensitivity."""
    base = {"int4-g64": 1.0, "int4-g32": 0.8, "int4-g32-asym": 0.6, "int4-k": 0.5, "int8": 0.01}
    return {u.name: {"energy": 1.0, **{s: scale[u.name] * base[s] for s in PRECISION_SCHEMES}} for u in units}


def test_allocation_spends_the_budget_on_the_most_sensitive_linears():
    units = _units(4)
    quant = QuantConfig("w4a16", group_size=32, bits_per_weight=5.4, calib_data="x.txt")
    sens = {"layer0": 1.0, "layer1": 50.0, "layer2": 2.0, "layer3": 1.0}
    errors = _errors(units, sens)
    plan, report = allocate(units, errors, 5.4, None, quant)
    plan = dict(plan)
    # int8 for the linear whose error dwarfs the others' (its best step per bit, int4
    # asymmetric, would leave too little for int8: a greedy walk stops there)
    assert plan["layer1"] == "int8"
    assert all(plan[n] != "int8" for n in ("layer0", "layer2", "layer3"))
    used = sum(scheme_bits(plan[u.name], u.shape) for u in units)
    weights = sum(math.prod(u.shape) for u in units)
    assert used / weights <= 5.4 and report["planned_bpw"] == round(used / weights, 4)

    def total(p):
        return sum(errors[n][s] for n, s in dict(p).items())
    # more budget never costs accuracy; every scheme pair within the budget does no better
    assert total(allocate(units, errors, 6.0, None, quant)[0]) <= total(plan)
    import itertools
    for combo in itertools.product(PRECISION_SCHEMES, repeat=len(units)):
        if sum(scheme_bits(s, u.shape) for s, u in zip(combo, units)) <= 5.4 * weights:
            assert total(zip([u.name for u in units], combo)) >= total(plan) - 1e-12


def test_lm_head_gets_int8_only_when_the_budget_holds_it():
    units = _units(2)
    quant = QuantConfig("w4a16", group_size=32, bits_per_weight=4.8, calib_data="x.txt")
    errors = _errors(units, {"layer0": 1.0, "layer1": 1.0})
    small = dict(allocate(units, errors, 4.8, ("lm_head", (256, 64)), quant)[0])
    assert small["lm_head"] == "int4-g32"
    big = dict(allocate(units, errors, 7.5, ("lm_head", (256, 64)), quant)[0])
    assert big["lm_head"] == "int8"


def test_budget_below_the_cheapest_plan_is_refused():
    units = _units(2)
    quant = QuantConfig("w4a16", group_size=32, bits_per_weight=4.25, calib_data="x.txt")
    with pytest.raises(InvalidOptionError, match=r"--bits-per-weight 4.25 is below .* use --bits-per-weight"):
        # lm_head rows padded to a panel of 16 make the cheapest plan cost more than 4.25
        allocate(units, _errors(units, {"layer0": 1.0, "layer1": 1.0}), 4.25, ("lm_head", (250, 64)), quant)


@pytest.mark.parametrize("options,match", [
    (dict(mode="w8a16", bits_per_weight=4.8, calib_data="c.txt"), "applies to --quant w4a16, w4a16-gptq, w4k and w4k-gptq"),
    (dict(mode="w4a16", bits_per_weight=4.8), "pass --calib-data FILE"),
    (dict(mode="w4a16", bits_per_weight=3.0, calib_data="c.txt"), "must be between 4.25"),
    (dict(mode="w4a16", bits_per_weight=4.8, lm_head="none", calib_data="c.txt"), "drop --lm-head none"),
])
def test_bad_budget_options(options, match):
    with pytest.raises(InvalidOptionError, match=match):
        QuantConfig(**options)


def file_bits(engine) -> dict:
    """Bits per weight of the decoder's matrices and lm_head, from the rank files' tensor
    tables alone (every stored part counted, as bits.py defines it; this model is tied)."""
    weights, nbytes = {}, {}
    for rank in sorted(engine.glob("rank*.engine")):
        tensors = read_rank_header(rank)[2]["tensors"]
        matrices = {t["name"] for t in tensors if t["name"].endswith(".weight") and len(t["shape"]) >= 2}
        for t in tensors:
            base, _, part = t["name"].rpartition(".")
            owner = t["name"] if t["name"] in matrices else base if part in PARTS and base in matrices else None
            if owner is None:
                continue
            bucket = "lm_head" if owner == "model.embed_tokens.weight" else "decoder"
            nbytes[bucket] = nbytes.get(bucket, 0) + t["nbytes"]
            if owner == t["name"]:
                weights[bucket] = weights.get(bucket, 0) + math.prod(t["shape"])
    out = {b: 8 * nbytes[b] / weights[b] for b in weights}
    out["all"] = 8 * sum(nbytes.values()) / sum(weights.values())
    return out


@pytest.fixture(scope="module")
def tiny_tied(tmp_path_factory) -> Path:
    """A tied tiny Llama (intermediate 128: whole groups of 32 on each of 2 ranks) with a
    word-level tokenizer for calibration."""
    base = tmp_path_factory.mktemp("tiny")
    make_tiny_checkpoint("llama-tied", base / "base", intermediate_size=128)
    return _with_word_tokenizer(base / "base", base / "hf")


def fake_quantized_hf(ckpt: Path, precision: dict):
    """HF fp32 whose linears hold dequantize(quantize(w)) in the scheme the plan gave their
    fused node (row-wise formats: a part of q|k|v or gate|up quantizes alone as in the fused
    weight), round to nearest on the builder's grid; the tied table as lm_head's scheme. The
    int4 kernels read bf16-rounded activations (linear_w4a16@2/@3): the reference does too."""
    import copy

    import torch

    from conftest import _hf_model

    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}
    model = copy.deepcopy(_hf_model(str(ckpt), "float32"))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            parent, _, leaf = name.rpartition(".")
            scheme = precision[f"{parent}.{fused.get(leaf, leaf)}" if parent else name]
            fmt = scheme_format(scheme, mod.weight.shape[1])
            w = mod.weight.detach().numpy().astype(np.float32)
            mod.weight.copy_(torch.from_numpy(fmt.dequantize(fmt.quantize(w, WeightCalibration()))))
            if scheme != "int8":
                mod.register_forward_pre_hook(lambda _m, args: (args[0].bfloat16().float(),))
    return model


@pytest.mark.parametrize("budget,tp", [(4.9, 1), (5.6, 1), (5.6, 2)])
def test_built_engine_meets_its_budget_and_reports_its_bits(tiny_tied, tmp_path, calibration_text, budget, tp,
                                                          monkeypatch):
    """The engine's bits per weight, counted from its rank files, equal the build report's
    and the plan's and stay within the budget; the plan is in config.json; the engine (int8
    and int4 g64/g32/asymmetric linears, an int4 or int8 tied table) equals HF running the
    plan's fake-quantized weights at the weight-only tolerance of test_quantization."""
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    quant = QuantConfig("w4a16", group_size=32, bits_per_weight=budget, calib_data=str(calibration_text),
                        calib_samples=4, calib_seq_len=64)
    engine = build_engine(tiny_tied, tmp_path / "e", BuildConfig(quant=quant, max_seq_len=128, tp_size=tp))
    report = json.loads((engine / "build_report.json").read_text())
    plan = report["mixed_precision"]
    got = file_bits(engine)
    assert report["bits_per_weight"]["all"]["bpw"] == pytest.approx(got["all"], abs=1e-3)
    assert plan["planned_bpw"] <= budget
    if tp == 1:
        assert got["all"] <= budget and plan["planned_bpw"] == pytest.approx(got["all"], abs=1e-3)
    # tensor-parallel ranks each store what they replicate (a single KV head; the whole tied
    # table), which the files' sum counts once per rank: the budget is the model's, one copy
    # of every matrix
    config = json.loads((engine / "config.json").read_text())
    precision = config["quant"]["precision"]
    assert set(precision) == set(plan["linears"]) | {"lm_head"}
    assert precision["lm_head"] == plan["lm_head"]["scheme"]
    assert len(set(precision.values())) >= 2, "a budget between the schemes' prices mixes them"
    hf = fake_quantized_hf(tiny_tied, precision)
    assert_engine_matches_hf_model(engine, hf, W4_BF16_FAKE_QUANT_LOGITS_RTOL)


@pytest.mark.parametrize("options", [dict(mode="w4a16", lm_head="int4"),
                                     dict(mode="w4a16", bits_per_weight=4.8, calib_data="c.txt")])
def test_cuda_target_refuses_an_int4_table_at_build_time(options):
    """The cuda target has no int4 embedding gather: a build that may store the tied table in
    int4 is refused when configured, before calibration or packing."""
    with pytest.raises(InvalidOptionError, match="--target cuda has no embedding kernel for the int4_group table"):
        BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig(**options))
