"""Sequence: one prompt's tokens and where it stands (cache, sampling, text); what the
scheduler schedules and the output processor finishes.

A sequence is either generated (sampled token by token) or scored (`score` set: logits at
every position of a fixed token list, computed as the engine serves; see ScoreState).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bessemer.runtime.random_stream import RandomStream
from bessemer.runtime.sampling_params import SamplingParams


@dataclass
class ScoreState:
    """Scoring policy and result: the first `num_prefill` tokens as one prefill (chunked by
    the step's token budget), each later token in its own decode step; with no
    `num_prefill`, all tokens as one prefill. `logits` holds one (rows, vocab) block per
    step, in position order."""

    num_prefill: int | None = None
    logits: list[np.ndarray] = field(default_factory=list)

    def chunk_limit(self, num_computed: int, num_tokens: int) -> int:
        """How many tokens the next step may compute, from `num_computed` on."""
        if not self.num_prefill:
            return num_tokens - num_computed
        end = self.num_prefill if num_computed < self.num_prefill else num_computed + 1
        return min(end, num_tokens) - num_computed


@dataclass
class Sequence:
    seq_id: int
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    stream: RandomStream  # the uniforms its tokens are drawn with, one per position
    num_computed: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_keys: list[int] = field(default_factory=list)  # prefix-cache chain of its full blocks
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "abort", or "error" (then `error` says why)
    error: str | None = None  # why this sequence failed inside a step (the others went on)
    error_kind: str | None = None  # "constraint" (its constraint failed: the request's) or "internal"
    group: int = 0  # the request it belongs to (fair admission, runtime/fair_queue.py)
    detok: object = None  # IncrementalDetokenizer when text is needed while generating
    text: str | None = None
    score: ScoreState | None = None  # set for a scored (not generated) sequence
    # Speculative decoding: during a step, the last num_draft_tokens of token_ids are
    # drafts being verified
    num_draft_tokens: int = 0
    grammar: object = None  # structured.GrammarState of a constrained sequence
    bad_words: list[list[int]] = field(default_factory=list)  # params.bad_words as token sequences
    # params.prompt_logprobs: one entry per prompt token computed so far (the first is None);
    # None when this sequence does not report them (not asked, or not the first of its n)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    arrival_time: float = 0.0
    first_scheduled_time: float | None = None  # when the scheduler first admitted it (queue time ends)
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_pending(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def needs_prompt_logits(self) -> bool:
        """Its prompt logprobs are not all computed: every row of its chunks is needed."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < self.num_prompt_tokens

    @property
    def uses_prefix_cache(self) -> bool:
        """Scored sequences, and generated ones until their prompt logprobs are computed,
        need logits at every position, so none of their tokens may come from the cache.
        Scored ones leave nothing in it (the cache serves generation)."""
        return self.score is None and not self.needs_prompt_logits
