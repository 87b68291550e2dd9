"""GrammarCompiler: a request's constraint (JSON schema, regex, grammar) -> matchers, off the
engine thread and unable to crash the process.

Every compile runs on one thread of the compiler's own (with a stack sized for the limits,
runtime/grammar_worker.py), never on the engine thread, so a schema that takes a second to
compile pauses no stream; the server awaits it without blocking its event loop
(`submit` returns a Future). A constraint is checked against ConstraintLimits, then
compiled in the helper process (which may crash or hang alone: a 400), then compiled here
once and kept: later requests with the same text get deep copies of the kept matcher.
"""

from __future__ import annotations

import json
import queue
from collections import OrderedDict
from concurrent.futures import Future
from pathlib import Path

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.constraint_limits import ConstraintLimits
from bessemer.runtime.grammar_worker import GrammarWorker, compile_matcher, first_line, load_tokenizer, run_on_big_stack
from bessemer.runtime.structured import GrammarState

KEPT_GRAMMARS = 64  # compiled constraints kept for reuse (and refusals, so a repeat costs nothing)


# Between JSON tokens: nothing, one space, or a newline and up to 20 spaces/tabs of indent
# (compact and pretty-printed JSON both fit). llguidance's default, any run of whitespace,
# lets a sampled model spend its whole max_tokens on newlines inside a valid object. A
# schema's own "x-guidance" options still win (they apply after these defaults).
JSON_WHITESPACE = r"(?: |\n[ \t]{0,20})?"


def llguidance():
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
    """One per engine: the vocabulary as llguidance sees it (built once, ~1 s), the helper
    process and the kept grammars, all used from the compile thread only."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: set[int],
                 limits: ConstraintLimits | None = None):
        self.tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self.eos_ids = eos_ids
        self.limits = limits or ConstraintLimits()
        self.words = (vocab_size + 31) // 32  # int32 words per bitmask
        self._tokenizer = None
        self._worker = GrammarWorker(tokenizer_json, vocab_size, eos_ids)
        self._kept: OrderedDict[tuple[str, str], object] = OrderedDict()  # spec -> matcher, or RequestError
        self._jobs: queue.SimpleQueue | None = None

    def submit(self, params, count: int | None = None) -> Future:
        """A Future of `count` GrammarStates (default `params.n`; None when the request has
        no constraint), compiled on the compile thread; its exception is a RequestError naming
        the problem for a constraint that is too large or does not compile."""
        future: Future = Future()
        if grammar_spec(params) is None:
            future.set_result(None)
            return future
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            run_on_big_stack(self._serve, "bessemer-grammar-compile")
        self._jobs.put((params, count or params.n, future))
        return future

    def states(self, params, count: int | None = None) -> list[GrammarState] | None:
        """`submit(params, count)`, waited for."""
        return self.submit(params, count).result()

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)

    # ---- the compile thread ----
    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            params, count, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(self._states(params, count))
            except BaseException as e:  # noqa: BLE001 - handed to the waiter, the thread goes on
                future.set_exception(e)
        self._worker.close()

    def _states(self, params, count: int) -> list[GrammarState]:
        template = self._matcher(grammar_spec(params))
        return [GrammarState(template.deep_copy(), self.words) for _ in range(count)]

    def _matcher(self, spec: tuple[str, str]):
        kept = self._kept.get(spec)
        if kept is None:
            kept = self._compile(*spec)
            self._kept[spec] = kept
            if len(self._kept) > KEPT_GRAMMARS:
                self._kept.popitem(last=False)
        self._kept.move_to_end(spec)
        if isinstance(kept, RequestError):
            raise kept
        return kept

    def _compile(self, kind: str, text: str):
        """A matcher in its start state, or the RequestError that refuses the constraint."""
        llg = llguidance()
        try:
            self.limits.check(kind, text)
            tokenizer = self._lltokenizer(llg)  # before the helper, which loads the same file
            grammar = self._grammar(llg, kind, text)
            error = self._worker.check(grammar, self.limits.compile_timeout_s)
            matcher = None
            if not error:  # compiled in the helper on the same stack: safe to compile here
                matcher, error = compile_matcher(llg, tokenizer, grammar, self.words)
        except RequestError as e:
            return e
        if error:
            return RequestError(f"the {kind} constraint does not compile: {error}")
        return matcher

    @staticmethod
    def _grammar(llg, kind: str, text: str) -> str:
        """llguidance's grammar text of a constraint (not yet checked)."""
        try:
            if kind == "json_schema":
                return llg.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_pattern": JSON_WHITESPACE})
            if kind == "regex":
                return llg.LLMatcher.grammar_from_regex(text)
            return llg.grammar_from("grammar", text)  # Lark, or GBNF converted to Lark
        except (ValueError, RecursionError) as e:
            raise RequestError(f"the {kind} constraint does not compile: {first_line(e)}") from None

    def _lltokenizer(self, llg):
        if self._tokenizer is None:
            if not self.tokenizer_json.exists():
                raise RequestError("constrained decoding needs the engine's tokenizer.json; rebuild the engine "
                                   "from a checkpoint that has one")
            self._tokenizer = load_tokenizer(llg, self.tokenizer_json, self.vocab_size, self.eos_ids)
        return self._tokenizer
