"""Quantized experts on the cuda target (issue 34): tiny MoE models built with --target cuda
--quant w8a16 / w4a16 / fp8 keep their experts quantized (ExpertStack codes read by the grouped
expert GEMMs of kernels/moe_grouped.py, never float copies) and their whole launch list, run
by the Triton interpreter through LLM, matches HF on the same fake-quantized weights.

Oracle: HF fp32 whose linears and experts hold the formats' dequantize(quantize(w)) (each
expert's output rows quantized as the builder does); fp8 also rounds every linear's and
expert matmul's input to E4M3 per token (test_moe_fp8.fake_quantize_fp8). Bound:
CUDA_BF16_ERROR_RATIO times HF bf16's error on those weights (the engine's activations are
bf16), at positions away from a routing near-tie (MOE_ROUTING_TIE_MARGIN on the
fake-quantized model's router logits), as test_plans.py does for float experts. And gpt-oss's
MXFP4 experts kept as shipped (no --quant) against HF on the same dequantized weights."""

import copy
import json

import numpy as np
import pytest

from interp_support import torch

from conftest import _hf_model, router_margin
from test_moe_fp8 import FP8, fake_quantize_fp8
from tolerances import CUDA_BF16_ERROR_RATIO, MOE_ROUTING_TIE_MARGIN

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.format.container import read_rank_header
from bessemer.format.dtypes import dtype_name
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.formats import WeightCalibration, weight_format
from bessemer.runtime.llm import LLM


def _fake_quantized(rows: np.ndarray, quant: QuantConfig) -> np.ndarray:
    fmt = weight_format(quant, rows.shape[1])
    return fmt.dequantize(fmt.quantize(rows, WeightCalibration()))


def _fake_quantized_hf(ckpt, quant: QuantConfig):
    """HF fp32 whose linears (not the router nor lm_head) and experts hold the stored values."""
    model = copy.deepcopy(_hf_model(str(ckpt), "float32"))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter):  # stacked experts
                input_major = getattr(mod, "is_transposed", False)  # gpt-oss: (E, K, N), else (E, N, K)
                for p in (mod.gate_up_proj, mod.down_proj):
                    w = p.detach().numpy().astype(np.float32)
                    rows = np.swapaxes(w, 1, 2) if input_major else w
                    approx = np.stack([_fake_quantized(np.ascontiguousarray(e), quant) for e in rows])
                    approx = np.swapaxes(approx, 1, 2) if input_major else approx
                    p.copy_(torch.from_numpy(np.ascontiguousarray(approx)))
            elif isinstance(mod, torch.nn.Linear) and name != "lm_head" and not name.endswith(".gate"):
                w = mod.weight.detach().numpy().astype(np.float32)
                mod.weight.copy_(torch.from_numpy(_fake_quantized(w, quant)))
    return model


CASES = [  # (family, mode): int8 experts whose K (88) is no multiple of the K block, per-expert
    # [gate; up] rows; int4 groups of 32 on gpt-oss's interleaved experts with biases
    ("mixtral", QuantConfig("w8a16", lm_head="none")),
    ("gpt-oss", QuantConfig("w4a16", group_size=32, lm_head="none")),
    ("qwen3-moe", FP8),  # E4M3 experts, dynamic per-token activation scales
]
EXPERT_CODES = {"w8a16": "int8", "w4a16": "int4", "fp8": "float8_e4m3"}


@pytest.mark.parametrize("kind,quant", CASES, ids=[f"{k}-{q.mode}" for k, q in CASES])
def test_quantized_experts_cuda_plan_matches_fake_quantized_hf(kind, quant, tiny_checkpoint, cuda_engine):
    ckpt = tiny_checkpoint(kind)
    engine = cuda_engine(kind, quant=quant, max_seq_len=64)
    _, _, header, _ = read_rank_header(engine / "rank0.engine")
    functions = {k["function"] for k in header["kernels"]}
    assert {"moe_sort_kernel", "moe_gate_up_grouped_kernel", "moe_down_grouped_kernel"} <= functions
    assert "moe_gate_up_kernel" not in functions  # no expert stored in floating point
    grouped = [k for k in header["kernels"] if k["function"] == "moe_gate_up_grouped_kernel"]
    assert all(k["constexprs"]["FP8"] == (quant.mode == "fp8") for k in grouped)
    codes = {t["name"]: dtype_name(t["dtype"]) for t in header["tensors"]
             if t["name"].endswith(("experts.gate_up_proj", "experts.down_proj", "experts.gate_up_proj.weight",
                                    "experts.down_proj.weight"))}
    assert codes and set(codes.values()) == {EXPERT_CODES[quant.mode]}, codes
    report = json.loads((engine / "build_report.json").read_text())
    experts = {k: v for k, v in report["quant_error"].items() if ".experts." in k}
    assert experts and all(v["algorithm"] == "rtn" for v in experts.values())

    oracle = (fake_quantize_fp8(copy.deepcopy(_hf_model(str(ckpt), "float32"))) if quant.mode == "fp8"
              else _fake_quantized_hf(ckpt, quant))
    _assert_logits_match(engine, oracle, f"{kind} {quant.mode}")


def test_mxfp4_experts_cuda_plan_matches_hf(tiny_checkpoint, tmp_path):
    """No --quant: gpt-oss's MXFP4 experts stay as shipped (the checkpoint's uint8 codes and
    scales, read by the grouped GEMMs' MXFP4 path); logits vs HF on the dequantized weights."""
    from test_moe_quant import _mxfp4_checkpoints

    mxfp4, dense = _mxfp4_checkpoints(tiny_checkpoint("gpt-oss"), tmp_path)
    engine = build_engine(mxfp4, tmp_path / "e", BuildConfig(target="cuda", dtype="bfloat16", kv_block_size=4,
                                                             max_num_tokens=24, max_seq_len=64))
    _, _, header, _ = read_rank_header(engine / "rank0.engine")
    grouped = [k for k in header["kernels"] if k["function"] == "moe_gate_up_grouped_kernel"]
    assert grouped and all(k["constexprs"]["MXFP4"] for k in grouped)
    experts = {t["name"]: dtype_name(t["dtype"]) for t in header["tensors"] if ".experts." in t["name"]}
    assert experts["model.layers.0.mlp.experts.gate_up_proj"] == "uint8"
    assert experts["model.layers.0.mlp.experts.gate_up_proj.scales"] == "uint8"
    _assert_logits_match(engine, copy.deepcopy(_hf_model(str(dense), "float32")), "gpt-oss mxfp4")


def _assert_logits_match(engine, ref32, what: str) -> None:
    """Prefill then decode rows of two prompts through the interpreted launch list: within
    CUDA_BF16_ERROR_RATIO of ref32's bf16 copy's error, away from routing near-ties."""
    ref16 = copy.deepcopy(ref32).to(torch.bfloat16)
    llm = LLM(engine, interpret=True)
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 250, n).tolist() for n in (5, 12)]
    compared = total = 0
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=10)):
        with torch.no_grad():
            want = ref32(torch.tensor([ids])).logits[0].numpy()
            theirs = np.abs(ref16(torch.tensor([ids])).logits[0].float().numpy() - want)
        margin = router_margin(ref32, ids)
        keep = np.ones(len(ids), bool) if margin is None else margin >= MOE_ROUTING_TIE_MARGIN
        compared, total = compared + keep.sum(), total + len(ids)
        if not keep.any():
            continue
        # both over the compared positions: HF bf16 may route a near-tie elsewhere too
        err, theirs = np.abs(got - want)[keep].max(), theirs[keep].max()
        print(f"cuda {what}, {len(ids)} tokens ({keep.sum()} compared): max |engine - HF| = {err:.4g}, "
              f"{err / (CUDA_BF16_ERROR_RATIO * theirs):.2f} of the bound")
        assert err <= CUDA_BF16_ERROR_RATIO * theirs
    assert compared >= 0.75 * total, f"only {compared} of {total} positions away from a routing tie"
