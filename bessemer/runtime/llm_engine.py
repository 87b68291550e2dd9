"""LLMEngine: the engine core every front end drives (LLM, AsyncLLM, the server).

One step is three calls, as in nano-vllm:

    batch = scheduler.schedule()              # which sequences, how many tokens each
    logits = run_step(executor, batch)        # the model (C++ executor, or N ranks)
    updates = self.postprocess(batch, logits) # sample, append, stop checks, text

with two optional additions: speculative decoding extends decode chunks by draft tokens
before the step (and postprocess accepts a prefix of them), and constrained sequences'
token masks are computed on a worker thread while the step runs.

It owns what a loaded engine needs to serve (the executor, the KV block manager, the
scheduler, the output processor) and nothing about how requests arrive. Not
thread-safe: one thread drives it (AsyncLLM's engine thread).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence as Seq

import numpy as np

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.engine import Engine
from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.model_runner import run_step, run_step_sampled
from bessemer.runtime.output_processor import OutputProcessor, eos_token_ids
from bessemer.runtime.outputs import SequenceUpdate
from bessemer.runtime.sampler import bad_words_token_ids, process_logits, sample, top_logprobs
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.runtime.scheduler import ScheduledChunk, Scheduler
from bessemer.runtime.sequence import ScoreState, Sequence
from bessemer.runtime.speculative import SpeculativeConfig, make_proposer
from bessemer.runtime.speculative.rejection import accept_greedy, accept_sampled
from bessemer.runtime.constraint_limits import ConstraintLimits
from bessemer.runtime.grammar_compiler import GrammarCompiler
from bessemer.runtime.structured import ConstraintError, MaskWorker, apply_mask
from bessemer.runtime.tokenizer import Tokenizer
from bessemer.targets import RunOptions


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's state (AsyncLLM publishes one after every step)."""

    num_running: int = 0  # sequences, so a request with n=4 counts 4
    num_waiting: int = 0
    num_blocks: int = 0
    num_free_blocks: int = 0
    num_hit_tokens: int = 0  # prefix cache: prompt tokens served from cached blocks
    num_queried_tokens: int = 0  # prefix cache: prompt tokens looked up
    num_preemptions: int = 0
    num_steps: int = 0
    num_draft_tokens: int = 0  # speculative decoding: draft tokens verified
    num_accepted_tokens: int = 0  # ... and accepted by the target
    num_step_tokens: int = 0  # tokens the last step ran: prefill chunks, decode and draft tokens


class LLMEngine:
    def __init__(self, engine_dir: str | os.PathLike, num_threads: int | None = None,
                 kv_cache_gib: float | None = None, isa: str = "auto", verify_checksum: bool = True,
                 seed: int = 0, enable_prefix_caching: bool = True, tp_timeout_s: float = 30.0,
                 speculative: SpeculativeConfig | str | dict | None = None, device: int | None = None,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool = False,
                 say: Callable[[str], None] | None = None, interpret: bool = False,
                 constraint_limits: ConstraintLimits | None = None):
        """A `--tp N` engine runs as N processes (runtime/tp.py): `num_threads` is per rank
        (default: the cores divided among the ranks); `tp_timeout_s` is how long a rank
        waits for a late peer inside a step before the engine stops with an error.
        A cuda engine runs on GPU `device` (default 0); its KV cache takes `kv_cache_gib`
        or `gpu_memory_utilization` of the GPU; `enforce_eager` turns CUDA graphs off.
        `say` receives load progress; `interpret` runs a cuda engine's launch list on CPU through
        the Triton interpreter (slow; tests and debugging without a GPU). `speculative`: see
        runtime/speculative/config.py. `constraint_limits` bound the JSON schemas, regexes
        and grammars requests may send (runtime/constraint_limits.py)."""
        self.speculative = SpeculativeConfig.parse(speculative)
        self.engine = Engine.load(engine_dir, verify_checksum=verify_checksum)
        self.tp_size = int(self.engine.config.get("mapping", {}).get("tp_size", 1))
        build = self.engine.build
        self.max_seq_len = int(build["max_seq_len"])
        self.max_num_tokens = int(build["max_num_tokens"])
        self.max_batch_size = int(build["max_batch_size"])
        self.block_size = int(build["kv_block_size"])
        self.vocab_size = int(self.engine.header["plan"]["vocab_size"])
        opened = self.engine.target.open_executor(self.engine, RunOptions(
            num_threads=num_threads, kv_cache_gib=kv_cache_gib, isa=isa, tp_timeout_s=tp_timeout_s,
            verify_checksum=verify_checksum, device=device, gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager, interpret=interpret, say=say))
        self.executor, self.num_kv_blocks, self.num_threads = opened.executor, opened.num_kv_blocks, opened.num_threads
        self.blocks = BlockManager(self.num_kv_blocks, self.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, self.max_num_tokens, self.max_batch_size)
        self._tokenizer: Tokenizer | None = None
        tokenizer = self._get_tokenizer if (self.engine.dir / "tokenizer.json").exists() else None
        self.output_processor = OutputProcessor(eos_token_ids(self.engine.dir, self.engine.model, tokenizer),
                                                self.max_seq_len, tokenizer)
        self._seed = seed
        self._next_id = 0
        self.num_steps = 0  # steps that ran a batch
        self.num_step_tokens = 0  # tokens the last of them ran
        self.num_draft_tokens = self.num_accepted_tokens = 0
        self.grammars = GrammarCompiler(self.engine.dir / "tokenizer.json", self.vocab_size,
                                        self.output_processor.eos_ids, constraint_limits)
        self._masks: MaskWorker | None = None
        self.proposer = None
        if self.speculative is not None:
            self.proposer = make_proposer(self.speculative, self, kv_cache_gib=kv_cache_gib, isa=isa,
                                          verify_checksum=verify_checksum)

    def close(self) -> None:
        """Stops the worker ranks of a tensor-parallel engine now (they also stop when the
        engine is garbage-collected or the process exits)."""
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()
        if self._masks is not None:
            self._masks.close()
        self.grammars.close()

    @property
    def tokenizer(self) -> Tokenizer:
        return self._get_tokenizer()

    def _get_tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.engine.dir)
        return self._tokenizer

    def set_limits(self, max_num_seqs: int | None, max_num_tokens: int | None) -> None:
        """Lowers the scheduler's per-step limits; the executor was built for the engine's
        limits, so raising them is impossible without a rebuild."""
        for name, value, built in (("--max-num-seqs", max_num_seqs, self.max_batch_size),
                                   ("--max-num-tokens", max_num_tokens, self.max_num_tokens)):
            if value is None:
                continue
            if not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{name} must be a positive integer, got {value!r}")
            if value > built:
                raise InvalidOptionError(f"{name} {value} exceeds the engine's built limit {built}; "
                                         f"pass at most {built} or rebuild the engine with a larger limit")
        if max_num_seqs is not None:
            self.scheduler.max_batch_size = max_num_seqs
        if max_num_tokens is not None:
            self.scheduler.max_num_tokens = max_num_tokens

    # ---- requests: add_request -> step()* -> finished (or abort) ----
    def _new_sequence(self, token_ids: list[int], params: SamplingParams, index: int = 0,
                      generates: bool = True) -> Sequence:
        """`generates`: the sequence needs room for at least one output token (scoring does not)."""
        if not token_ids:
            raise RequestError("the prompt is empty; give at least one token")
        if len(token_ids) > self.max_seq_len - int(generates):
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens but the engine allows {self.max_seq_len} "
                f"(prompt and output); shorten the prompt or rebuild with a larger --max-seq-len")
        self._check_in_vocabulary(token_ids)
        seed = params.seed + index if params.seed is not None else self._seed + self._next_id
        seq = Sequence(self._next_id, list(token_ids), len(token_ids), params, np.random.default_rng(seed),
                       arrival_time=time.perf_counter())
        if params.prompt_logprobs is not None and index == 0:  # the request's n sequences share one prompt
            seq.prompt_logprobs = [None]  # the first token has no context (vLLM)
        self._next_id += 1
        return seq

    def _check_params(self, params: SamplingParams) -> list[list[int]]:
        """The checks of a request's params that need the vocabulary (once per request, not
        per sequence); returns its bad_words as token sequences."""
        self._check_in_vocabulary(params.logit_bias or (), " in logit_bias")
        self._check_in_vocabulary(params.allowed_token_ids or (), " in allowed_token_ids")
        if params.prompt_logprobs is not None and params.prompt_logprobs > self.vocab_size:
            raise RequestError(f"prompt_logprobs {params.prompt_logprobs} exceeds the vocabulary "
                               f"({self.vocab_size} tokens); ask for at most {self.vocab_size}")
        return self._bad_words_token_ids(params)

    def _check_in_vocabulary(self, token_ids, where: str = "") -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"token id {bad}{where} is outside the vocabulary (0..{self.vocab_size - 1})")

    def _bad_words_token_ids(self, params: SamplingParams) -> list[list[int]]:
        """params.bad_words as token sequences (sampler.bad_words_token_ids), tokenized once
        when the request is added rather than at every step."""
        if not params.bad_words:
            return []
        if not (self.engine.dir / "tokenizer.json").exists():
            raise RequestError("bad_words needs the engine's tokenizer and this engine has none (no tokenizer.json); "
                               "ban token ids with logit_bias -100 instead")
        tokenizer = self.tokenizer
        words = bad_words_token_ids(params.bad_words, lambda text: tokenizer.encode(text, add_special_tokens=False))
        for word in words:
            self._check_in_vocabulary(word, " of bad_words")
        return words

    def add_request(self, token_ids: list[int], params: SamplingParams, stream: bool = False,
                    grammars: list | None = None, group: int | None = None) -> list[Sequence]:
        """Queues one prompt; returns its `params.n` sequences (seeds seed, seed+1, ...).
        `grammars`: the constraint's n GrammarStates when the caller compiled them already
        (`self.grammars.submit(params)`, off this thread); else they are compiled here.
        `group`: the request these sequences belong to, for fair admission (several
        prompts of one API call share one; default: a group of their own)."""
        bad_words = self._check_params(params)
        seqs = [self._new_sequence(token_ids, params, i) for i in range(params.n)]
        for seq in seqs:
            seq.group = seqs[0].seq_id if group is None else group
            seq.bad_words = bad_words  # read only: one list serves the request's n sequences
        if grammars is None and params.constrained:  # a constraint that does not compile fails here
            grammars = self.grammars.states(params)
        for seq, grammar in zip(seqs, grammars or [None] * len(seqs)):
            seq.grammar = grammar
        for seq in seqs:
            self.output_processor.start(seq, stream)
            self.scheduler.add(seq)
        return seqs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def abort(self, seq: Sequence) -> None:
        """Cancels a queued or running sequence and returns its KV blocks."""
        if seq.finish_reason is None:
            self.scheduler.abort(seq)
            self._release(seq)

    def _finish(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if self.proposer is not None:
            self.proposer.release(seq)

    def step(self) -> list[SequenceUpdate]:
        """Runs one engine step; returns an update for every sequence that got tokens.
        Finished ones have `finish_reason` set."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        if self.proposer is not None:
            batch = self._add_drafts(batch)
        self.num_step_tokens = sum(c.num_tokens for c in batch)
        if self._samples_on_device(batch):
            sampled = run_step_sampled(self.executor, batch)
            self.num_steps += 1
            return self.postprocess(batch, None, False, sampled)
        masks = self._start_masks(batch)
        # run_step returns the last row of each completing chunk, or every row: ask for
        # every row when some chunk wants others (scoring; verifying draft tokens)
        all_logits = any(c.num_logits != int(c.completes) for c in batch)
        try:
            logits = run_step(self.executor, batch, all_logits=all_logits)
        finally:
            if masks is not None:
                masks.result()  # the masks' thread is idle again, even when the step failed
        self.num_steps += 1
        return self.postprocess(batch, logits, all_logits)

    def _samples_on_device(self, batch: list[ScheduledChunk]) -> bool:
        """Whether the executor's device sampler (temperature, top-k, top-p: a cuda engine's
        logits never leave the GPU) gives every token of this step: not when a completing
        sequence needs the logits on the host (penalties, min_p, logprobs, the min_tokens
        mask, logit_bias, allowed_token_ids, bad_words, a grammar, drafts to verify, scoring,
        prompt logprobs)."""
        if not getattr(self.executor, "samples_on_device", False):
            return False
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

    def _add_drafts(self, batch: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """Lets decode chunks verify draft tokens in this step. Only in steps of decode
        rows: run_step returns every row's logits when a chunk needs several, which for
        a prefill chunk would run the lm_head over its whole prompt."""
        if any(c.num_tokens != 1 or not c.completes or c.seq.score is not None for c in batch):
            return batch
        requests = []
        for c in batch:
            seq = c.seq
            # the step emits up to k + 1 tokens: stay within max_tokens and max_seq_len
            k = min(self.speculative.num_tokens, seq.params.max_tokens - len(seq.output_token_ids) - 1,
                    self.max_seq_len - len(seq.token_ids) - 1)
            if k > 0:
                requests.append((seq, k))
        if not requests:
            return batch
        proposals = {seq.seq_id: p for (seq, _), p in zip(requests, self.proposer.propose(requests))}
        budget = self.scheduler.max_num_tokens - len(batch)
        out = []
        for c in batch:
            drafts, dists = proposals.get(c.seq.seq_id, ([], None))
            if drafts and budget > 0:
                c = self.scheduler.add_drafts(c, drafts, dists, budget)
                budget -= c.num_tokens - 1
            out.append(c)
        return out

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
                self._record_prompt_logprobs(seq, chunk_logits)
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
        drafts, dists = seq.token_ids[len(seq.token_ids) - k:], seq.draft_dists
        del seq.token_ids[len(seq.token_ids) - k:]
        seq.num_draft_tokens, seq.draft_dists = 0, None
        if chunk_sampled is not None:
            tokens, entries = [int(chunk_sampled[-1])], None
        else:
            tokens, entries = self._sample(seq, chunk_logits[rows - num_logits:], drafts, dists)
        update, reason = self.output_processor.append(seq, tokens, entries, now)
        self.scheduler.computed(chunk, num_rejected=k - (len(tokens) - 1))
        self.num_draft_tokens += k
        self.num_accepted_tokens += len(tokens) - 1
        if seq.grammar is not None:
            seq.grammar.accept(update.token_ids)
            if reason is None and seq.grammar.finished:
                reason = "stop"  # the constraint is complete: only end-of-sequence could follow
        return update, reason

    def _sample(self, seq: Sequence, rows: np.ndarray, drafts: list[int],
                dists: list | None) -> tuple[list[int], list[dict[int, float]] | None]:
        """rows: (1 + len(drafts), vocab) raw logits -> the tokens to emit (the accepted
        drafts and one more) and their top-logprobs entries if asked."""
        params = seq.params
        prompt, output = seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids

        def logits_at(i: int) -> np.ndarray:  # position i: after drafts[:i] were accepted
            row = rows[i] if seq.grammar is None else apply_mask(rows[i], seq.grammar.mask(i))
            return process_logits(row, params, prompt, output + drafts[:i],
                                  self.output_processor.banned_ids(seq, len(row), i), seq.bad_words)

        if not drafts:
            tokens = [sample(logits_at(0), params.temperature, params.top_k, params.top_p, seq.rng, params.min_p)]
        elif params.temperature <= 0:
            tokens = accept_greedy(logits_at, drafts)
        else:
            tokens = accept_sampled(logits_at, drafts, dists, params, seq.rng)
        if params.logprobs is None:
            return tokens, None
        return tokens, [top_logprobs(rows[i], t, params.logprobs) for i, t in enumerate(tokens)]

    @staticmethod
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

    def _record_scores(self, chunk: ScheduledChunk, logits: np.ndarray) -> None:
        seq = chunk.seq
        if seq.num_computed == 0:  # (re)started: a preempted sequence recomputes from 0
            seq.score.logits.clear()
        seq.score.logits.append(logits)
        self.scheduler.computed(chunk)
        if seq.num_computed == len(seq.token_ids):
            self._finish(seq, "length")

    # ---- scoring: a scheduler policy (ScoreState), run to completion ----
    def score(self, token_ids: Seq[Seq[int]], num_prefill: int | None = None) -> list[np.ndarray]:
        """Logits (len, vocab) at every position of each sequence, computed as the engine
        serves: the first `num_prefill` tokens in one prefill (chunked by max_num_tokens),
        each later token in its own decode step, all sequences batched together."""
        seqs = []
        for ids in token_ids:
            seq = self._new_sequence(list(ids), SamplingParams(), generates=False)
            seq.score = ScoreState(num_prefill)
            seqs.append(seq)
        for seq in seqs:
            self.scheduler.add(seq)
        try:
            while any(s.finish_reason is None for s in seqs):
                before = self.num_steps
                self.step()
                if self.num_steps == before:
                    raise RequestError("sequences do not fit in the KV cache; score fewer at once")
        finally:  # an error mid-way must not leak blocks
            for seq in seqs:
                self.abort(seq)
        return [np.concatenate(s.score.logits, axis=0) for s in seqs]

    def stats(self) -> EngineStats:
        s, b = self.scheduler, self.blocks
        return EngineStats(len(s.running), len(s.waiting), b.num_blocks, b.num_free, b.num_hit_tokens,
                           b.num_queried_tokens, s.num_preemptions, self.num_steps, self.num_draft_tokens,
                           self.num_accepted_tokens, self.num_step_tokens)
