"""cuda engines with a one-byte KV cache (--kv-cache-dtype int8 | fp8, issue 22), whole plans
under the Triton interpreter.

A tiny Mistral (GQA, sliding window) and a Llama with bf16 activations and a quantized KV
cache vs HF fp32 whose attention reads the same fake-quantized K (after RoPE) and V
(hf_kv_quant.py, the cpu target's oracle too): within CUDA_BF16_ERROR_RATIO of the error of
that HF model run in bf16, with all-prefill steps and with chunked prefill + decode (the
decode kernel over codes: rows that start a KV block of 4 and rows that read one part-filled,
with Mistral's window of 8 sliding). The kernels' codes and scales are checked one by one in
test_kernels_rows.py and their attention in test_kernels_attention.py.
"""

import numpy as np
import pytest

from interp_support import torch

from hf_kv_quant import register_hf_kvq
from tolerances import CUDA_BF16_ERROR_RATIO

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
def test_cuda_plan_with_quantized_kv_matches_hf_with_fake_quantized_kv(family, kind, tiny_checkpoint, cuda_engine):
    # the run's tiny checkpoint and its bf16 cuda engine (kv block 4, max_num_tokens 24) with
    # the one-byte cache: built once per run
    ckpt = tiny_checkpoint(family)
    engine = cuda_engine(family, kv_cache_dtype=kind)
    llm = LLM(engine, interpret=True)
    kv = read_rank_header(engine / "rank0.engine")[2]["plan"]["kv_cache"]
    assert kv["dtype"] == {"int8": "int8", "fp8": "float8_e4m3"}[kind] and "scales" in kv
    # codes + one fp32 scale per (token, KV head): under half the bytes of the bf16 cache
    per_token = kv_bytes_per_token(kv["num_layers"], kv["num_kv_heads"], kv["head_dim"], kv["dtype"])
    assert per_token == 2 * kv["num_layers"] * kv["num_kv_heads"] * (kv["head_dim"] + 4)
    ref32, ref16 = _hf(ckpt, kind, "float32"), _hf(ckpt, kind, "bfloat16")
    rng = np.random.default_rng(6)
    prompts = [rng.integers(0, 250, n).tolist() for n in (9, 30)]
    # all prefill; then 20 prefill tokens (all of the 9-token prompt) and the 30-token prompt's
    # positions 20-29 as decode rows: 20, 24 and 28 start a KV block, the others read one
    # part-filled, and each leaves out keys outside Mistral's window of 8
    for num_prefill in (None, 20):
        for ids, got in zip(prompts, llm.score(prompts, num_prefill=num_prefill)):
            with torch.no_grad():
                want = ref32(torch.tensor([ids])).logits[0].numpy()
                theirs = np.abs(ref16(torch.tensor([ids])).logits[0].float().numpy() - want).max()
            err = np.abs(got - want).max()
            print(f"cuda {family} kv {kind} (prefill {num_prefill}): max |engine - HF fake-quant KV| = {err:.4g}, "
                  f"{err / (CUDA_BF16_ERROR_RATIO * theirs):.2f} of the bound")
            assert err <= CUDA_BF16_ERROR_RATIO * theirs
