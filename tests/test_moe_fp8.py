"""fp8 experts on the cpu target (issue 34): `--quant fp8` stores each expert's matrices as E4M3
codes with a float32 scale per output row (formats.Fp8E4M3, the dense fp8 rule), read by
moe_fp8@1 with a dynamic E4M3 scale per token (linear_fp8@2's kernels, AVX-512 BF16 and AVX2).
Oracles: ops.ref_moe on the stored experts' values with per-token E4M3-rounded matmul inputs
(the kernel), and HF running the same fake-quantized weights and activations (the engine)."""

import copy
import json

import numpy as np
import pytest

from bessemer.quantization import fp8
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.llm import LLM
import tolerances as tol
from conftest import _hf_model
from test_kernels import ISAS, assert_close
from test_moe_quant import E_KERNEL, K_KERNEL, PROMPTS, _plan_ops, assert_small_batches_match, run_expert_kernel

# round to nearest and per-token scales: nothing to calibrate; lm_head in fp32 (the int8
# lm_head has its own tests), so the oracle below is the whole model
FP8 = QuantConfig("fp8", lm_head="none", fp8_rounding="nearest", fp8_activations="dynamic")


def _per_token_e4m3(a: np.ndarray, act_group: int = 0) -> np.ndarray:
    """What the kernel multiplies: each row rounded to E4M3 with its own max|row| / 448 scale
    (refined per act_group columns), in fp32 as the kernel computes it."""
    x = np.asarray(a, np.float32)
    s = fp8.token_scales(x)
    if act_group:
        return (fp8.quantize_activation_grouped(x, s, act_group) * s).astype(np.float64)
    return fp8.fake_quant_activation(x, s).astype(np.float64)


KERNEL_CASES = [(0, 0), (1, 0), (1, 32)]  # (layout, act_group): Mixtral-like, gpt-oss-like


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout,act_group", KERNEL_CASES, ids=[f"layout{a}-g{g}" for a, g in KERNEL_CASES])
def test_fp8_expert_kernel_matches_reference(tmp_path, isa, layout, act_group):
    """moe_fp8 against ops.ref_moe on its stored experts' values with both matmuls' inputs
    rounded to E4M3 per token; 150 tokens over 4 experts give each expert more than one 64-token
    chunk. I = 88: down's K is not a multiple of 16. Weights of std 0.1 keep gpt-oss's clamp
    (gate <= 7, |up| <= 7) from binding on both at once: a row holding (7 + 1) * 7 * sigmoid(11.9)
    as its max and (-7 + 1) * 7 * sigmoid(11.9) puts the latter exactly on an E4M3 tie (-336,
    midway between -320 and -352) that either side's last fp32 bit breaks its own way (the
    clamp itself: test_moe_quant's kernel test, on exact inputs). And the same tokens in small
    batches bit-identical to them (the driver's small-batch path: test_moe_quant's
    assert_small_batches_match)."""
    from bessemer.plugins import ops
    from bessemer.quantization.formats import ExpertStack, Fp8E4M3

    I = 88
    run = run_expert_kernel(tmp_path, isa, layout, I, 0.1, 11,
                            lambda w: ExpertStack(Fp8E4M3(dynamic=True, act_group=act_group), E_KERNEL, layout == 1),
                            "moe_fp8", {"act_group": act_group} if act_group else {})
    assert run.dtypes == ["float8_e4m3", "float32"] * 2
    x, H, out = run.x, run.hidden, run.out
    ref = ops.ref_moe(x[:, :H], x[:, H:], run.weights, E_KERNEL, K_KERNEL, I, layout, 1 - layout, layout, layout,
                      matmul_input=lambda a: _per_token_e4m3(a, act_group))
    assert_close(out, ref, tol.FP8_MOE_RTOL, tol.MOE_ATOL, f"moe_fp8 {isa}")
    # and far from the same experts without the activation rounding: the test sees the E4M3 step
    plain = ops.ref_moe(x[:, :H], x[:, H:], run.weights, E_KERNEL, K_KERNEL, I, layout, 1 - layout, layout, layout)
    assert np.abs(out - plain).max() > 20 * np.abs(out - ref).max()
    assert_small_batches_match(run, isa, "moe_fp8")


def fake_quantize_fp8(model):
    """HF model with fp8's weights (E4M3 per output row, dequantized) in every linear but
    lm_head and the routers (transformers' routers are not nn.Linear; they stay fp32 in the
    engine too) and in every expert, and E4M3 per-token rounding of each linear's and each
    expert matmul's input (pre-hooks; the down projection's input through _apply_gate, which
    every transformers experts implementation calls on its (token, expert) rows)."""
    import torch

    def e4m3_rows(t):  # in fp32, back in the model's dtype (a bf16 copy of the model runs it too)
        shape = t.shape
        x = t.detach().float().numpy().reshape(-1, shape[-1])
        return torch.from_numpy(fp8.fake_quant_activation(x, fp8.token_scales(x)).reshape(shape)).to(t.dtype)

    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name != "lm_head":
                w = mod.weight.detach().numpy().astype(np.float32)
                mod.weight.copy_(torch.from_numpy(fp8.dequantize_fp8_per_channel(*fp8.quantize_fp8_per_channel(w))))
                mod.register_forward_pre_hook(lambda _m, args: (e4m3_rows(args[0]),) + tuple(args[1:]))
            elif isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter):
                input_major = getattr(mod, "is_transposed", False)  # gpt-oss: (E, K, N)
                for p in (mod.gate_up_proj, mod.down_proj):
                    w = p.detach().numpy().astype(np.float32)
                    rows = np.swapaxes(w, 1, 2) if input_major else w  # (E, N, K)
                    approx = np.stack([fp8.dequantize_fp8_per_channel(*fp8.quantize_fp8_per_channel(
                        np.ascontiguousarray(r))) for r in rows])
                    back = np.swapaxes(approx, 1, 2) if input_major else approx
                    p.copy_(torch.from_numpy(np.ascontiguousarray(back)))
                gate = mod._apply_gate
                mod._apply_gate = lambda gate_up, gate=gate: e4m3_rows(gate(gate_up))
                mod.register_forward_pre_hook(lambda _m, args: (e4m3_rows(args[0]),) + tuple(args[1:]))
    return model


@pytest.mark.parametrize("kind", ["qwen3-moe", "gpt-oss"])
def test_fp8_experts_match_fake_quantized_hf(kind, tiny_checkpoint, tiny_engine):
    """The fp8 engine (E4M3 experts read by moe_fp8, E4M3 linears by linear_fp8@2) against HF
    with the same fake-quantized weights and activations, and far closer to it than to HF fp32."""
    import torch

    engine = tiny_engine(kind, quant=FP8, kv_block_size=4)
    assert "moe_fp8" in _plan_ops(engine) and not {"moe", "moe_mxfp4"} & _plan_ops(engine)
    report = json.loads((engine / "build_report.json").read_text())
    experts = {k: v for k, v in report["quant_error"].items() if ".experts." in k}
    assert experts and all(v["dtype"] == "float8_e4m3" and v["algorithm"] == "rtn" for v in experts.values())
    hf_fp32 = _hf_model(str(tiny_checkpoint(kind)), "float32")
    hf = fake_quantize_fp8(copy.deepcopy(hf_fp32))
    llm = LLM(engine, num_threads=2)
    try:
        got = llm.score(PROMPTS, num_prefill=2)
    finally:
        llm.close()
    for ids, g in zip(PROMPTS, got):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
            plain = hf_fp32(torch.tensor([ids])).logits[0].numpy()
        err, quant_err = np.abs(g - ref).max(), np.abs(g - plain).max()
        print(f"{kind} fp8: max |engine - fake-quantized HF| = {err:.2e}, vs HF fp32 {quant_err:.2e}")
        assert err <= tol.FP8_FAKE_QUANT_LOGITS_RTOL * np.abs(ref).max(), (err, quant_err)
        assert err <= 0.02 * quant_err, (err, quant_err)


@pytest.mark.parametrize("isa", ISAS)
def test_fp8_expert_requests_are_batch_invariant(tiny_engine, isa):
    """A request's tokens and logprobs are bit-identical alone (decode steps: few (token,
    expert) pairs) and inside batches of 3 and 16 other requests (chunked expert GEMMs): every
    activation scale is its own row's."""
    from invariance import assert_same_alone_and_in_batches

    llm = LLM(tiny_engine("qwen3-moe", quant=FP8, kv_block_size=4), num_threads=2, isa=isa,
              enable_prefix_caching=False)
    try:
        assert_same_alone_and_in_batches(llm)
    finally:
        llm.close()


def test_fp8_expert_notes_and_static_activations(tiny_checkpoint):
    """The build log says how fp8 stores experts (GPTQ per expert under the default rounding);
    static activation scales (calibrated per linear) leave the experts' scales dynamic; the cuda target stores fp8 experts the same way
    (its grouped expert GEMMs read E4M3 codes) under either activation mode."""
    from bessemer.builder.config import BuildConfig
    from bessemer.builder.passes.quantize import expert_notes
    from bessemer.quantization.formats import Fp8E4M3, expert_format
    from conftest import model_graph

    graph, _ = model_graph(tiny_checkpoint("mixtral"))
    assert expert_notes(graph, BuildConfig(quant=FP8)) == [
        "experts: E4M3 round to nearest, activation scales dynamic per token"]
    static = QuantConfig("fp8", calib_data="unused.txt", fp8_activations="static", fp8_rounding="nearest")
    assert expert_format(static, 64) == Fp8E4M3(dynamic=True)
    assert expert_notes(graph, BuildConfig(quant=static)) == [
        "experts: E4M3 round to nearest, activation scales dynamic per token (static scales are the linears' only)"]
    gptq = QuantConfig("fp8", calib_data="unused.txt")  # the default rounding: codes by GPTQ, experts too
    assert expert_notes(graph, BuildConfig(quant=gptq)) == [
        "experts: E4M3 codes by GPTQ per expert from the calibration tokens routed to it (round to nearest for an "
        "expert fewer than 16 reach), activation scales dynamic per token"]
    for quant in (FP8, static, gptq):
        assert expert_notes(graph, BuildConfig(quant=quant, target="cuda", dtype="bfloat16")) == \
            expert_notes(graph, BuildConfig(quant=quant))
