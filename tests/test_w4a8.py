"""w4a8 end to end: a tiny random model's engine against HF running the same math unfused
(every nn.Linear but lm_head holds the stored 4-bit weights dequantized and sees its input
fake-quantized to int8 per row and group), and against plain HF fp32 with a stated bound;
the config it records; the cuda target refusing the mode at build time."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from conftest import _hf_model
from tolerances import W4A8_VS_FP32_LOGITS_RTOL, W8A8_FAKE_QUANT_LOGITS_RTOL

from bessemer import LLM
from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.errors import InvalidOptionError
from bessemer.quantization import primitives as prim
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.formats import Int4GroupA8, WeightCalibration, weight_format

G = 32


def _fake_quantized_hf(model, quant: QuantConfig):
    """HF model computing w4a8 unfused: each linear (not lm_head) holds the dequantized
    stored weight and sees int8-per-(row, group) fake-quantized activations."""
    import torch

    for name, lin in model.named_modules():
        if not isinstance(lin, torch.nn.Linear) or name == "lm_head":
            continue
        w = lin.weight.detach().numpy()
        fmt = weight_format(quant, w.shape[1])
        assert isinstance(fmt, Int4GroupA8)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(fmt.dequantize(fmt.quantize(w, WeightCalibration()))))

        def pre(mod, args, group=fmt.group_size):
            x = args[0].detach().numpy()
            q, s = prim.quantize_int8_per_group(x.reshape(-1, x.shape[-1]), group)
            deq = (q.reshape(q.shape[0], -1, group) * s[:, :, None]).astype(np.float32)
            return (torch.from_numpy(deq.reshape(x.shape)),)
        lin.register_forward_pre_hook(pre)
    return model


def test_w4a8_engine_matches_unfused_hf_and_stays_near_fp32(tiny_checkpoint, tmp_path):
    import torch

    ckpt = tiny_checkpoint("llama-untied")
    quant = QuantConfig("w4a8", group_size=G, lm_head="none")  # the oracle runs lm_head in fp32
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    config = json.loads((engine / "config.json").read_text())
    assert config["quant"]["mode"] == "w4a8" and config["quant"]["act_bits"] == 8
    assert config["quant"]["act_granularity"] == "per_token_group_dynamic" and "linear_w4a8@1" in config["plugins"]
    plain = _hf_model(str(ckpt), "float32")
    hf = _fake_quantized_hf(copy.deepcopy(plain), quant)
    llm = LLM(engine, num_threads=2)
    prompts = [list(range(5, 45)), [7, 8, 9]]
    for ids, got in zip(prompts, llm.score(prompts, num_prefill=2)):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
            fp = plain(torch.tensor([ids])).logits[0].numpy()
        err, quant_err = np.abs(got - ref).max(), np.abs(fp - ref).max()
        print(f"w4a8 vs unfused {err:.3g}, vs fp32 {np.abs(got - fp).max():.3g}, max|fp32| {np.abs(fp).max():.3g}")
        # the unfused reference up to rare +-1 activation-code flips (summation order of
        # the fp32 inputs), far below the quantization error itself
        assert err <= W8A8_FAKE_QUANT_LOGITS_RTOL * np.abs(ref).max(), (err, quant_err)
        assert err < 0.1 * quant_err, (err, quant_err)
        # and the quantization error itself stays bounded against HF fp32
        assert np.abs(got - fp).max() <= W4A8_VS_FP32_LOGITS_RTOL * np.abs(fp).max(), (np.abs(got - fp).max(),
                                                                                       np.abs(fp).max())


def test_cuda_target_refuses_w4a8_at_build_time():
    with pytest.raises(InvalidOptionError, match="--target cuda has no kernels for --quant w4a8"):
        BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig("w4a8", group_size=32))


def test_w4a8_options():
    with pytest.raises(InvalidOptionError, match="--zero-point does not apply to --quant w4a8"):
        QuantConfig("w4a8", zero_point=True)
    fmt = weight_format(QuantConfig("w4a8", group_size=32), 576)
    assert fmt == Int4GroupA8(32) and not fmt.zero_point and fmt.key == "int4_group_a8"
    assert "smoothquant_alpha" not in QuantConfig("w4a8").to_json()
