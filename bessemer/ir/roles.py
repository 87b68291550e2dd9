"""Layer roles: what a linear is in its model, set where the model is defined.

A family names its modules as its HF checkpoint does (`q_proj` or `query_key_value`,
`o_proj` or `dense`), so generic passes never read names: the model file states, on each
linear node, how tensor parallelism splits it and which fusion group it belongs to
(models/blocks.py), and shard_tensor_parallel / fuse_qkv / fuse_gate_up read only that.
Where a per-input-channel scale folds (AWQ, SmoothQuant) follows from the graph's edges and
the op set (builder/input_groups.py), so that too needs no names.
"""

from __future__ import annotations

from dataclasses import dataclass

# How tensor parallelism splits a linear (builder/passes/shard_tensor_parallel.py).
COLUMN = "column"  # output rows: each rank computes some output features
ROW = "row"  # input columns (K): each rank a partial sum, then all_reduce
VOCAB = "vocab"  # the logits' linear: vocab rows (shard_range), then all_gather
SPLITS = (COLUMN, ROW, VOCAB)

# What a COLUMN or ROW split cuts, one entry per weight part (a fused linear has several).
QUERY_HEADS = "query_heads"  # whole query heads, grouped with their KV head (rank_heads)
KV_HEADS = "kv_heads"  # the KV heads of those query heads
FEATURES = "features"  # an even share of the MLP's intermediate features
# every rank computes all rows: q/k normalised across all heads (OLMo2's q_norm); the rank
# takes its own heads once the value reaches rope/attention (shard_tensor_parallel.py)
WHOLE = "whole"
SHARDS = (QUERY_HEADS, KV_HEADS, FEATURES, WHOLE)

# Fusion groups: the linears of one group that read one input become one linear.
QKV = "qkv"  # builder/passes/fuse_qkv.py
GATE_UP = "gate_up"  # builder/passes/fuse_gate_up.py


@dataclass(frozen=True)
class Fusion:
    kind: str  # QKV | GATE_UP: the pass that fuses the group
    name: str  # the fused linear's node name; its weight is f"{name}.weight"


@dataclass(frozen=True)
class LinearRole:
    split: str  # SPLITS
    shards: tuple[str, ...] = ()  # per weight part, what the split cuts (VOCAB: none)
    fusion: Fusion | None = None  # members in graph order are the fused weight's parts

    def __post_init__(self):
        if self.split not in SPLITS or any(s not in SHARDS for s in self.shards):
            raise ValueError(f"unknown split {self.split!r} or shards {self.shards}")
        if (self.split == VOCAB) != (not self.shards):
            raise ValueError(f"a {self.split} split needs {'no' if self.split == VOCAB else 'a'} shard kind")

    def text(self) -> str:
        """Short form for graph dumps: `column(query_heads) fuse=...qkv_proj`."""
        out = self.split + (f"({','.join(self.shards)})" if self.shards else "")
        return out + (f" fuse={self.fusion.name}" if self.fusion else "")


def column(shard: str, fusion: Fusion | None = None) -> LinearRole:
    return LinearRole(COLUMN, (shard,), fusion)


def row(shard: str) -> LinearRole:
    return LinearRole(ROW, (shard,))


LOGITS = LinearRole(VOCAB)
