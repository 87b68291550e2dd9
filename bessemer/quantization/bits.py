"""Bits per weight of an engine: what its weight matrices cost as stored, so that formats are
compared by their price (codes plus scales, offsets and every other stored part).

A weight matrix is a tensor of two or more dimensions (MoE experts are stacks of matrices)
of the rank file named `<...>.weight`; its stored parts are
the tensors named `<that name>.<part>` (scales, offsets, super_scales, super_offsets, wsum,
smooth, input_scale).
bits per weight = 8 * (bytes of the matrix + bytes of its parts) / (rows * columns), summed
over ranks (a tensor-parallel shard counts its own rows and columns). Buckets:

    decoder   every matrix of the decoder layers (quantized or not)
    lm_head   the matrix that produces the logits: lm_head.weight, or the embedding table
              when it is tied to lm_head (stored once)
    embedding an untied embedding table (a gather of one row per token; llama.cpp's GGUF
              files count it too)
    all       the three together (norms, biases and constants are left out: a few KiB)
"""

from __future__ import annotations

import math
from typing import Iterable

PART_SUFFIXES = ("scales", "offsets", "super_scales", "super_offsets", "wsum", "smooth", "input_scale")
EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def _bucket(name: str, untied: bool) -> str:
    if name == LM_HEAD or (name == EMBEDDING and not untied):
        return "lm_head"
    if name == EMBEDDING:
        return "embedding"
    return "decoder"


def bits_per_weight(ranks: Iterable[Iterable[tuple[str, tuple[int, ...], int]]]) -> dict:
    """ranks: per rank, (tensor name, shape, stored bytes) of every tensor.
    Returns {bucket: {"bpw", "weights", "bytes"}} for the buckets that have weights."""
    weights: dict[str, int] = {}
    nbytes: dict[str, int] = {}
    for tensors in ranks:
        tensors = list(tensors)
        # matrices, and stacks of them (MoE experts: (experts, N, K))
        matrices = {n: s for n, s, _ in tensors if n.endswith(".weight") and len(s) >= 2}
        untied = LM_HEAD in matrices
        for name, shape, size in tensors:
            base, _, part = name.rpartition(".")
            owner = name if name in matrices else (base if part in PART_SUFFIXES and base in matrices else None)
            if owner is None:
                continue
            b = _bucket(owner, untied)
            nbytes[b] = nbytes.get(b, 0) + int(size)
            if owner == name:
                weights[b] = weights.get(b, 0) + math.prod(int(d) for d in shape)
    out = {}
    for b in ("decoder", "lm_head", "embedding"):
        if weights.get(b):
            out[b] = {"bpw": round(8 * nbytes[b] / weights[b], 3), "weights": weights[b], "bytes": nbytes[b]}
    if out:
        w, n = sum(v["weights"] for v in out.values()), sum(v["bytes"] for v in out.values())
        out["all"] = {"bpw": round(8 * n / w, 3), "weights": w, "bytes": n}
    return out


def format_bits(bits: dict) -> str:
    """One line: 'decoder 4.50, lm_head 8.06, all 5.12 bits per weight'."""
    return ", ".join(f"{b} {v['bpw']:.2f}" for b, v in bits.items()) + " bits per weight"
