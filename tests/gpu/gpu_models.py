"""The models of the GPU check: Llama-family configs at the shapes of SmolLM2-135M,
Llama-3.2-1B and Llama-3.1-8B (or tiny stand-ins for the CPU rehearsal), random bf16
checkpoints made by transformers on the device, and the HF transformers baselines.

Works with transformers 4.x (rope_theta + rope_scaling, torch_dtype) and 5.x
(rope_parameters, dtype): the GPU image's version is not this machine's.
"""

from __future__ import annotations

import time
from pathlib import Path

LLAMA3_ROPE = {"rope_type": "llama3", "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}

SHAPES = {
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True, max_position_embeddings=8192,
                 rms_norm_eps=1e-5, rope=dict(rope_type="default", rope_theta=100000.0)),
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, head_dim=64, vocab_size=128256, tie_word_embeddings=True,
               max_position_embeddings=131072, rms_norm_eps=1e-5,
               rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=32.0)),
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False,
               max_position_embeddings=131072, rms_norm_eps=1e-5,
               rope=dict(LLAMA3_ROPE, rope_theta=500000.0, factor=8.0)),
}

# CPU rehearsal: the same families, tying and rope kinds, small enough to build and run on
# 2 cores. 135m and 1b share a hidden size (most of their kernels: one compile each); 8b keeps
# the real model's head_dim of 128 (its own attention kernels and shared-memory sizes: what
# its correctness stage is there to check), with 2 heads in a hidden size of 256. 135m keeps
# a GQA group of 4 query heads per KV head, 1b/8b groups of 2.
TINY_SHAPES = {
    "135m": dict(SHAPES["135m"], hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=1, vocab_size=512),
    "1b": dict(SHAPES["1b"], hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=32, vocab_size=512),
    "8b": dict(SHAPES["8b"], hidden_size=256, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=128, vocab_size=512),
}


ENGINES = {  # build options per engine (the 8B ones serve 128 concurrent requests); a name is
    # its checkpoint's shape, then what differs: "8b-w4a16" is the 8B checkpoint quantized
    "135m": dict(max_seq_len=2048, max_batch_size=16, max_num_tokens=2048),
    "1b": dict(max_seq_len=2048, max_batch_size=16, max_num_tokens=2048),
    "8b": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048),
    # --suite quant (issue 22): random weights, no calibration (RTN int4, nearest-rounded fp8):
    # fine for speed, and the correctness stages compare each engine with HF running its own
    # codes (quant_reference.py); accuracy against the float model is the cpu target's tests
    "8b-w4a16": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                     quant=dict(mode="w4a16", group_size=128)),
    "8b-fp8": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                   quant=dict(mode="fp8", fp8_rounding="nearest")),
    "8b-fp8-kvfp8": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                         quant=dict(mode="fp8", fp8_rounding="nearest"), kv_cache_dtype="fp8"),
    # issue 39: two-level 4-bit codes (RTN), whose decode must be no slower than w4a16's
    "8b-w4k": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048, quant=dict(mode="w4k")),
}


# what the CPU rehearsal changes in every engine's build options (its tiny engines serve short requests)
REHEARSAL_BUILD = {"max_seq_len": 1024, "max_num_tokens": 512}

# the engines of each suite of the GPU check, in the order it builds them: w4k last, so that
# a budget too short for all of them skips its stages before those of issue 22's engines
SUITE_ENGINES = {"bf16": ("135m", "1b", "8b"), "quant": ("8b-w4a16", "8b", "8b-fp8", "8b-fp8-kvfp8", "8b-w4k")}


def build_config(engine: str, **overrides):
    """The BuildConfig of one of ENGINES (cuda, bf16 activations), with `overrides`."""
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.config import QuantConfig

    options = dict(ENGINES[engine], **overrides)
    quant = options.pop("quant", None)
    return BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig(**quant) if quant else None, **options)


def llama_config(shape: dict):
    import transformers

    fields = {k: v for k, v in shape.items() if k != "rope"}
    config = transformers.LlamaConfig(**fields)
    rope = dict(shape["rope"])
    if hasattr(config, "rope_parameters"):  # transformers 5
        config.rope_parameters = rope
    else:
        config.rope_theta = rope.pop("rope_theta")
        config.rope_scaling = None if rope["rope_type"] == "default" else rope
    return config


def make_checkpoint(shape: dict, out: Path, device: str, seed: int = 0):
    """A random bf16 Llama checkpoint made on `device` and saved with save_pretrained.
    Returns the bf16 model (still on the device) for the HF baselines."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(llama_config(shape))
    finally:
        torch.set_default_dtype(default)
    model = model.to(torch.bfloat16).eval()
    with torch.no_grad():  # norms near 1 but not equal: every weight matters
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(out)
    return model


def hf_logits(model, prompts: list[list[int]], dtype) -> list:
    """Teacher-forced logits [len, vocab] (fp32 NumPy) of each prompt, one forward each."""
    import torch

    device = next(model.parameters()).device
    out = []
    with torch.no_grad():
        for ids in prompts:
            logits = model(torch.tensor([ids], device=device)).logits[0]
            out.append(logits.float().cpu().numpy())
    return out


class _TokenClock:
    """A generate() streamer that notes when each new token arrives (generate puts the
    prompt first, then each step's token)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, _tokens) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_decode_rate(model, prompt: list[int], new_tokens: int, sync, compiled: bool = False) -> dict:
    """HF greedy generation, batch 1: decode tok/s between the first and the last new token
    (each timed as generate hands it over: the prefill is left out without a second call
    of another length, which would recompile a static cache). With `compiled`, a static KV
    cache and the forward under torch.compile (warmed up first, with the same lengths)."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    kwargs = dict(do_sample=False, pad_token_id=0, eos_token_id=None, max_new_tokens=new_tokens,
                  min_new_tokens=new_tokens)
    if compiled:
        kwargs["cache_implementation"] = "static"

    def generate(clock=None):
        sync()
        t = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, streamer=clock, **kwargs)
        sync()
        assert out.shape[1] == len(prompt) + new_tokens, out.shape
        return t, time.perf_counter()

    start, end = generate()  # warm-up (compiles when compiled)
    warm = end - start
    clock = _TokenClock()
    start, end = generate(clock)
    new = clock.times[1:]  # [0] is the prompt
    assert len(new) == new_tokens, len(new)
    return {"decode_tok_s": (new_tokens - 1) / max(new[-1] - new[0], 1e-9), "timed_generate_s": end - start,
            "prefill_s": new[0] - start, "warmup_s": warm}


def compile_forward(model, backend: str):
    import torch

    model.forward = torch.compile(model.forward, mode="reduce-overhead" if backend == "inductor" else None,
                                  backend=backend, fullgraph=False)
    return model
