"""LLMEngine: the engine core every front end drives (LLM, AsyncLLM, the server).

One step is three calls, as in nano-vllm:

    batch = scheduler.schedule()              # which sequences, how many tokens each
    updates = sampling_step.run(batch)        # the model (the target's Executor), then
                                              # sample, append, stop checks, text

with speculative decoding extending decode chunks by draft tokens before the step (and the
sampling step accepting a prefix of them). How tokens are chosen (host or device
sampling, grammar masks, draft verification, scoring) is runtime/sampling_step.py's.

It owns what a loaded engine needs to serve (the executor, the KV block manager, the
scheduler, the output processor) and nothing about how requests arrive. Not
thread-safe: one thread drives it (AsyncLLM's engine thread).
"""

from __future__ import annotations

import os
from typing import Sequence as Seq

import numpy as np

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.engine import Engine
from bessemer.runtime.engine_stats import EngineStats
from bessemer.runtime.executor import Executor
from bessemer.runtime.grammar_compiler import GrammarCompiler
from bessemer.runtime.kv_cache import BlockManager
from bessemer.runtime.output_processor import OutputProcessor, eos_token_ids
from bessemer.runtime.outputs import SequenceUpdate
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.runtime.sampling_step import SamplingStep
from bessemer.runtime.scheduler import Scheduler
from bessemer.runtime.sequence import ScoreState, Sequence
from bessemer.runtime.sequence_factory import SequenceFactory
from bessemer.runtime.speculative import SpeculativeConfig, make_proposer
from bessemer.runtime.speculative.drafting import add_drafts
from bessemer.runtime.tokenizer import Tokenizer
from bessemer.targets import RunOptions


class LLMEngine:
    def __init__(self, engine_dir: str | os.PathLike, options: RunOptions = RunOptions()):
        """`options`: how the engine runs (targets/__init__.py's RunOptions: threads, KV
        budget, device, speculative decoding, constraint limits, ...)."""
        self.options = options
        self.speculative = SpeculativeConfig.parse(options.speculative)
        self.engine = Engine.load(engine_dir, verify_checksum=options.verify_checksum)
        self.tp_size = int(self.engine.config.get("mapping", {}).get("tp_size", 1))
        build = self.engine.build
        self.max_seq_len = int(build["max_seq_len"])
        self.max_num_tokens = int(build["max_num_tokens"])
        self.max_batch_size = int(build["max_batch_size"])
        self.block_size = int(build["kv_block_size"])
        self.vocab_size = int(self.engine.header["plan"]["vocab_size"])
        executor = self.engine.target.open_executor(self.engine, options).executor
        self.num_kv_blocks, self.num_threads = executor.info.num_kv_blocks, executor.info.num_threads
        self.blocks = BlockManager(self.num_kv_blocks, self.block_size, options.enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, self.max_num_tokens, self.max_batch_size)
        self._tokenizer: Tokenizer | None = None
        tokenizer = self._get_tokenizer if (self.engine.dir / "tokenizer.json").exists() else None
        self.output_processor = OutputProcessor(eos_token_ids(self.engine.dir, self.engine.model, tokenizer),
                                                self.max_seq_len, tokenizer)
        self.sequences = SequenceFactory(self.vocab_size, self.max_seq_len, options.seed, tokenizer)
        self.sampling_step = SamplingStep(executor, self.scheduler, self.output_processor, self._finish)
        self.num_steps = 0  # steps that ran a batch
        self.num_step_tokens = 0  # tokens the last of them ran
        self.grammars = GrammarCompiler(self.engine.dir / "tokenizer.json", self.vocab_size,
                                        self.output_processor.eos_ids, options.constraint_limits)
        self.proposer = None
        if self.speculative is not None:
            self.proposer = make_proposer(self.speculative, self, options)

    def close(self) -> None:
        """Stops the worker ranks of a tensor-parallel engine now (they also stop when the
        engine is garbage-collected or the process exits)."""
        self.executor.close()
        if self.proposer is not None:
            self.proposer.close()
        self.sampling_step.close()
        self.grammars.close()

    @property
    def executor(self) -> Executor:
        return self.sampling_step.executor  # held in one place: the sampling step runs it

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
    def add_request(self, token_ids: list[int], params: SamplingParams, stream: bool = False,
                    grammars: list | None = None, group: int | None = None) -> list[Sequence]:
        """Queues one prompt; returns its `params.n` sequences (seeds seed, seed+1, ...).
        `grammars`: the constraint's n GrammarStates when the caller compiled them already
        (`self.grammars.submit(params)`, off this thread); else they are compiled here.
        `group`: the request these sequences belong to, for fair admission (several
        prompts of one API call share one; default: a group of their own)."""
        bad_words = self.sequences.check_params(params)
        seqs = [self.sequences.new(token_ids, params, i) for i in range(params.n)]
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
            batch = add_drafts(batch, self.proposer, self.scheduler, self.speculative, self.max_seq_len)
        self.num_step_tokens = sum(c.num_tokens for c in batch)
        updates = self.sampling_step.run(batch)
        self.num_steps += 1
        return updates

    # ---- scoring: a scheduler policy (ScoreState), run to completion ----
    def score(self, token_ids: Seq[Seq[int]], num_prefill: int | None = None) -> list[np.ndarray]:
        """Logits (len, vocab) at every position of each sequence, computed as the engine
        serves: the first `num_prefill` tokens in one prefill (chunked by max_num_tokens),
        each later token in its own decode step, all sequences batched together."""
        seqs = []
        for ids in token_ids:
            seq = self.sequences.new(list(ids), SamplingParams(), generates=False)
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
        # one block (a single prefill): the step's fresh array, rows of it, needs no copy
        return [s.score.logits[0] if len(s.score.logits) == 1 else np.concatenate(s.score.logits, axis=0)
                for s in seqs]

    def stats(self) -> EngineStats:
        s, b, sampling = self.scheduler, self.blocks, self.sampling_step
        return EngineStats(len(s.running), len(s.waiting), b.num_blocks, b.num_free, b.num_hit_tokens,
                           b.num_queried_tokens, s.num_preemptions, self.num_steps, sampling.num_draft_tokens,
                           sampling.num_accepted_tokens, self.num_step_tokens)
