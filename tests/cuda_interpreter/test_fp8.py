"""fp8 cuda engines (issue 22), under the Triton interpreter.

Kernel: gemm_fp8 (static and dynamic activation scales, K whole and in split-K parts) against
linear_fp8_reference, the cpu target's definition of linear_fp8 in float64, on the same
activations; the only difference allowed is fp32 accumulation and the output's rounding (the
E4M3 products are exact, and the interpreter rounds fp32 -> E4M3 as the GPU does:
interpreter.py); and a row's bits alone and among 16, 64 and 128 rows.
Plan: a tiny Llama built with --quant fp8 for --target cuda (dynamic per-token scales,
nearest rounding, lm_head bf16) vs HF fp32 with the same fp8 weights and each linear input
rounded to E4M3 with its token's scale, within CUDA_BF16_ERROR_RATIO of the error of the
same fake-quantized HF run in fp16 (the engine's activations are fp16), in max and in mean.
A 16-bit run's rounding moves single E4M3 activation codes, so at this size its error
against the fp8 model is of the order of fp8's own (measured: mean 0.019-0.031 vs fp8's
0.044): this plan test catches wiring (scales, layouts, dynamic vs static) and gross
errors; the kernel test above is the exact check of the arithmetic.
"""

import copy

import numpy as np
import pytest

from interp_support import assert_rounded_close, assert_row_bits_in_every_bucket, device_tensor, host, \
    split_k_workspace, torch

from conftest import _hf_model
from tolerances import CUDA_BF16_ERROR_RATIO

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization import fp8
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.llm import LLM
from bessemer.targets.cuda.kernels import gemm_fp8


def _fp8_codes(codes: np.ndarray):
    return torch.from_numpy(codes).view(torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("dynamic", [True, False])
@pytest.mark.parametrize("m,tile,split", [(3, (16, 32, 64), 1), (70, (64, 32, 32), 1), (3, (16, 32, 64), 3),
                                         (3, (16, 32, 32), 3)])  # split-K: parts of 1 and 2 K blocks
def test_gemm_fp8(dtype, dynamic, m, tile, split):
    rng = np.random.default_rng(4)
    n, k = 40, 192
    # rows of very different magnitude: a per-token scale must follow each row
    x = device_tensor(rng.normal(size=(m, k + 8)) * np.exp(rng.normal(size=(m, 1)) * 2), dtype)[:, :k]
    x[1] = 0  # an all-zero row: scale 1, output = bias
    w = rng.normal(size=(n, k)).astype(np.float32)
    codes, scales = fp8.quantize_fp8_per_channel(w)
    bias = rng.normal(size=n).astype(np.float32)
    # static: a calibrated scale some rows exceed (their codes saturate at +-448, as on the cpu)
    x_scale = None if dynamic else fp8.activation_scale(0.5 * np.abs(host(x)).max())
    y = torch.zeros(m, n, dtype=x.dtype)
    bm, bn, bk = tile
    tiles = -(-m // bm) * -(-n // bn)
    weights = (_fp8_codes(codes), torch.from_numpy(scales), torch.tensor([x_scale or 1.0], dtype=torch.float32),
               torch.from_numpy(bias))
    partials, counters = split_k_workspace(tiles, split, bm, bn)
    gemm_fp8.gemm_fp8_kernel[(tiles, split)](
        x, *weights, y, partials, counters, m, N=n, K=k, X_STRIDE=k + 8, Y_STRIDE=n, DYNAMIC=dynamic, HAS_BIAS=True,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT_K=split, K_PARTS=split)
    ref = fp8.linear_fp8_reference(host(x).astype(np.float32), codes, scales, x_scale, bias)
    assert_rounded_close(host(y), ref, dtype, f"gemm_fp8 {'dynamic' if dynamic else 'static'} split {split}")
    assert not counters.any()  # reset by each tile's last program, ready for the next linear
    if split == 1:
        return
    xs = device_tensor(rng.normal(size=(128, k + 8)) * np.exp(rng.normal(size=(128, 1)) * 2), dtype)[:, :k]

    def launch(rows, bm, one_program_a_part):
        programs = split if one_program_a_part else 1
        out = torch.zeros(rows, n, dtype=torch.float32)
        tiles = -(-rows // bm) * -(-n // bn)
        gemm_fp8.gemm_fp8_kernel[(tiles, programs)](
            xs, *weights, out, *split_k_workspace(tiles, programs, bm, bn), rows, N=n, K=k, X_STRIDE=k + 8,
            Y_STRIDE=n, DYNAMIC=dynamic, HAS_BIAS=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8,
            SPLIT_K=programs, K_PARTS=split)
        return out

    assert_row_bits_in_every_bucket(launch, f"gemm_fp8 in {split} parts")


def _fake_quantized_hf(ckpt, dtype: str):
    """HF with fp8 per-channel weights (nearest rounding) and each linear input but lm_head
    rounded to E4M3 with its token's own scale (in fp32, then back to the model's dtype)."""
    model = copy.deepcopy(_hf_model(str(ckpt), "float32"))
    with torch.no_grad():
        for name, mod in model.named_modules():
            if isinstance(mod, torch.nn.Linear) and name != "lm_head":
                w = mod.weight.detach().numpy().astype(np.float32)
                mod.weight.copy_(torch.from_numpy(fp8.dequantize_fp8_per_channel(*fp8.quantize_fp8_per_channel(w))))

                def round_input(m, args):
                    x = args[0]
                    rows = x.detach().float().numpy().reshape(-1, x.shape[-1])  # (tokens, K)
                    q = fp8.fake_quant_activation(rows, fp8.token_scales(rows))
                    return (torch.from_numpy(q.reshape(x.shape)).to(x.dtype),)

                mod.register_forward_pre_hook(round_input)
    return model.to(getattr(torch, dtype))


def test_fp8_cuda_plan_matches_fake_quantized_hf(tiny_checkpoint_i128, tmp_path):
    ckpt = tiny_checkpoint_i128("llama-untied")
    quant = QuantConfig("fp8", fp8_rounding="nearest", fp8_activations="dynamic", lm_head="none")
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(
        target="cuda", dtype="float16", quant=quant, kv_block_size=4, max_num_tokens=24, max_seq_len=128))
    llm = LLM(engine, interpret=True)
    ref32, ref16 = (_fake_quantized_hf(ckpt, d) for d in ("float32", "float16"))
    plain = _hf_model(str(ckpt), "float32")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 250, n).tolist() for n in (7, 19)]
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=12)):
        with torch.no_grad():
            want = ref32(torch.tensor([ids])).logits[0].numpy()
            theirs = np.abs(ref16(torch.tensor([ids])).logits[0].float().numpy() - want)
            plain_err = np.abs(plain(torch.tensor([ids])).logits[0].numpy() - want)
        err = np.abs(got - want)
        print(f"cuda fp8: |engine - fake-quantized HF| max {err.max():.4g} mean {err.mean():.4g}; HF fp16 "
              f"{theirs.max():.4g} / {theirs.mean():.4g}; plain HF fp32 (no fp8) {plain_err.max():.4g} / "
              f"{plain_err.mean():.4g}")
        assert err.max() <= CUDA_BF16_ERROR_RATIO * theirs.max()
        assert err.mean() <= CUDA_BF16_ERROR_RATIO * theirs.mean()
