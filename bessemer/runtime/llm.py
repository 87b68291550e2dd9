"""LLM: the public Python API, in the style of vLLM.

    llm = LLM("engines/smollm2")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=32, temperature=0))
    out[0].text, out[0].token_ids

The loop is scheduler.schedule() -> run_step(...) -> postprocess (sampling, stop checks).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

import numpy as np

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.engine import Engine
from bessemer.runtime.kv_cache import BlockManager, blocks_needed
from bessemer.runtime.model_runner import run_step, run_step_sampled
from bessemer.runtime.sampler import apply_penalties, sample, top_logprobs
from bessemer.runtime.scheduler import ScheduledChunk, Scheduler, Sequence
from bessemer.runtime.tokenizer import IncrementalDetokenizer, Tokenizer

DEFAULT_KV_CACHE_GIB = 1.0


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 or -1 = all tokens
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] | list[str] | str | None = None
    stop_token_ids: tuple[int, ...] | list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # top-k logprobs per generated token
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages tokens of the prompt and output
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    min_tokens: int = 0  # stop tokens are masked until this many tokens are generated
    n: int = 1  # completions per prompt (seeds seed, seed+1, ...)

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidOptionError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidOptionError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidOptionError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidOptionError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if self.logprobs is not None and self.logprobs < 0:
            raise InvalidOptionError(f"logprobs must be >= 0, got {self.logprobs}")
        if not 0 <= self.min_p <= 1:
            raise InvalidOptionError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise InvalidOptionError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not -2 <= self.presence_penalty <= 2 or not -2 <= self.frequency_penalty <= 2:
            raise InvalidOptionError("presence_penalty and frequency_penalty must be in [-2, 2]")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise InvalidOptionError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidOptionError(f"n must be a positive integer, got {self.n}")

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    metrics: dict = field(default_factory=dict)  # arrival/first/last token times (perf_counter)

    # vLLM keeps results under .outputs; the common single-sample case reads them directly.
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def logprobs(self):
        return self.outputs[0].logprobs

    @property
    def finish_reason(self):
        return self.outputs[0].finish_reason


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class LLM:
    def __init__(self, engine_dir: str | os.PathLike, num_threads: int | None = None,
                 kv_cache_gib: float | None = None, isa: str = "auto", verify_checksum: bool = True,
                 seed: int = 0, enable_prefix_caching: bool = True, tp_timeout_s: float = 30.0,
                 device: int | None = None, gpu_memory_utilization: float | None = None,
                 enforce_eager: bool = False, say: Callable[[str], None] | None = None):
        """A `--tp N` engine runs as N processes (runtime/tp.py): `num_threads` is per rank
        (default: the cores divided among the ranks); `tp_timeout_s` is how long a rank
        waits for a late peer inside a step before the engine stops with an error.
        A cuda engine runs on GPU `device` (default 0); its KV cache takes `kv_cache_gib`
        or `gpu_memory_utilization` of the GPU (targets/cuda/executor.py); `enforce_eager`
        turns CUDA graphs off; `say` receives load progress."""
        self.engine = Engine.load(engine_dir, verify_checksum=verify_checksum)
        self.tp_size = int(self.engine.config.get("mapping", {}).get("tp_size", 1))
        build = self.engine.build
        self.max_seq_len = int(build["max_seq_len"])
        self.max_num_tokens = int(build["max_num_tokens"])
        self.max_batch_size = int(build["max_batch_size"])
        self.block_size = int(build["kv_block_size"])
        if self.engine.config.get("target") == "cuda":
            from bessemer.targets.cuda.executor import CudaExecutor

            self.executor = CudaExecutor(self.engine, device or 0, kv_cache_gib, gpu_memory_utilization,
                                         enforce_eager, say)
            self.num_threads = 1
            self.num_kv_blocks = self.executor.num_kv_blocks
        else:
            if device is not None or gpu_memory_utilization is not None or enforce_eager:
                raise InvalidOptionError("--device, --gpu-memory-utilization and --enforce-eager apply to cuda "
                                         "engines; this engine's target is cpu")
            self._create_cpu_executor(num_threads, kv_cache_gib, isa, tp_timeout_s, verify_checksum)
        self.blocks = BlockManager(self.num_kv_blocks, self.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.blocks, self.max_num_tokens, self.max_batch_size)
        self.vocab_size = int(self.engine.header["plan"]["vocab_size"])
        self._tokenizer: Tokenizer | None = None
        self._eos_ids = self._find_eos_ids()
        self._seed = seed
        self._next_id = 0

    def _create_cpu_executor(self, num_threads, kv_cache_gib, isa, tp_timeout_s, verify_checksum) -> None:
        self.num_threads = num_threads or max(1, _default_threads() // self.tp_size)
        # Enough blocks for a full batch of full-length sequences, capped by the memory
        # budget, but never fewer than one full-length sequence needs.
        per_block = self.engine.kv_bytes_per_token() * self.block_size
        budget = int((kv_cache_gib if kv_cache_gib is not None else DEFAULT_KV_CACHE_GIB) * 2**30)
        one_seq = blocks_needed(self.max_seq_len, self.block_size)
        self.num_kv_blocks = max(one_seq, min(one_seq * self.max_batch_size, budget // per_block))
        if self.tp_size > 1:
            from bessemer.runtime import tp

            self.executor = tp.start(self.engine, self.num_threads, self.num_kv_blocks, isa, tp_timeout_s,
                                     verify_checksum, max_blocks=one_seq)
        else:
            self.executor = self.engine.create_executor(self.num_threads, self.num_kv_blocks, isa)

    def close(self) -> None:
        """Stops the worker ranks of a tensor-parallel engine now (they also stop when this
        LLM is garbage-collected or the process exits)."""
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    # ---- tokenizer ----
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = Tokenizer(self.engine.dir)
        return self._tokenizer

    def _find_eos_ids(self) -> set[int]:
        ids = set(self.engine.model.get("eos_token_id") or [])
        gen = self.engine.dir / "generation_config.json"
        if gen.exists():
            import json

            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if (self.engine.dir / "tokenizer.json").exists() and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    # ---- requests ----
    def _make_sequence(self, token_ids: list[int], params: SamplingParams, index: int = 0) -> Sequence:
        if not token_ids:
            raise RequestError("the prompt is empty; give at least one token")
        if len(token_ids) >= self.max_seq_len:
            raise RequestError(
                f"the prompt has {len(token_ids)} tokens but the engine allows {self.max_seq_len} "
                f"(prompt and output); shorten the prompt or rebuild with a larger --max-seq-len")
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestError(f"token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})")
        seed = params.seed + index if params.seed is not None else self._seed + self._next_id
        seq = Sequence(self._next_id, list(token_ids), len(token_ids), params,
                       np.random.default_rng(seed), arrival_time=time.perf_counter())
        self._next_id += 1
        return seq

    def _tokenize(self, prompts) -> list[tuple[str | None, list[int]]]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        out = []
        for p in prompts:
            if isinstance(p, str):
                out.append((p, self.tokenizer.encode(p)))
            else:
                out.append((None, [int(t) for t in p]))
        return out

    # ---- request lifecycle: add_request -> step()* -> finished (or abort) ----
    def add_request(self, token_ids: list[int], params: SamplingParams, stream: bool = False) -> list[Sequence]:
        """Queues one prompt; returns its `params.n` sequences (seeds seed, seed+1, ...)."""
        seqs = [self._make_sequence(token_ids, params, i) for i in range(params.n)]
        for seq in seqs:
            if stream or params.stop_strings:
                seq.detok = IncrementalDetokenizer(self.tokenizer)
            self.scheduler.add(seq)
        return seqs

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[tuple[Sequence, str]]:
        """Runs one engine step; returns (sequence, new text) for every sequence that got a
        token (text is "" when not streaming). Finished ones have `finish_reason` set."""
        batch = self.scheduler.schedule()
        if not batch:
            return []
        if getattr(self.executor, "samples_on_device", False) and all(self._device_samples(c) for c in batch):
            return self._postprocess(batch, None, run_step_sampled(self.executor, batch))
        logits = run_step(self.executor, batch)
        return self._postprocess(batch, logits)

    def _device_samples(self, chunk: ScheduledChunk) -> bool:
        """Whether the device sampler (temperature, top-k, top-p) gives this chunk's token: no
        penalties, min_p, logprobs, or min_tokens mask, which need the logits on the host."""
        p = chunk.seq.params
        return not chunk.completes or (
            p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and p.min_p == 0.0 and p.logprobs is None and len(chunk.seq.output_token_ids) >= p.min_tokens)

    def abort(self, seq: Sequence) -> None:
        """Cancels a queued or running sequence and returns its KV blocks."""
        if seq.finish_reason is None:
            self.scheduler.abort(seq)

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]], sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 on_delta: Callable[[int, str], None] | None = None) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids) as one batch; outputs in prompt order.
        `on_delta(i, text)` receives each prompt's new text as it is produced (streaming)."""
        items = self._tokenize(prompts)
        params = sampling_params or SamplingParams()
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        groups = [self.add_request(ids, p, stream=on_delta is not None) for (_, ids), p in zip(items, params_list)]
        index_of = {s.seq_id: i for i, g in enumerate(groups) for s in g}
        try:
            while self.has_unfinished():
                for seq, delta in self.step():
                    if on_delta and delta:
                        on_delta(index_of[seq.seq_id], delta)
        finally:  # an error mid-batch must not leak blocks
            for g in groups:
                for seq in g:
                    self.abort(seq)
        return [self.output(g, text) for g, (text, _) in zip(groups, items)]

    def _postprocess(self, batch: list[ScheduledChunk], logits: np.ndarray | None,
                     sampled: np.ndarray | None = None) -> list[tuple[Sequence, str]]:
        """logits [L, vocab] of the completing chunks (host sampling), or their tokens [L]
        already sampled on the device."""
        now = time.perf_counter()
        events = []
        row = 0
        for chunk in batch:
            seq = chunk.seq
            completes = chunk.completes
            self.scheduler.computed(chunk)
            if not completes:
                continue
            params = seq.params
            if sampled is not None:
                token = int(sampled[row])
            else:
                token = self._sample_on_host(seq, logits[row])
            row += 1
            seq.token_ids.append(token)
            seq.first_token_time = seq.first_token_time or now
            seq.last_token_time = now
            reason = self._stop_reason(seq, token)
            delta = ""
            if seq.detok is not None:
                out_ids = seq.output_token_ids
                if reason == "stop" and self._is_stop_token(seq, token):
                    out_ids = out_ids[:-1]  # the stop token is not part of the text
                delta = seq.detok.update(out_ids)
                text = seq.detok.text
                for stop in params.stop_strings:
                    cut = text.find(stop)
                    if cut >= 0:  # never leak the stop string, even across deltas
                        delta = delta[: max(0, len(delta) - (len(text) - cut))]
                        text, reason = text[:cut], "stop"
                        break
                seq.text = text
            if reason:
                self.scheduler.finish(seq, reason)
            events.append((seq, delta))
        return events

    def _sample_on_host(self, seq: Sequence, logits: np.ndarray) -> int:
        params = seq.params
        row_logits = apply_penalties(logits, seq.token_ids[:seq.num_prompt_tokens], seq.output_token_ids,
                                     params.repetition_penalty, params.presence_penalty, params.frequency_penalty)
        if len(seq.output_token_ids) < params.min_tokens:
            stops = [t for t in self._stop_ids(params) if t < len(row_logits)]
            row_logits = row_logits.copy() if row_logits is logits else row_logits
            row_logits[stops] = -np.inf
        token = sample(row_logits, params.temperature, params.top_k, params.top_p, seq.rng, params.min_p)
        if params.logprobs is not None:
            seq.logprobs.append(top_logprobs(logits, token, params.logprobs))
        return token

    def _stop_ids(self, params: SamplingParams) -> set[int]:
        return set(params.stop_token_ids or ()) | (set() if params.ignore_eos else self._eos_ids)

    def _is_stop_token(self, seq: Sequence, token: int) -> bool:
        return token in self._stop_ids(seq.params)

    def _stop_reason(self, seq: Sequence, token: int) -> str | None:
        if self._is_stop_token(seq, token) and len(seq.output_token_ids) > seq.params.min_tokens:
            return "stop"
        if len(seq.output_token_ids) >= seq.params.max_tokens or len(seq.token_ids) >= self.max_seq_len:
            return "length"
        return None

    def output(self, group: list[Sequence], prompt: str | None) -> RequestOutput:
        completions = []
        for i, seq in enumerate(group):
            ids = seq.output_token_ids
            text = seq.text
            if text is None:
                text = self.tokenizer.decode(ids) if (self.engine.dir / "tokenizer.json").exists() else ""
            completions.append(CompletionOutput(i, text, ids, seq.logprobs if seq.params.logprobs is not None else None,
                                                seq.finish_reason))
        first = group[0]
        metrics = {"arrival_time": first.arrival_time, "first_token_time": first.first_token_time,
                   "last_token_time": first.last_token_time}
        return RequestOutput(first.seq_id, prompt, first.token_ids[:first.num_prompt_tokens], completions, metrics)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params=None, on_delta=None) -> list[RequestOutput]:
        """Applies the checkpoint's chat template to one conversation or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        ids = [self.tokenizer.encode_chat(c) for c in conversations]
        return self.generate(ids, sampling_params, on_delta)

    def score(self, token_ids: Seq[Seq[int]], num_prefill: int | None = None) -> list[np.ndarray]:
        """Logits [len, vocab] at every position of each sequence, computed as the engine
        serves: the first `num_prefill` tokens in one prefill (chunked by max_num_tokens),
        each later token in its own decode step, all sequences batched together."""
        seqs = [self._make_sequence(list(ids), SamplingParams()) for ids in token_ids]
        for s in seqs:
            s.num_prompt_tokens = len(s.token_ids)
        results = {s.seq_id: [] for s in seqs}
        active = list(seqs)
        try:
            while active:
                batch = []
                budget = self.max_num_tokens
                for s in active[: self.max_batch_size]:
                    limit = num_prefill if (num_prefill and s.num_computed < num_prefill) else (
                        s.num_computed + 1 if num_prefill else len(s.token_ids))
                    n = min(limit, len(s.token_ids)) - s.num_computed
                    n = min(n, budget)
                    if n <= 0:
                        break
                    if not self.blocks.can_allocate(s.block_table, s.num_computed + n):
                        break
                    self.blocks.allocate(s.block_table, s.num_computed + n)
                    batch.append(ScheduledChunk(s, n))
                    budget -= n
                if not batch:
                    raise RequestError("sequences do not fit in the KV cache; score fewer at once")
                logits = run_step(self.executor, batch, all_logits=True)
                row = 0
                for c in batch:
                    results[c.seq.seq_id].append(logits[row: row + c.num_tokens])
                    row += c.num_tokens
                    c.seq.num_computed += c.num_tokens
                for s in [c.seq for c in batch if c.seq.num_computed == len(c.seq.token_ids)]:
                    active.remove(s)
                    self.blocks.free(s.block_table)
        finally:
            for s in active:
                self.blocks.free(s.block_table)
        return [np.concatenate(results[s.seq_id], axis=0) for s in seqs]
