"""A random-weight checkpoint at a real model's widths, for measuring build time, memory and
speed at scale (tiny checkpoints prove the maths, not the product).

    python bench/make_shape_checkpoint.py --shape 1b      # prints the checkpoint directory

Shapes are Llama-3.2-1B / Llama-3.2-3B / Llama-3.1-8B (their config.json widths, llama3 RoPE
scaling), with SmolLM2's tokenizer and so its 49152-token vocabulary (the fixture's files:
no download). Parameter names and shapes come from transformers' LlamaForCausalLM built on
the meta device; every tensor is then drawn N(0, initializer_range) (norms 1) and written
in bf16, as the real checkpoints are, one safetensors shard per layer with an index
(bench/random_checkpoint.py): one layer in memory at a time, so the 8B shape (16 GB) is made
on a 24 GB machine.
Cached under the bessemer cache root (bessemer/cache_root.py) by shape and seed; written to
a temporary directory and renamed when complete.
"""

from __future__ import annotations

import json
from pathlib import Path

from bessemer.cache_root import cache_root
import random_checkpoint
from random_checkpoint import INIT_STD, make_cached, tokenizer_source, write_layer_shards

SHAPES = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
}
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}


def checkpoint_dir(shape: str, seed: int) -> Path:
    return cache_root() / "shape_checkpoints" / f"llama-{shape}-bf16-seed{seed}"


def _config(shape: str, tokenizer_dir: Path):
    from transformers import LlamaConfig

    smol = json.loads((tokenizer_dir / "config.json").read_text())
    # Llama-3.1-8B scales RoPE by 8, the 3.2 models by 32
    rope = dict(LLAMA3_ROPE, factor=8.0 if shape == "8b" else 32.0)
    dims = SHAPES[shape]
    return LlamaConfig(vocab_size=smol["vocab_size"], bos_token_id=smol["bos_token_id"],
                       eos_token_id=smol["eos_token_id"], pad_token_id=smol.get("pad_token_id"),
                       head_dim=dims["hidden_size"] // dims["num_attention_heads"], max_position_embeddings=131072,
                       rms_norm_eps=1e-5, rope_parameters=rope, initializer_range=INIT_STD,
                       hidden_act="silu", dtype="bfloat16", **dims)


def _tensors(config):
    """(name, shape, kind) of every stored parameter, in transformers' order (bench/random_checkpoint.py)."""
    import torch
    from transformers import LlamaForCausalLM

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return [(n, tuple(p.shape), "norm" if n.endswith("norm.weight") else "bf16") for n, p in model.named_parameters()
            if not (config.tie_word_embeddings and n == "lm_head.weight")]


def make(shape: str, seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """The checkpoint directory of `shape`, made once."""
    tokenizer_dir = tokenizer_source(tokenizer_dir)

    def write(tmp: Path) -> None:
        config = _config(shape, tokenizer_dir)
        write_layer_shards(_tensors(config), tmp, seed)
        config.architectures = ["LlamaForCausalLM"]  # what save_pretrained of a model would record
        config.save_pretrained(tmp)

    return make_cached(checkpoint_dir(shape, seed), tokenizer_dir, write, {"shape": shape, "seed": seed})


if __name__ == "__main__":
    random_checkpoint.main(__doc__, SHAPES, make)
