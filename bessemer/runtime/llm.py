"""LLM: the public Python API, in the style of vLLM.

    llm = LLM("engines/smollm2")
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=32, temperature=0))
    out[0].text, out[0].token_ids

A thin facade: prompts in (text, token ids, chat messages), RequestOutputs out. The work
is LLMEngine's (runtime/llm_engine.py): scheduler.schedule() -> sampling_step.run(batch).
"""

from __future__ import annotations

import os
from typing import Callable, Sequence as Seq

import numpy as np

from bessemer.errors import InvalidOptionError
from bessemer.runtime.llm_engine import LLMEngine
from bessemer.runtime.outputs import CompletionOutput, RequestOutput  # noqa: F401 - public names
from bessemer.runtime.sampling_params import SamplingParams
from bessemer.runtime.sequence import Sequence
from bessemer.targets import RunOptions  # noqa: F401 - a public name, with LLM


def _read_through(name: str) -> property:
    return property(lambda self: getattr(self.llm_engine, name), doc=f"The engine core's `{name}`.")


class LLM:
    def __init__(self, engine_dir: str | os.PathLike | None = None, *, model: str | os.PathLike | None = None,
                 build_config=None, engine_cache: str | os.PathLike | None = None,
                 options: RunOptions | None = None, **run_options):
        """How the engine runs: `options` (a RunOptions, targets/__init__.py), or its fields as
        keyword arguments: `num_threads` (per rank of a `--tp N` engine, which runs as N
        processes: default the cores divided among the ranks), `kv_cache_gib`, `isa`,
        `verify_checksum`, `seed`, `enable_prefix_caching`, `tp_timeout_s` (how long a rank
        waits for a late peer inside a step before the engine stops with an error),
        `speculative` ("ngram", or a dict / SpeculativeConfig: method, num_tokens,
        ngram_min/max, draft_engine; runtime/speculative/config.py), `device` (a cuda
        engine's GPU, default 0), `gpu_memory_utilization` (its KV cache's share of the GPU,
        or `kv_cache_gib`), `enforce_eager` (no CUDA graphs), `say` (receives load
        progress), `interpret` (a cuda engine on CPU through the Triton interpreter: slow;
        for tests and debugging without a GPU), `constraint_limits` (bounds on the JSON
        schemas, regexes and grammars of requests: runtime/constraint_limits.py).

        `model` (as vLLM's; or positionally, as `engine_dir`) may also be a HF checkpoint
        directory or a hub id: it is built once with `build_config` (a BuildConfig; None:
        the defaults) into the engine cache `engine_cache` (default: BESSEMER_CACHE or
        ~/.cache/bessemer, then engines/) and reused afterwards (builder/engine_cache.py).
        An engine directory loads as it is and takes no `build_config`."""
        if engine_dir is not None and model is not None:
            raise InvalidOptionError("pass the engine or checkpoint once: LLM(path) or LLM(model=path), not both")
        if engine_dir is None and model is None:
            raise InvalidOptionError("LLM needs an engine directory, a HF checkpoint directory or a hub id: "
                                     "LLM(model=path)")
        if options is not None and run_options:
            raise InvalidOptionError(f"pass run options as options=RunOptions(...) or as keyword arguments, not both "
                                     f"(got options and {', '.join(sorted(run_options))})")
        options = options if options is not None else RunOptions.of(**run_options)
        from bessemer.builder.engine_cache import resolve_engine

        engine_dir = resolve_engine(model if model is not None else engine_dir, build_config, engine_cache, options.say)
        self.llm_engine = LLMEngine(engine_dir, options)

    def close(self) -> None:
        """Stops the worker ranks of a tensor-parallel engine now (they also stop when this
        LLM is garbage-collected or the process exits)."""
        self.llm_engine.close()

    # ---- what the engine core holds, read through ----
    engine = _read_through("engine")  # the loaded Engine (config, header)
    executor = _read_through("executor")
    scheduler = _read_through("scheduler")
    blocks = _read_through("blocks")
    tokenizer = _read_through("tokenizer")
    tp_size = _read_through("tp_size")
    max_seq_len = _read_through("max_seq_len")
    max_num_tokens = _read_through("max_num_tokens")
    max_batch_size = _read_through("max_batch_size")
    block_size = _read_through("block_size")
    vocab_size = _read_through("vocab_size")
    num_threads = _read_through("num_threads")
    num_kv_blocks = _read_through("num_kv_blocks")

    @property
    def num_preemptions(self) -> int:
        return self.llm_engine.scheduler.num_preemptions

    # ---- request lifecycle: add_request -> step()* -> finished (or abort) ----
    def add_request(self, token_ids: list[int], params: SamplingParams, stream: bool = False) -> list[Sequence]:
        """Queues one prompt; returns its `params.n` sequences (seeds seed, seed+1, ...)."""
        return self.llm_engine.add_request(token_ids, params, stream)

    def has_unfinished(self) -> bool:
        return self.llm_engine.has_unfinished()

    def step(self) -> list[tuple[Sequence, str]]:
        """Runs one engine step; returns (sequence, new text) for every sequence that got a
        token (text is "" when not streaming). Finished ones have `finish_reason` set."""
        return [(u.seq, u.text) for u in self.llm_engine.step()]

    def abort(self, seq: Sequence) -> None:
        """Cancels a queued or running sequence and returns its KV blocks."""
        self.llm_engine.abort(seq)

    def generate(self, prompts: str | Seq[str] | Seq[Seq[int]], sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
                 on_delta: Callable[[int, str], None] | None = None) -> list[RequestOutput]:
        """Generates for every prompt (text or token ids) as one batch; outputs in prompt order.
        `on_delta(i, text)` receives each prompt's new text as it is produced (streaming)."""
        items = self._tokenize(prompts)
        params = sampling_params or SamplingParams()
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(items)
        if len(params_list) != len(items):  # zip would drop prompts without a word
            raise InvalidOptionError(f"{len(items)} prompts but {len(params_list)} sampling params; give one "
                                     "SamplingParams for all prompts or one per prompt")
        groups = []
        try:
            for _, ids in items:  # a prompt refused here leaves none of the others queued
                groups.append(self.add_request(ids, params_list[len(groups)], stream=on_delta is not None))
            index_of = {s.seq_id: i for i, g in enumerate(groups) for s in g}
            while self.has_unfinished():
                for update in self.llm_engine.step():
                    if on_delta and update.text:
                        on_delta(index_of[update.seq.seq_id], update.text)
        finally:  # an error mid-batch must not leak blocks
            for g in groups:
                for seq in g:
                    self.abort(seq)
        return [self.output(g, text) for g, (text, _) in zip(groups, items)]

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params=None, on_delta=None) -> list[RequestOutput]:
        """Applies the checkpoint's chat template to one conversation or a list of them."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        ids = [self.tokenizer.encode_chat(c) for c in conversations]
        return self.generate(ids, sampling_params, on_delta)

    def score(self, token_ids: Seq[Seq[int]], num_prefill: int | None = None) -> list[np.ndarray]:
        """Logits [len, vocab] at every position of each sequence, computed as the engine
        serves: the first `num_prefill` tokens in one prefill (chunked by max_num_tokens),
        each later token in its own decode step, all sequences batched together."""
        return self.llm_engine.score(token_ids, num_prefill)

    def output(self, group: list[Sequence], prompt: str | None) -> RequestOutput:
        return self.llm_engine.output_processor.request_output(group, prompt)

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

