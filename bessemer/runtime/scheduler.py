"""Scheduler: which sequences run in the next step, and how many of their tokens.

Running sequences first, then waiting ones admitted round-robin across requests
(runtime/fair_queue.py: one request's thousands of prompts cannot keep another's waiting),
under two budgets: tokens per step (`max_num_tokens`, so a long prompt is prefilled
in chunks) and sequences per step (`max_batch_size`). Running sequences go first (their
decode token or next prefill chunk), then waiting ones are admitted while blocks last.
When the KV pool runs dry, the newest running sequence is preempted: its blocks are
freed and it is recomputed later from its tokens, so outputs are unchanged.

Scoring is a policy of the same loop, not a second scheduler: a scored sequence limits
its chunks (ScoreState.chunk_limit), wants the logits of every row, and neither reads nor
fills the prefix cache. A prompt whose logprobs are asked for (prompt_logprobs) also wants
every row and reads nothing from the cache until they are computed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from bessemer.runtime.fair_queue import FairQueue
from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.sequence import Sequence


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # tokens of seq computed in this step, from seq.num_computed on

    @property
    def completes(self) -> bool:
        """The chunk reaches the sequence's last token: its logits are needed."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)

    @property
    def num_logits(self) -> int:
        """Rows of this chunk whose logits the step must return (its last ones): a
        decode row and one per draft token it verifies; every row of a scored sequence
        and of a prompt whose logprobs are asked for."""
        if self.seq.score is not None or self.seq.needs_prompt_logits:
            return self.num_tokens
        return 1 + self.seq.num_draft_tokens if self.completes else 0


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_tokens: int, max_batch_size: int):
        self.blocks = blocks
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.waiting = FairQueue()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self.blocks.free(victim.block_table)  # its full blocks stay cached for its return
        victim.num_computed = 0
        victim.block_keys.clear()
        self.waiting.appendleft(victim)
        self.num_preemptions += 1

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_tokens
        batch: list[ScheduledChunk] = []
        share = self._group_share()
        used: dict[int, int] = {}  # group -> tokens it was given in this step
        for seq in list(self.running):
            if seq not in self.running:  # preempted for an older sequence in this loop
                continue
            if budget == 0:
                break
            n = self._chunk_size(seq, self._group_budget(seq, budget, share, used))
            if n == 0:  # its request had its share of this step
                continue
            while not self.blocks.can_allocate(seq.block_table, seq.num_computed + n):
                victim = self.running[-1]
                if victim is seq:
                    break
                self._preempt(victim)
            if not self.blocks.can_allocate(seq.block_table, seq.num_computed + n):
                self._preempt(seq)
                continue
            self.blocks.allocate(seq.block_table, seq.num_computed + n)
            batch.append(ScheduledChunk(seq, n))
            budget -= n
            used[seq.group] = used.get(seq.group, 0) + n
        full: set[int] = set()  # groups that had their share of this step
        while budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting.peek(skip=full)
            if seq is None:
                break
            if seq.num_computed == 0 and seq.uses_prefix_cache:
                self._reuse_cached_prefix(seq)
            n = self._chunk_size(seq, self._group_budget(seq, budget, share, used))
            if n == 0:
                full.add(seq.group)
                continue
            if not self.blocks.can_allocate(seq.block_table, seq.num_computed + n):
                self.blocks.free(seq.block_table)  # give the shared prefix back while waiting
                seq.num_computed = 0
                seq.block_keys.clear()
                break
            self.waiting.take(seq)
            if seq.first_scheduled_time is None:  # a preempted sequence's return is not its admission
                seq.first_scheduled_time = time.perf_counter()
            self.blocks.allocate(seq.block_table, seq.num_computed + n)
            self.running.append(seq)
            batch.append(ScheduledChunk(seq, n))
            budget -= n
            used[seq.group] = used.get(seq.group, 0) + n
        return batch

    def _group_share(self) -> int:
        """The tokens one request (group) may take in a step: all of them when it is alone,
        half while other requests have work, so its prefills cannot fill every step while
        another request's tokens wait."""
        groups = {s.group for s in self.running} | self.waiting.group_ids()
        return self.max_num_tokens if len(groups) <= 1 else max(1, self.max_num_tokens // 2)

    @staticmethod
    def _group_budget(seq: Sequence, budget: int, share: int, used: dict[int, int]) -> int:
        """What `seq` may take of `budget`: a decode row always fits, prefill chunks only
        within its group's share."""
        if seq.num_pending <= 1:
            return budget
        return min(budget, max(0, share - used.get(seq.group, 0)))

    @staticmethod
    def _chunk_size(seq: Sequence, budget: int) -> int:
        if seq.score is not None:
            return min(seq.score.chunk_limit(seq.num_computed, len(seq.token_ids)), budget)
        return min(seq.num_pending, budget)

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Starts `seq` after the cached blocks its tokens begin with. At least one token
        is always computed, since its logits are needed."""
        bs = self.blocks.block_size
        limit = (len(seq.token_ids) - 1) // bs * bs
        seq.block_table, seq.block_keys = self.blocks.match_prefix(seq.token_ids, limit)
        seq.num_computed = len(seq.block_table) * bs

    def add_drafts(self, chunk: ScheduledChunk, drafts: list[int], budget: int) -> ScheduledChunk:
        """Extends a decode chunk by draft tokens to verify in the same step, as many as
        `budget` (tokens left in the step) and the free blocks allow."""
        seq = chunk.seq
        drafts = drafts[:budget]
        while drafts and not self.blocks.can_allocate(seq.block_table, seq.num_computed + 1 + len(drafts)):
            drafts = drafts[:-1]
        if not drafts:
            return chunk
        self.blocks.allocate(seq.block_table, seq.num_computed + 1 + len(drafts))
        seq.token_ids += drafts
        seq.num_draft_tokens = len(drafts)
        return ScheduledChunk(seq, 1 + len(drafts))

    def computed(self, chunk: ScheduledChunk, num_rejected: int = 0) -> None:
        """Called after a step: the chunk's tokens, less the `num_rejected` draft tokens at
        its end, now have K/V in the cache; the blocks of rejected ones are returned."""
        seq = chunk.seq
        # a stop string or token may have cut the accepted tokens short: never past them
        seq.num_computed = min(seq.num_computed + chunk.num_tokens - num_rejected, len(seq.token_ids))
        if num_rejected:
            self.blocks.trim(seq.block_table, len(seq.token_ids))
        if seq.uses_prefix_cache:
            self.blocks.register(seq.token_ids, seq.block_table, seq.num_computed, seq.block_keys)

    def finish(self, seq: Sequence, reason: str) -> None:
        seq.finish_reason = reason
        self.running.remove(seq)
        self.blocks.free(seq.block_table)

    def abort(self, seq: Sequence) -> None:
        if seq in self.running:
            self.finish(seq, "abort")
        else:
            if seq in self.waiting:
                self.waiting.remove(seq)
            self.blocks.free(seq.block_table)
            seq.finish_reason = "abort"
