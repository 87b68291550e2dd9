"""StepBatch: the inputs of one executor step, the same six int32 arrays on every target.

    token_ids      [T]        token of each row
    positions      [T]        position of each row in its sequence
    cu_seqlens     [S+1]      rows of sequence s are cu_seqlens[s] .. cu_seqlens[s+1]-1
    context_lens   [S]        tokens of sequence s in the KV cache after this step
    block_tables   [S, B]     KV block ids of sequence s (block b holds positions
                              b*block_size .. (b+1)*block_size-1); unused entries are -1
    logits_indices [L]        rows whose logits are returned ([L, V] float32)

Built once per step (runtime/model_runner.py), sent as int32 words to the other ranks of a
tensor-parallel engine (encode/decode below, the only wire form), and read by each C++
executor as its StepBatch (format/csrc/step_batch.h), which checks every bound.

Wire form: [kind, T, S, L, B] then token_ids, positions, cu_seqlens, context_lens,
block_tables (row-major), logits_indices; kind STOP (0) ends a worker, STEP (1) is a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

STOP, STEP = 0, 1
HEAD_WORDS = 5
FIELDS = ("token_ids", "positions", "cu_seqlens", "context_lens", "block_tables", "logits_indices")


def _i32(name: str, a, ndim: int) -> np.ndarray:
    """`a` as a C-ordered int32 array of `ndim` dimensions; any integer dtype is converted,
    anything else refused (a float token id is a bug upstream, not a value to truncate)."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "iu" and not (arr.size == 0 and arr.dtype.kind == "f"):
        raise ValueError(f"{name}: expected an int32 array, got {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.int32)
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D array, got {arr.ndim}-D")
    return arr


@dataclass(frozen=True, eq=False)
class StepBatch:
    token_ids: np.ndarray
    positions: np.ndarray
    cu_seqlens: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray
    logits_indices: np.ndarray

    @classmethod
    def of(cls, token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices) -> "StepBatch":
        """From any integer sequences (each converted to a C-ordered int32 array)."""
        arrays = (token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices)
        return cls(*(_i32(f, a, 2 if f == "block_tables" else 1) for f, a in zip(FIELDS, arrays)))

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(getattr(self, f) for f in FIELDS)

    def encode(self) -> np.ndarray:
        tables = self.block_tables
        width = tables.shape[1] if tables.ndim == 2 else 0
        head = np.array([STEP, len(self.token_ids), len(self.context_lens), len(self.logits_indices), width],
                        dtype=np.int32)
        return np.concatenate([head] + [np.asarray(a, dtype=np.int32).ravel() for a in self.arrays()])

    @classmethod
    def decode(cls, words: np.ndarray) -> "StepBatch":
        _, t, s, l, b = (int(v) for v in words[:HEAD_WORDS])
        parts, at = [], HEAD_WORDS
        for n in (t, t, s + 1, s, s * b, l):
            parts.append(words[at:at + n])
            at += n
        parts[4] = parts[4].reshape(s, b)
        return cls(*parts)

    @staticmethod
    def max_words(max_num_tokens: int, max_batch_size: int, max_blocks: int) -> int:
        t, s = max_num_tokens, max_batch_size
        return HEAD_WORDS + 3 * t + 2 * s + 1 + s * max_blocks


def stop_words() -> np.ndarray:
    return np.array([STOP, 0, 0, 0, 0], dtype=np.int32)


def is_stop(words: np.ndarray) -> bool:
    return int(words[0]) == STOP
