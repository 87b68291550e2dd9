"""A random-weight mixture-of-experts checkpoint at a real model's widths (issue 34): build
memory, engine size and decode speed of the expert kernels are measured on these.

    python bench/make_moe_checkpoint.py --shape gpt-oss-20b       # prints the directory
    python bench/make_moe_checkpoint.py --shape qwen3-30b-a3b-4l
    python bench/make_moe_checkpoint.py --shape gpt-oss-20b-4l    # 4 of its layers: kernel work

gpt-oss-20b: its config.json widths (24 layers, hidden 2880, 64 query / 8 KV heads of 64,
32 experts of 2880, top-4, sliding window 128 on alternate layers, yarn RoPE), experts stored
as the released checkpoint stores them: `*_blocks` (E, N, K/32, 16) and `*_scales` (E, N, K/32)
uint8 MXFP4 pairs with quantization_config {"quant_method": "mxfp4", ...}; everything else bf16.
gpt-oss-20b-4l: the same with 4 of its 24 layers (2 GB), for measuring the expert kernels
where the whole shape would not leave this machine's memory to anything else.
qwen3-30b-a3b-4l: Qwen3-30B-A3B's widths (hidden 2048, 32 query / 4 KV heads of 128, 128
experts of 768, top-8) with 4 of its 48 layers, bf16, per-expert tensors named as released.

Both use SmolLM2's tokenizer and so its 49152-token vocabulary (the test fixture's files: no
download; the real o200k / Qwen tokenizers are not available here), which makes embedding and
lm_head smaller than the real ones (gpt-oss: 201088 x 2880). Parameter names and shapes of the
non-expert tensors come from transformers' model built on the meta device from the config;
weights are drawn N(0, 0.02) (norms 1), MXFP4 codes uniformly with scales 2^-8 (values up to
0.023, like a 0.02-std bf16 weight). One shard per layer is in memory at a time. Cached under
the bessemer cache root by shape and seed; written to a temporary directory and renamed.
"""

from __future__ import annotations

import json
from pathlib import Path

from bessemer.cache_root import cache_root
import random_checkpoint
from random_checkpoint import INIT_STD, make_cached, tokenizer_source, write_layer_shards

SHAPES = ("gpt-oss-20b", "gpt-oss-20b-4l", "qwen3-30b-a3b-4l")


def checkpoint_dir(shape: str, seed: int) -> Path:
    return cache_root() / "shape_checkpoints" / f"{shape}-seed{seed}"


def _config(shape: str, smol: dict):
    import transformers

    common = dict(vocab_size=smol["vocab_size"], bos_token_id=smol["bos_token_id"], eos_token_id=smol["eos_token_id"],
                  pad_token_id=smol.get("pad_token_id"), initializer_range=INIT_STD, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, torch_dtype="bfloat16")
    if shape.startswith("gpt-oss-20b"):
        n = 4 if shape == "gpt-oss-20b-4l" else 24
        return transformers.GptOssConfig(
            architectures=["GptOssForCausalLM"], num_hidden_layers=n, hidden_size=2880, intermediate_size=2880,
            num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32, num_experts_per_tok=4,
            sliding_window=128,
            layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)],
            max_position_embeddings=131072, attention_bias=True, swiglu_limit=7.0,
            rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                             "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
            **common)
    return transformers.Qwen3MoeConfig(
        architectures=["Qwen3MoeForCausalLM"],
        num_hidden_layers=4, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, **common)


def _tensors(config) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, kind) as the released checkpoint stores them, kind "bf16" / "norm" / "codes"
    / "scales": non-expert names and shapes from transformers' model; experts in the released
    format (gpt-oss: stacked MXFP4 pairs; Qwen3-MoE: one tensor per expert and projection)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = []
    for name, p in model.named_parameters():
        shape = tuple(p.shape)
        if ".experts." not in name:
            out.append((name, shape, "norm" if name.endswith("norm.weight") else "bf16"))
        elif name.endswith("_bias"):
            out.append((name, shape, "bf16"))
        elif config.model_type == "gpt_oss":  # (E, K, N) -> blocks (E, N, K/32, 16), scales (E, N, K/32)
            e, k, n = shape
            out += [(name + "_blocks", (e, n, k // 32, 16), "codes"), (name + "_scales", (e, n, k // 32), "scales")]
        elif name.endswith("gate_up_proj"):  # (E, 2I, H) -> experts.{e}.gate_proj / up_proj (I, H)
            e, i2, h = shape
            prefix = name[:-len("gate_up_proj")]
            out += [(f"{prefix}{x}.{w}.weight", (i2 // 2, h), "bf16")
                    for x in range(e) for w in ("gate_proj", "up_proj")]
        else:  # down_proj (E, H, I) -> experts.{e}.down_proj (H, I)
            e, h, i = shape
            prefix = name[:-len("down_proj")]
            out += [(f"{prefix}{x}.down_proj.weight", (h, i), "bf16") for x in range(e)]
    return out


def make(shape: str, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """The checkpoint directory of `shape`, made once."""
    tokenizer_dir = tokenizer_source(tokenizer_dir)

    def write(tmp: Path) -> None:
        config = _config(shape, json.loads((tokenizer_dir / "config.json").read_text()))
        write_layer_shards(_tensors(config), tmp, seed)
        config.save_pretrained(tmp)
        if shape.startswith("gpt-oss-20b"):  # as the released config.json says (transformers reads it back)
            cfg = json.loads((tmp / "config.json").read_text())
            cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
                "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")

    return make_cached(checkpoint_dir(shape, seed), tokenizer_dir, write, {"shape": shape, "seed": seed})


if __name__ == "__main__":
    random_checkpoint.main(__doc__, SHAPES, make)
