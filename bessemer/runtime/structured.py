"""Structured output: JSON schema, regex and grammar (Lark or GBNF/EBNF) constraints.

Backed by llguidance (needs the `structured` extra: `pip install llguidance`), a Rust
matcher with a NumPy bitmask API and no torch: the runtime stays torch-free. (xgrammar,
what vLLM and SGLang default to, installs here but requires and imports torch and
transformers.)

Compiling a constraint is runtime/grammar_compiler.py's job (bounded, off the engine
thread, crash-isolated). Per constrained sequence a GrammarState holds a matcher over the
tokens generated so far. Before each step the engine asks it for the allowed-token bitmask at every position
the step samples: one for a decode row, and after each draft token when speculating (the
matcher consumes the drafts, then rolls them back). The masks are computed on a worker
thread while the executor runs the step (the executor releases the GIL), so they cost
little of the step time. After sampling, the accepted tokens are consumed for good.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from bessemer.errors import RequestError
from bessemer.runtime.grammar_worker import first_line


class ConstraintError(RequestError):
    """The matcher of a running sequence failed (a parser limit, a grammar that admits no
    continuation): that sequence ends with finish_reason "error" and this message."""


class GrammarState:
    def __init__(self, matcher, words: int):
        self.matcher = matcher
        self.words = words
        self.masks: list[np.ndarray] = []  # this step's bitmasks, one per position sampled

    def compute_masks(self, drafts: list[int]) -> None:
        """Bitmasks (words,) int32 for the next token and after each draft token, up to the
        first draft the grammar refuses (a refused draft is always rejected, so no later
        position is sampled). None in place of a mask when the matcher failed or admits
        no token at all; `check` then says why."""
        self.masks = []
        consumed = 0
        for i in range(len(drafts) + 1):
            mask = np.empty(self.words, dtype=np.int32)
            self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            if self.matcher.is_error() or not mask.any():
                self.masks.append(None)
                break
            self.masks.append(mask)
            if i == len(drafts) or self.matcher.try_consume_tokens([drafts[i]]) != 1:
                break
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)

    def mask(self, i: int) -> np.ndarray:
        """The mask of position i of this step; ConstraintError when there is none."""
        mask = self.masks[i] if i < len(self.masks) else None
        if mask is None:
            self.check()
            raise ConstraintError("the constraint admits no further token; the output so far cannot be completed")
        return mask

    def accept(self, tokens: list[int]) -> None:
        """Consumes the tokens the step emitted (each was allowed by its mask)."""
        self.matcher.consume_tokens(tokens)
        self.check()

    def check(self) -> None:
        if self.matcher.is_error():
            raise ConstraintError(f"the constraint failed: {first_line(self.matcher.get_error())}")

    @property
    def finished(self) -> bool:
        """The constraint is complete: nothing but end-of-sequence may follow."""
        return self.matcher.is_stopped() and not self.matcher.is_error()


def apply_mask(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """logits: (vocab,); mask: (words,) int32 bitmask -> a copy with refused tokens at -inf."""
    allowed = np.unpackbits(mask.view(np.uint8), bitorder="little")[:logits.shape[0]].astype(bool)
    return np.where(allowed, logits, np.float32(-np.inf)).astype(np.float32, copy=False)


class MaskWorker:
    """Computes a step's masks on one background thread, overlapped with the executor."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bessemer-masks")

    def start(self, jobs: list[tuple[GrammarState, list[int]]]) -> Future:
        return self._pool.submit(_compute_all, jobs)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _compute_all(jobs: list[tuple[GrammarState, list[int]]]) -> None:
    for state, drafts in jobs:
        state.compute_masks(drafts)
