"""What the GPU check's checkpoints and engines take on disk, from the shape and the build
options alone (before anything is written): a stage that writes one starts only when WORK
has that much free (check.py Check.stage), and check.sh sizes its up-front check with the
same figures. Estimates, a little above the measured sizes: weights at their stored bits,
plus 5% and 0.5 GiB for headers, kernels and the safetensors index."""

from __future__ import annotations

GIB = 2**30
MARGIN, SLACK_GIB = 1.05, 0.5


def parameter_counts(shape: dict) -> dict:
    """{"linears", "embedding", "lm_head", "other"} parameter counts of a Llama-style shape
    (lm_head 0 when tied to the embedding)."""
    hidden, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q, o; k, v
    mlp = 3 * hidden * inter
    embedding = shape["vocab_size"] * hidden
    return {"linears": layers * (attention + mlp), "embedding": embedding,
            "lm_head": 0 if shape.get("tie_word_embeddings") else embedding,
            "other": (2 * layers + 1) * hidden}


def linear_bits(options: dict) -> float:
    quant = options.get("quant")
    if not quant:
        return 16.0
    if quant["mode"] == "w4a16":
        return 4 + 16 / quant.get("group_size", 128)  # a bf16 scale per group
    if quant["mode"] == "w4k":  # a byte of scale and of minimum per 32 columns, two fp16 per
        return 4 + 16 / 32 + 32 / 256  # super-block of 256 (every K of the 8B shape divides by 256)
    if quant["mode"] in ("fp8", "w8a16"):
        return 8.0
    raise ValueError(f"gpu_disk: no size for quant mode {quant['mode']!r}; add it to linear_bits")


def checkpoint_gib(shape: dict) -> float:
    """A bf16 safetensors checkpoint."""
    return sum(parameter_counts(shape).values()) * 2 / GIB * MARGIN + SLACK_GIB


def engine_gib(shape: dict, options: dict) -> float:
    """A cuda engine: linears at their stored bits; lm_head int8 in a quantized build (the
    default --lm-head), else bf16; the embedding bf16 (a tied one is lm_head's table)."""
    counts = parameter_counts(shape)
    head_bits = 8.0 if options.get("quant") else 16.0
    table_bits = head_bits if shape.get("tie_word_embeddings") else 16.0
    bits = (counts["linears"] * linear_bits(options) + counts["lm_head"] * head_bits
            + counts["embedding"] * table_bits + counts["other"] * 32)
    return bits / 8 / GIB * MARGIN + SLACK_GIB


if __name__ == "__main__":  # check.sh: the GiB a run needs at its peak, for its up-front check
    import sys

    from gpu_models import ENGINES, SHAPES

    suite = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    if suite == "quant":  # one engine at a time beside the 8B checkpoint
        need = checkpoint_gib(SHAPES["8b"]) + max(engine_gib(SHAPES["8b"], ENGINES[e]) for e in ENGINES
                                                   if e.startswith("8b"))
    else:  # every checkpoint and bf16 engine of the three shapes
        need = sum(checkpoint_gib(SHAPES[n]) + engine_gib(SHAPES[n], ENGINES[n]) for n in ("135m", "1b", "8b"))
    print(int(need + 0.999))
