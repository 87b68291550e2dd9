"""HF transformers with a fake-quantized KV cache: the oracle of the int8 / fp8 KV cache tests
(tests/test_kv_quant.py for the cpu target, cuda_interpreter/test_kv_codes.py for the cuda one).

Its eager attention reads K (after RoPE) and V passed through quantization/kv_cache's
quantize + dequantize per (token, KV head) row, registered as an attention implementation,
so prefill and generate (whose DynamicCache holds float rows, re-quantized identically at
every step) both see what an engine's cache gives back.
"""

from bessemer.quantization import kv_cache as kvq


def register_hf_kvq(kind: str) -> str:
    """Registers the attention implementation for `kind` (int8 | fp8); returns its name for
    from_pretrained(attn_implementation=...)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    name = f"bessemer_kvq_{kind}"

    def attention(module, query, key, value, mask, **kwargs):
        import torch

        def fq(x):  # x: (B, Hkv, T, D): rows are (token, head); on any device (the GPU check's too)
            rows = x.detach().float().cpu().numpy()
            return torch.from_numpy(kvq.fake_quantize_kv(rows, kind)).to(device=x.device, dtype=x.dtype)

        return eager_attention_forward(module, query, fq(key), fq(value), mask, **kwargs)

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)
    return name
