"""The per-step arrays the cuda launch list reads, derived from Executor.step's inputs.

This module is the reference for that derivation: the C++ launcher computes the same
arrays on the host (they are small) and uploads them before the step's launches. Every
array is int32 (the sampling inputs: float32 where noted). Names are the plan's
`{"step": name}` arguments; `counts` are the grid rules' `{"count": name}`.

    token_ids [T], positions [T], cu_seqlens [S+1], context_lens [S], logits_indices [L]
                        as given (see builder/plan.py for their meaning)
    block_tables [S_max, B_max]  row s < S: the sequence's block ids, -1 padded; rows >= S
                        unused. Its row stride is the plan's max_blocks_per_seq (B_max).
    slot_mapping [T]    cache slot of each row: block_tables[s, p // BS] * BS + p % BS for
                        the row's sequence s and position p (BS: kv block size)
    prefill_tiles [P, 2] for each sequence s with n_s = cu_seqlens[s+1] - cu_seqlens[s] > 1
                        rows, in order: (s, q0) for q0 = 0, TILE, 2*TILE, ... < n_s
                        (TILE: the plan's attention tile_tokens)
    decode_seqs [D]     the sequences with exactly one row, in order
    counts              tokens = T, selected = L, seqs = S, prefill_tiles = P, decode_seqs = D

The launcher also checks what the kernels assume: each sequence's rows are its consecutive
positions ending at context_lens[s] - 1, and every block id they touch is in the cache.
"""

from __future__ import annotations

import numpy as np

from bessemer.errors import BessemerError
from bessemer.format.step import StepBatch

COUNTS = ("tokens", "selected", "seqs", "prefill_tiles", "decode_seqs")


def prefill_tiles(cu_seqlens: np.ndarray, tile_tokens: int) -> np.ndarray:
    """[P, 2] int32 (sequence, first row within it) of every multi-row sequence."""
    tiles = [(s, q0) for s in range(len(cu_seqlens) - 1)
             if cu_seqlens[s + 1] - cu_seqlens[s] > 1
             for q0 in range(0, int(cu_seqlens[s + 1] - cu_seqlens[s]), tile_tokens)]
    return np.asarray(tiles, dtype=np.int32).reshape(-1, 2)


def decode_seqs(cu_seqlens: np.ndarray) -> np.ndarray:
    return np.flatnonzero(np.diff(cu_seqlens) == 1).astype(np.int32)


def slot_mapping(positions: np.ndarray, cu_seqlens: np.ndarray, block_tables: np.ndarray,
                 block_size: int) -> np.ndarray:
    seq_of_row = np.repeat(np.arange(len(cu_seqlens) - 1), np.diff(cu_seqlens))
    blocks = block_tables[seq_of_row, positions // block_size]
    return (blocks.astype(np.int64) * block_size + positions % block_size).astype(np.int32)


def derive(token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices, *,
           block_size: int, tile_tokens: int, max_blocks_per_seq: int, num_blocks: int) -> tuple[dict, dict]:
    """Returns (arrays by name, counts by name) for one step; raises BessemerError on
    inputs the kernels cannot serve."""
    as32 = lambda a: np.ascontiguousarray(a, dtype=np.int32)  # noqa: E731
    token_ids, positions, cu, ctx = as32(token_ids), as32(positions), as32(cu_seqlens), as32(context_lens)
    tables, indices = as32(block_tables), as32(logits_indices)
    num_seqs, width = tables.shape if tables.ndim == 2 else (0, 0)
    if len(cu) != num_seqs + 1 or len(ctx) != num_seqs or cu[0] != 0 or cu[-1] != len(token_ids):
        raise BessemerError("step inputs disagree: cu_seqlens, context_lens and block_tables must describe "
                            "the same sequences and cover every row")
    if width > max_blocks_per_seq:
        raise BessemerError(f"a sequence uses {width} KV blocks, the engine allows {max_blocks_per_seq}")
    rows = np.diff(cu)
    expected = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, rows)]) if num_seqs else positions
    if len(positions) != len(token_ids) or not np.array_equal(positions, expected):
        raise BessemerError("each sequence's rows must be its consecutive positions ending at context_lens - 1")
    needed = [tables[s, :-(-int(ctx[s]) // block_size)] for s in range(num_seqs)]
    if any((b < 0).any() or (b >= num_blocks).any() for b in needed):
        raise BessemerError(f"a block table names a block outside the KV cache (0..{num_blocks - 1})")
    padded = np.full((num_seqs, max_blocks_per_seq), -1, dtype=np.int32)
    padded[:, :width] = tables
    arrays = {"token_ids": token_ids, "positions": positions, "cu_seqlens": cu, "context_lens": ctx,
              "block_tables": padded, "logits_indices": indices,
              "slot_mapping": slot_mapping(positions, cu, padded, block_size),
              "prefill_tiles": prefill_tiles(cu, tile_tokens), "decode_seqs": decode_seqs(cu)}
    counts = {"tokens": len(token_ids), "selected": len(indices), "seqs": num_seqs,
              "prefill_tiles": len(arrays["prefill_tiles"]), "decode_seqs": len(arrays["decode_seqs"])}
    return arrays, counts


def step_arrays(inputs: tuple) -> tuple:
    """An executor step's arguments -> the six arrays: (StepBatch,) or the six arrays
    themselves (the launch tests and the GPU script pass them one by one)."""
    if len(inputs) == 1 and isinstance(inputs[0], StepBatch):
        return inputs[0].arrays()
    if len(inputs) != 6:
        raise TypeError(f"step takes a StepBatch or its six arrays, got {len(inputs)} arguments")
    return inputs
