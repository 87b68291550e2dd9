"""Scheduler: which sequences run in the next step, and how many of their tokens.

FCFS under two budgets: tokens per step (`max_num_tokens`, so a long prompt is prefilled
in chunks) and sequences per step (`max_batch_size`). Running sequences go first (their
decode token or next prefill chunk), then waiting ones are admitted while blocks last.
When the KV pool runs dry, the newest running sequence is preempted: its blocks are
freed and it is recomputed later from its tokens, so outputs are unchanged.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from bessemer.runtime.kv_cache import BlockManager


@dataclass
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: object  # SamplingParams
    rng: np.random.Generator
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_keys: list[int] = field(default_factory=list)  # prefix-cache chain of its full blocks
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    detok: object = None  # IncrementalDetokenizer when text is needed while generating
    text: str | None = None
    arrival_time: float = 0.0
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed


@dataclass(frozen=True)
class ScheduledChunk:
    seq: Sequence
    num_tokens: int  # tokens of seq computed in this step, from seq.num_computed on

    @property
    def completes(self) -> bool:
        """The chunk reaches the sequence's last token: its logits are needed."""
        return self.seq.num_computed + self.num_tokens == len(self.seq.token_ids)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_tokens: int, max_batch_size: int):
        self.blocks = blocks
        self.max_num_tokens = max_num_tokens
        self.max_batch_size = max_batch_size
        self.waiting: deque[Sequence] = deque()
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
        for seq in list(self.running):
            if seq not in self.running:  # preempted for an older sequence in this loop
                continue
            n = min(seq.num_pending, budget)
            if n == 0:
                break
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
        while self.waiting and budget > 0 and len(self.running) < self.max_batch_size:
            seq = self.waiting[0]
            if seq.num_computed == 0:
                self._reuse_cached_prefix(seq)
            n = min(seq.num_pending, budget)
            if not self.blocks.can_allocate(seq.block_table, seq.num_computed + n):
                self.blocks.free(seq.block_table)  # give the shared prefix back while waiting
                seq.num_computed = 0
                seq.block_keys.clear()
                break
            self.waiting.popleft()
            self.blocks.allocate(seq.block_table, seq.num_computed + n)
            self.running.append(seq)
            batch.append(ScheduledChunk(seq, n))
            budget -= n
        return batch

    def _reuse_cached_prefix(self, seq: Sequence) -> None:
        """Starts `seq` after the cached blocks its tokens begin with. At least one token
        is always computed, since its logits are needed."""
        bs = self.blocks.block_size
        limit = (len(seq.token_ids) - 1) // bs * bs
        seq.block_table, seq.block_keys = self.blocks.match_prefix(seq.token_ids, limit)
        seq.num_computed = len(seq.block_table) * bs

    def computed(self, chunk: ScheduledChunk) -> None:
        """Called after a step: the chunk's tokens now have K/V in the cache."""
        seq = chunk.seq
        seq.num_computed += chunk.num_tokens
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
