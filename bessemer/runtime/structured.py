"""Structured output: JSON schema, regex and grammar (Lark or GBNF/EBNF) constraints.

Backed by llguidance (needs the `structured` extra: `pip install llguidance`), a Rust
matcher with a NumPy bitmask API and no torch: the runtime stays torch-free. (xgrammar,
what vLLM and SGLang default to, installs here but requires and imports torch and
transformers.)

Per constrained sequence a GrammarState holds a matcher over the tokens generated so
far. Before each step the engine asks it for the allowed-token bitmask at every position
the step samples: one for a decode row, and after each draft token when speculating (the
matcher consumes the drafts, then rolls them back). The masks are computed on a worker
thread while the executor runs the step (the executor releases the GIL), so they cost
little of the step time. After sampling, the accepted tokens are consumed for good.
"""

from __future__ import annotations

import json
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np

from bessemer.errors import InvalidOptionError, RequestError


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise InvalidOptionError("constrained decoding (json_schema, regex, grammar, response_format, tools) "
                                 "needs llguidance: pip install llguidance==1.9.1 "
                                 "(or pip install 'bessemer[structured]')") from None
    return llguidance


def grammar_spec(params) -> tuple[str, str] | None:
    """(kind, text) of a SamplingParams' constraint, or None; kind is json_schema, regex
    or grammar."""
    if params.json_schema is not None:
        schema = params.json_schema
        return "json_schema", schema if isinstance(schema, str) else json.dumps(schema)
    if params.regex is not None:
        return "regex", params.regex
    if params.grammar is not None:
        return "grammar", params.grammar
    return None


class GrammarCompiler:
    """One per engine: the vocabulary as llguidance sees it (built once, ~1 s) and
    compiled grammars, keyed by their text."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: set[int]):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self._tokenizer = None
        self._grammars: dict[tuple[str, str], str] = {}
        self.words = (vocab_size + 31) // 32  # int32 words per bitmask

    def _lltokenizer(self):
        if self._tokenizer is None:
            llg = _llguidance()
            if not self.tokenizer_json.exists():
                raise RequestError("constrained decoding needs the engine's tokenizer.json; rebuild the engine "
                                   "from a checkpoint that has one")
            eos = min(self.eos_ids) if self.eos_ids else None
            self._tokenizer = llg.LLTokenizer(self.tokenizer_json.read_text(), n_vocab=self.vocab_size, eos_token=eos)
        return self._tokenizer

    def state(self, params) -> GrammarState | None:
        """A fresh matcher for the request's constraint (None when it has none). Raises
        RequestError naming the problem for a schema, regex or grammar that does not compile."""
        spec = grammar_spec(params)
        if spec is None:
            return None
        llg = _llguidance()
        if spec not in self._grammars:
            kind, text = spec
            try:
                if kind == "json_schema":
                    grammar = llg.LLMatcher.grammar_from_json_schema(text)
                elif kind == "regex":
                    grammar = llg.LLMatcher.grammar_from_regex(text)
                else:
                    grammar = llg.grammar_from("grammar", text)  # Lark, or GBNF converted to Lark
            except ValueError as e:
                raise RequestError(f"the {kind} constraint does not compile: {_first_line(e)}") from None
            error = llg.LLMatcher.validate_grammar(grammar, self._lltokenizer())
            if error:
                raise RequestError(f"the {kind} constraint does not compile: {_first_line(error)}")
            self._grammars[spec] = grammar
        matcher = llg.LLMatcher(self._lltokenizer(), self._grammars[spec])
        if matcher.is_error():
            raise RequestError(f"the {spec[0]} constraint does not compile: {_first_line(matcher.get_error())}")
        return GrammarState(matcher, self.words)


class GrammarState:
    def __init__(self, matcher, words: int):
        self.matcher = matcher
        self.words = words
        self.masks: list[np.ndarray] = []  # this step's bitmasks, one per position sampled

    def compute_masks(self, drafts: list[int]) -> None:
        """Bitmasks (words,) int32 for the next token and after each draft token, up to the
        first draft the grammar refuses (a refused draft is always rejected, so no later
        position is sampled)."""
        self.masks = []
        consumed = 0
        for i in range(len(drafts) + 1):
            mask = np.empty(self.words, dtype=np.int32)
            self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            self.masks.append(mask)
            if i == len(drafts) or self.matcher.try_consume_tokens([drafts[i]]) != 1:
                break
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)

    def accept(self, tokens: list[int]) -> None:
        """Consumes the tokens the step emitted (each was allowed by its mask)."""
        self.matcher.consume_tokens(tokens)

    @property
    def finished(self) -> bool:
        """The constraint is complete: nothing but end-of-sequence may follow."""
        return self.matcher.is_stopped()


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


def _first_line(error) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "unknown error"
