"""Validation gates: an engine against HF transformers (fp32) on its own source checkpoint.

  perplexity  both score the same token windows (runtime/evaluate.py's protocol); the gate
              bounds the engine's relative increase in percent.
  greedy      both continue each prompt greedily for max_new_tokens with EOS ignored (so a
              stop never hides a later difference); a prompt agrees when every token matches.

Text and prompts are tokenized once, by the engine's tokenizer, and the same ids go to both.
The HF model of a checkpoint is loaded once per run and its results are reused by every
engine built from that checkpoint (a References object is owned by the run).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from bessemer.builder.hf_loader import load_hf_model
from bessemer.runtime.evaluate import hf_score_fn, perplexity, read_dataset, windows

Progress = Callable[[str], None]


class Reference:
    """HF transformers in fp32 for one checkpoint; loaded on first use, results memoised."""

    def __init__(self, model_dir: Path, threads: int | None):
        self.model_dir, self.threads = Path(model_dir), threads
        self._model = None
        self._results: dict[tuple, object] = {}

    def _torch_model(self):
        if self._model is None:
            from transformers.utils import logging as hf_logging

            # its per-weight progress bar would bury ours; restored after, as it was
            was_enabled = hf_logging.is_progress_bar_enabled()
            hf_logging.disable_progress_bar()
            try:
                self._model = load_hf_model(self.model_dir, "validation gates", self.threads)
            finally:
                if was_enabled:
                    hf_logging.enable_progress_bar()
        return self._model

    def score(self, group: list[list[int]]):
        return hf_score_fn(self._torch_model())(group)

    def perplexity(self, wins: list[list[int]]):
        key = ("ppl", hashlib.sha256(repr(wins).encode()).hexdigest())
        if key not in self._results:
            self._results[key] = perplexity(self.score, wins)
        return self._results[key]

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """argmax decoding, no EOS handling (the engine side ignores EOS too). Each step reruns
        the whole sequence: a few short prompts cost little, and no KV-cache API of a given
        transformers version is relied on."""
        key = ("greedy", tuple(prompt), max_new_tokens)
        if key not in self._results:
            import torch

            model, ids = self._torch_model(), list(prompt)
            with torch.no_grad():
                for _ in range(max_new_tokens):
                    ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            self._results[key] = ids[len(prompt):]
        return self._results[key]


class References:
    """One Reference per checkpoint directory, for the length of one ci-build run."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self._by_dir: dict[Path, Reference] = {}

    def get(self, model_dir: Path) -> Reference:
        key = Path(model_dir).resolve()
        if key not in self._by_dir:
            self._by_dir[key] = Reference(key, self.threads)
        return self._by_dir[key]


def check_perplexity(llm, ref: Reference, gate, say: Progress) -> dict:
    text = read_dataset(gate.dataset)
    wins = windows(llm.tokenizer.encode(text, add_special_tokens=False), gate.context_len, gate.max_tokens)
    ours = perplexity(llm.score, wins)
    theirs = ref.perplexity(wins)
    increase = 100.0 * (ours.perplexity / theirs.perplexity - 1.0)
    say(f"perplexity {ours.perplexity:.4f} vs HF {theirs.perplexity:.4f} ({increase:+.4f}%) "
        f"over {ours.scored_tokens} tokens; gate <= {gate.max_increase_pct}%")
    return {"dataset": gate.dataset.name, "context_len": gate.context_len, "scored_tokens": ours.scored_tokens,
            "engine_ppl": ours.perplexity, "hf_ppl": theirs.perplexity, "increase_pct": increase,
            "max_increase_pct": gate.max_increase_pct, "passed": bool(increase <= gate.max_increase_pct)}


def check_greedy(llm, ref: Reference, gate, say: Progress) -> dict:
    from bessemer.runtime.llm import SamplingParams

    prompts = [llm.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in gate.prompts]
    params = SamplingParams(max_tokens=gate.max_new_tokens, temperature=0, ignore_eos=True)
    ours = [o.token_ids for o in llm.generate(prompts, params)]
    theirs = [ref.greedy(p, gate.max_new_tokens) for p in prompts]
    # first differing position per prompt (None: identical), to tell a late drift from garbage
    first_diff = [next((i for i, (a, b) in enumerate(zip(o, t)) if a != b), None if len(o) == len(t) else
                       min(len(o), len(t))) for o, t in zip(ours, theirs)]
    agreement = sum(d is None for d in first_diff) / len(prompts)
    say(f"greedy agreement {agreement:.2f} on {len(prompts)} prompts x {gate.max_new_tokens} tokens; "
        f"gate >= {gate.min_agreement}")
    return {"prompts": len(prompts), "max_new_tokens": gate.max_new_tokens, "agreement": agreement,
            "first_difference": first_diff, "min_agreement": gate.min_agreement,
            "passed": bool(agreement >= gate.min_agreement)}


def run_gates(engine_dir: Path, spec, ref: Reference, threads: int | None, say: Progress) -> dict:
    """Results per gate ({} when the entry has none); errors (a prompt too long...) propagate."""
    if not (spec.perplexity or spec.greedy):
        return {}
    from bessemer.runtime.llm import LLM

    # Gates score short windows; a small KV pool (never below one full sequence) keeps the
    # job's memory near the engine's own size.
    llm = LLM(engine_dir, num_threads=threads, kv_cache_gib=0.25)
    results = {}
    if spec.perplexity:
        results["perplexity"] = check_perplexity(llm, ref, spec.perplexity, say)
    if spec.greedy:
        results["greedy"] = check_greedy(llm, ref, spec.greedy, say)
    return results
