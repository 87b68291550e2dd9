"""cuda engines with a one-byte KV cache (--kv-cache-dtype int8 | fp8, issue 22), whole plans
under the Triton interpreter.

A tiny Mistral (GQA, sliding window) and a Llama with bf16 activations and a quantized KV
cache vs HF fp32 whose attention reads the same fake-quantized K (after RoPE) and V
(hf_kv_quant.py, the cpu target's oracle too): within CUDA_BF16_ERROR_RATIO of the error of
that HF model run in bf16, with all-prefill steps and with chunked prefill + decode (the
decode kernel's split-K over codes). The kernels' codes and scales are checked one by one in
test_kernels_rows.py and their attention in test_kernels_attention.py.
"""

import numpy as np
import pytest

from interp_support import torch

from conftest import make_tiny_checkpoint
from hf_kv_quant import register_hf_kvq
from tolerances import CUDA_BF16_ERROR_RATIO

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.format.container import read_rank_header
from bessemer.format.kv import kv_bytes_per_token
from bessemer.runtime.llm import LLM


def _hf(ckpt, kind: str, dtype: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, dtype),
                                                attn_implementation=register_hf_kvq(kind)).eval()


# each kind once (the codes' kernels are the same for every family): int8 with GQA and a
# sliding window, fp8 on Llama
@pytest.mark.parametrize("family,kind", [("mistral", "int8"), ("llama-untied", "fp8")])
def test_cuda_plan_with_quantized_kv_matches_hf_with_fake_quantized_kv(family, kind, tmp_path):
    ckpt = make_tiny_checkpoint(family, tmp_path / "hf")
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(
        target="cuda", dtype="bfloat16", kv_cache_dtype=kind, kv_block_size=4, max_num_tokens=24, max_seq_len=128))
    llm = LLM(engine, interpret=True)
    kv = read_rank_header(engine / "rank0.engine")[2]["plan"]["kv_cache"]
    assert kv["dtype"] == {"int8": "int8", "fp8": "float8_e4m3"}[kind] and "scales" in kv
    # codes + one fp32 scale per (token, KV head): under half the bytes of the bf16 cache
    per_token = kv_bytes_per_token(kv["num_layers"], kv["num_kv_heads"], kv["head_dim"], kv["dtype"])
    assert per_token == 2 * kv["num_layers"] * kv["num_kv_heads"] * (kv["head_dim"] + 4)
    ref32, ref16 = _hf(ckpt, kind, "float32"), _hf(ckpt, kind, "bfloat16")
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 250, n).tolist() for n in (9, 30)]
    for num_prefill in (None, 3):  # all prefill, then 3 prefill tokens and decode steps
        for ids, got in zip(prompts, llm.score(prompts, num_prefill=num_prefill)):
            with torch.no_grad():
                want = ref32(torch.tensor([ids])).logits[0].numpy()
                theirs = np.abs(ref16(torch.tensor([ids])).logits[0].float().numpy() - want).max()
            err = np.abs(got - want).max()
            print(f"cuda {family} kv {kind} (prefill {num_prefill}): max |engine - HF fake-quant KV| = {err:.4g}, "
                  f"{err / (CUDA_BF16_ERROR_RATIO * theirs):.2f} of the bound")
            assert err <= CUDA_BF16_ERROR_RATIO * theirs
