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

Checks, each in one place: every index against its range (block ids in the cache and present
for every position a row touches, cu_seqlens, context_lens, logits_indices, token ids when the
vocabulary is given) is the engine contract's check_step_batch (format/csrc/step_batch.h), the
one every executor runs, called here through bessemer._cuda; what only the cuda kernels assume
is checked below and by the C++ launcher (targets/cuda/csrc/step_inputs.h): every sequence
has a row, its rows are its consecutive positions ending at context_lens[s] - 1, and a block
table is at most max_blocks_per_seq wide.
"""

from __future__ import annotations

import numpy as np

from bessemer.errors import BessemerError
from bessemer.format.step import StepBatch
from bessemer.targets.cuda.device import native

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
           block_size: int, tile_tokens: int, max_blocks_per_seq: int, num_blocks: int,
           vocab_size: int | None = None) -> tuple[dict, dict]:
    """Returns (arrays by name, counts by name) for one step; raises BessemerError on
    inputs the kernels cannot serve (token ids are checked when vocab_size is given)."""
    batch = StepBatch.of(token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices)
    token_ids, positions, cu, ctx, tables, indices = batch.arrays()
    num_seqs, width = tables.shape
    try:  # every index (see the module docstring); attention reads every block from position 0
        native().check_step_batch(batch, token_limit=np.iinfo(np.int32).max if vocab_size is None else vocab_size,
                                  num_kv_blocks=num_blocks, block_size=block_size, reads_kv=True, kv_window=0)
    except ValueError as e:
        raise BessemerError(str(e)) from None
    if width > max_blocks_per_seq:
        raise BessemerError(f"a sequence uses {width} KV blocks, the engine allows {max_blocks_per_seq}")
    rows = np.diff(cu)
    if (rows < 1).any():
        raise BessemerError("every sequence needs at least one row (cu_seqlens must increase)")
    expected = np.concatenate([np.arange(c - n, c) for c, n in zip(ctx, rows)]) if num_seqs else positions
    if not np.array_equal(positions, expected):
        raise BessemerError("each sequence's rows must be its consecutive positions ending at context_lens - 1")
    padded = np.full((num_seqs, max_blocks_per_seq), -1, dtype=np.int32)
    padded[:, :width] = tables
    arrays = {"token_ids": token_ids, "positions": positions, "cu_seqlens": cu, "context_lens": ctx,
              "block_tables": padded, "logits_indices": indices,
              "slot_mapping": slot_mapping(positions, cu, padded, block_size),
              "prefill_tiles": prefill_tiles(cu, tile_tokens), "decode_seqs": decode_seqs(cu)}
    counts = {"tokens": len(token_ids), "selected": len(indices), "seqs": num_seqs,
              "prefill_tiles": len(arrays["prefill_tiles"]), "decode_seqs": len(arrays["decode_seqs"])}
    return arrays, counts
