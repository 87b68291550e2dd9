"""Turns a scheduled batch into the step's StepBatch (format/step.py) and runs one step."""

from __future__ import annotations

import numpy as np

from bessemer.format.step import StepBatch
from bessemer.runtime.executor import DeviceSampler, Executor, SamplingRows
from bessemer.runtime.scheduler import ScheduledChunk


def make_step_batch(batch: list[ScheduledChunk], all_logits: bool = False) -> StepBatch:
    """The StepBatch of one step: the chunks' rows in order; logits for the last row of every
    chunk that completes its sequence (or for every row when `all_logits`)."""
    # token_ids, positions: (T,); cu_seqlens: (S+1,); block_tables: (S, max_blocks)
    lengths = [c.num_tokens for c in batch]
    cu = np.zeros(len(batch) + 1, dtype=np.int32)
    np.cumsum(lengths, out=cu[1:])
    tokens = np.empty(cu[-1], dtype=np.int32)
    positions = np.empty(cu[-1], dtype=np.int32)
    context = np.empty(len(batch), dtype=np.int32)
    width = max(len(c.seq.block_table) for c in batch)
    tables = np.full((len(batch), width), -1, dtype=np.int32)
    selected = []
    for s, c in enumerate(batch):
        start, end = c.seq.num_computed, c.seq.num_computed + c.num_tokens
        tokens[cu[s]:cu[s + 1]] = c.seq.token_ids[start:end]
        positions[cu[s]:cu[s + 1]] = np.arange(start, end, dtype=np.int32)
        context[s] = end
        tables[s, :len(c.seq.block_table)] = c.seq.block_table
        if all_logits:
            selected.extend(range(cu[s], cu[s + 1]))
        elif c.completes:
            selected.append(cu[s + 1] - 1)
    return StepBatch(tokens, positions, cu, context, tables, np.asarray(selected, dtype=np.int32))


def run_step(executor: Executor, batch: list[ScheduledChunk], all_logits: bool = False) -> np.ndarray:
    """Runs one step; returns logits [L, vocab] for the last row of every chunk that
    completes its sequence (or for every row when `all_logits`)."""
    return executor.step(make_step_batch(batch, all_logits))


def run_step_sampled(sampler: DeviceSampler, batch: list[ScheduledChunk]) -> np.ndarray:
    """Runs one step with sampling on the device (an executor's `sampler`); returns the
    token id [L] of every completing chunk. Each draw's uniform is its sequence's stream's at
    the position the token takes (runtime/random_stream.py), as when the host samples."""
    completing = [c.seq for c in batch if c.completes]
    rows = SamplingRows(
        temperature=np.array([s.params.temperature for s in completing], dtype=np.float32),
        top_k=np.array([max(0, s.params.top_k) for s in completing], dtype=np.int32),
        top_p=np.array([s.params.top_p for s in completing], dtype=np.float32),
        uniform=np.array([s.stream.uniform(len(s.token_ids)) if s.params.temperature > 0 else 0.0
                          for s in completing], dtype=np.float64))
    tokens, _ = sampler.sample(make_step_batch(batch), rows)
    return tokens
