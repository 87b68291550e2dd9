"""SamplingStep: one scheduled batch through the executor, and its logits into tokens.

    updates = sampling_step.run(batch)     # the model, then sample, append, stop checks

Where a step's tokens come from:
- the executor's device sampler (runtime/executor.py; a cuda engine's logits never leave
  the GPU) when it has one and every completing sequence asks only for what it does:
  temperature, top-k, top-p;
- otherwise the host (runtime/sampler.py) from the logits: a constrained sequence's token
  mask (computed on a worker thread while the step runs) applied first, then bias,
  penalties and the other controls, then the draw with the sequence's uniform for the
  position (runtime/random_stream.py); draft tokens are accepted while they equal the
  target's own draw (speculative/acceptance.py), and the accepted ones plus one more are
  emitted: the tokens decoding without drafts gives.
Scoring sequences keep every row's logits; prompt logprobs are read from the prompt's rows.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from bessemer.runtime.executor import Executor
from bessemer.runtime.model_runner import run_step, run_step_sampled
from bessemer.runtime.output_processor import OutputProcessor
from bessemer.runtime.outputs import SequenceUpdate
from bessemer.runtime.sampler import process_logits, sample, top_logprobs
from bessemer.runtime.scheduler import ScheduledChunk, Scheduler
from bessemer.runtime.sequence import Sequence
from bessemer.runtime.speculative.acceptance import accept
from bessemer.runtime.structured import ConstraintError, MaskWorker, apply_mask


class SamplingStep:
    def __init__(self, executor: Executor, scheduler: Scheduler, output_processor: OutputProcessor,
                 finish: Callable[[Sequence, str], None]):
        """`finish(seq, reason)`: ends a sequence (the engine core's: it also frees its drafts)."""
        self.executor, self.scheduler, self.output_processor = executor, scheduler, output_processor
        self._finish = finish
        self._masks: MaskWorker | None = None  # started by the first constrained step
        self.num_draft_tokens = self.num_accepted_tokens = 0  # speculative decoding, since the start

    def close(self) -> None:
        if self._masks is not None:
            self._masks.close()

    def run(self, batch: list[ScheduledChunk]) -> list[SequenceUpdate]:
        """Runs the step; returns an update for every sequence that got tokens."""
        if self.executor.sampler is not None and self._samples_on_device(batch):
            return self.postprocess(batch, None, False, run_step_sampled(self.executor.sampler, batch))
        masks = self._start_masks(batch)
        # run_step returns the last row of each completing chunk, or every row: ask for
        # every row when some chunk wants others (scoring; verifying draft tokens)
        all_logits = any(c.num_logits != int(c.completes) for c in batch)
        try:
            logits = run_step(self.executor, batch, all_logits=all_logits)
        finally:
            if masks is not None:
                masks.result()  # the masks' thread is idle again, even when the step failed
        return self.postprocess(batch, logits, all_logits)

    @staticmethod
    def _samples_on_device(batch: list[ScheduledChunk]) -> bool:
        """Whether the device sampler gives every token of this step: not when a completing
        sequence needs the logits on the host (penalties, min_p, logprobs, the min_tokens
        mask, logit_bias, allowed_token_ids, bad_words, a grammar, drafts to verify, scoring,
        prompt logprobs)."""
        for c in batch:
            seq, p = c.seq, c.seq.params
            if seq.score is not None or seq.needs_prompt_logits or seq.num_draft_tokens \
                    or c.num_logits > int(c.completes):
                return False
            if c.completes and (seq.grammar is not None or p.repetition_penalty != 1.0 or p.presence_penalty != 0.0
                                or p.frequency_penalty != 0.0 or p.min_p != 0.0 or p.logprobs is not None
                                or len(seq.output_token_ids) < p.min_tokens or p.logit_bias
                                or p.allowed_token_ids is not None or seq.bad_words):
                return False
        return True

    def _start_masks(self, batch: list[ScheduledChunk]):
        jobs = [(c.seq.grammar, c.seq.token_ids[len(c.seq.token_ids) - c.seq.num_draft_tokens:])
                for c in batch if c.seq.grammar is not None and c.num_logits]
        if not jobs:
            return None
        if self._masks is None:
            self._masks = MaskWorker()
        return self._masks.start(jobs)

    def postprocess(self, batch: list[ScheduledChunk], logits: np.ndarray | None, all_logits: bool,
                    sampled: np.ndarray | None = None) -> list[SequenceUpdate]:
        """logits: (rows, vocab), the last `num_logits` rows of each chunk (every row of
        every chunk when `all_logits`); or, when the device sampled, `sampled`: (rows,) the
        token of each completing chunk."""
        now = time.perf_counter()
        updates = []
        row = 0
        for chunk in batch:
            seq = chunk.seq
            num_logits = chunk.num_logits  # read before computed() moves the sequence on
            rows = chunk.num_tokens if all_logits else num_logits
            chunk_logits = logits[row:row + rows] if sampled is None else None  # (rows, vocab)
            chunk_sampled = sampled[row:row + rows] if sampled is not None else None
            row += rows
            if seq.score is not None:
                self._record_scores(chunk, chunk_logits)
                continue
            if seq.needs_prompt_logits:  # first: afterwards num_logits counts only the row to sample
                _record_prompt_logprobs(seq, chunk_logits)
            if not chunk.completes:
                self.scheduler.computed(chunk)
                continue
            try:
                update, reason = self._advance(chunk, chunk_logits, chunk_sampled, rows, now)
            except Exception as e:  # noqa: BLE001 - this sequence's failure ends this sequence only
                # a failed constraint is the request's own (its message is for the client)
                seq.error = str(e) if isinstance(e, ConstraintError) else f"{type(e).__name__}: {e}"
                seq.error_kind = "constraint" if isinstance(e, ConstraintError) else "internal"
                update, reason = SequenceUpdate(seq, "", [], None), "error"
            if reason:
                self._finish(seq, reason)
            updates.append(update)
        return updates

    def _advance(self, chunk: ScheduledChunk, chunk_logits: np.ndarray | None, chunk_sampled: np.ndarray | None,
                 rows: int, now: float) -> tuple[SequenceUpdate, str | None]:
        """Samples one chunk's next token(s) (or takes the device's), appends them and runs
        the stop checks; returns the update and the finish reason (None: it goes on)."""
        seq, num_logits = chunk.seq, chunk.num_logits
        k = seq.num_draft_tokens
        drafts = seq.token_ids[len(seq.token_ids) - k:]
        del seq.token_ids[len(seq.token_ids) - k:]
        seq.num_draft_tokens = 0
        if chunk_sampled is not None:
            tokens, entries = [int(chunk_sampled[-1])], None
        else:
            tokens, entries = self._sample(seq, chunk_logits[rows - num_logits:], drafts)
        update, reason = self.output_processor.append(seq, tokens, entries, now)
        self.scheduler.computed(chunk, num_rejected=k - (len(tokens) - 1))
        self.num_draft_tokens += k
        self.num_accepted_tokens += len(tokens) - 1
        if seq.grammar is not None:
            seq.grammar.accept(update.token_ids)
            if reason is None and seq.grammar.finished:
                reason = "stop"  # the constraint is complete: only end-of-sequence could follow
        return update, reason

    def _sample(self, seq: Sequence, rows: np.ndarray,
                drafts: list[int]) -> tuple[list[int], list[dict[int, float]] | None]:
        """rows: (1 + len(drafts), vocab) raw logits -> the tokens to emit (the accepted
        drafts and one more) and their top-logprobs entries if asked."""
        params = seq.params
        prompt, output = seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids
        position = len(seq.token_ids)  # of the first token to emit

        def logits_at(i: int) -> np.ndarray:  # position i: after drafts[:i] were accepted
            row = rows[i] if seq.grammar is None else apply_mask(rows[i], seq.grammar.mask(i))
            return process_logits(row, params, prompt, output + drafts[:i],
                                  self.output_processor.banned_ids(seq, len(row), i), seq.bad_words)

        def draw_at(i: int) -> int:
            uniform = seq.stream.uniform(position + i) if params.temperature > 0 else 0.0
            return sample(logits_at(i), params.temperature, params.top_k, params.top_p, uniform, params.min_p)

        tokens = accept(draw_at, drafts)
        if params.logprobs is None:
            return tokens, None
        return tokens, [top_logprobs(rows[i], t, params.logprobs) for i, t in enumerate(tokens)]

    def _record_scores(self, chunk: ScheduledChunk, logits: np.ndarray) -> None:
        seq = chunk.seq
        if seq.num_computed == 0:  # (re)started: a preempted sequence recomputes from 0
            seq.score.logits.clear()
        seq.score.logits.append(logits)
        self.scheduler.computed(chunk)
        if seq.num_computed == len(seq.token_ids):
            self._finish(seq, "length")


def _record_prompt_logprobs(seq: Sequence, logits: np.ndarray) -> None:
    """logits: (num_tokens, vocab), every row of a chunk from position seq.num_computed on.
    The row at position i gives prompt token i + 1's entry: its logprob and the top
    params.prompt_logprobs of the raw distribution (no penalties or bias, as vLLM). A
    chunk recomputed after a preemption adds only the entries not there yet."""
    start, entries = seq.num_computed, seq.prompt_logprobs
    first = len(entries) - 1  # the position whose row gives the next missing entry
    if first < start:
        raise RuntimeError(f"prompt logprobs need every prompt row but the chunk starts at {start}, after "
                           f"position {first}: the prefix cache must not serve this sequence")
    for i in range(first, min(start + len(logits), seq.num_prompt_tokens - 1)):
        entries.append(top_logprobs(logits[i - start], seq.token_ids[i + 1], seq.params.prompt_logprobs))
