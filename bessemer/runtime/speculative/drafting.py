"""Draft tokens added to a step's decode chunks, for the target to verify in that step."""

from __future__ import annotations

from bessemer.runtime.scheduler import ScheduledChunk, Scheduler
from bessemer.runtime.speculative.config import SpeculativeConfig


def add_drafts(batch: list[ScheduledChunk], proposer, scheduler: Scheduler, config: SpeculativeConfig,
               max_seq_len: int) -> list[ScheduledChunk]:
    """Lets decode chunks verify draft tokens from `proposer` in this step. Only in steps of
    decode rows: a chunk that needs several rows' logits gets every row's, which for a
    prefill chunk would run the lm_head over its whole prompt."""
    if any(c.num_tokens != 1 or not c.completes or c.seq.score is not None for c in batch):
        return batch
    requests = []
    for c in batch:
        seq = c.seq
        # the step emits up to k + 1 tokens: stay within max_tokens and max_seq_len
        k = min(config.num_tokens, seq.params.max_tokens - len(seq.output_token_ids) - 1,
                max_seq_len - len(seq.token_ids) - 1)
        if k > 0:
            requests.append((seq, k))
    if not requests:
        return batch
    proposals = {seq.seq_id: p for (seq, _), p in zip(requests, proposer.propose(requests))}
    budget = scheduler.max_num_tokens - len(batch)
    out = []
    for c in batch:
        drafts = proposals.get(c.seq.seq_id, [])
        if drafts and budget > 0:
            c = scheduler.add_drafts(c, drafts, budget)
            budget -= c.num_tokens - 1
        out.append(c)
    return out
