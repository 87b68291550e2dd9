"""SamplingParams: what one request asks of the sampler and the stop checks (vLLM's fields).

Validated on construction, so a bad value is one InvalidOptionError (a 400 in the server)
before anything is queued.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bessemer.errors import InvalidOptionError

FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
INT_FIELDS = ("max_tokens", "top_k", "seed", "logprobs", "min_tokens", "n", "prompt_logprobs")
BOOL_FIELDS = ("include_stop_str_in_output", "skip_special_tokens")
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]
# Stop strings are searched in the text and bad words matched against the output at every
# step, on the engine thread that serves every request: their number and length are bounded
# so one request cannot slow every step (OpenAI allows 4 stop strings; these are generous).
MAX_STOP_STRINGS = 64
MAX_BAD_WORDS = 256
MAX_WORD_CHARS = 1024
MAX_TOKEN_IDS = 2**18  # logit_bias / allowed_token_ids entries: more than any vocabulary has


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
    # Logit controls (sampler.process_logits; ids are checked against the vocabulary when
    # the request is added to the engine)
    logit_bias: dict[int, float] | None = None  # {token id: value in [-100, 100]} added to the raw logits
    allowed_token_ids: list[int] | None = None  # only these may be sampled
    bad_words: list[str] | None = None  # words never generated (tokenized when the request is added)
    # Text
    include_stop_str_in_output: bool = False  # the text keeps the stop string (or stop token) that ended it
    skip_special_tokens: bool = True  # the text leaves out special tokens (EOS, chat markers)
    prompt_logprobs: int | None = None  # per prompt token: its logprob and the top-k (first token: None)
    # Structured output (at most one; runtime/structured.py): the text must match
    json_schema: dict | str | None = None  # a JSON schema ({"type": "object"}: any JSON object)
    regex: str | None = None  # a regular expression (the whole output)
    grammar: str | None = None  # a grammar: Lark, or GBNF/EBNF (`root ::= ...`)

    def __post_init__(self):
        # NaN passes every comparison below (NaN < 0 is False) and then poisons the sampler
        # inside a step shared with other requests: numbers are checked to be finite first
        for name in FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidOptionError(f"{name} must be a finite number, got {value!r}")
        for name in INT_FIELDS:
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InvalidOptionError(f"{name} must be an integer, got {value!r}")
        for name in BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidOptionError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidOptionError(f"seed must be in [0, 2^63), got {self.seed}")
        if any(s == "" for s in self.stop_strings):
            raise InvalidOptionError("stop strings must not be empty (an empty one would end every output at once)")
        _check_words("stop", self.stop_strings, MAX_STOP_STRINGS)
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidOptionError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise InvalidOptionError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidOptionError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise InvalidOptionError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        for name in ("logprobs", "prompt_logprobs"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise InvalidOptionError(f"{name} must be >= 0, got {getattr(self, name)}")
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
        self._check_logit_controls()
        constraints = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(constraints) > 1:
            raise InvalidOptionError(f"give at most one of json_schema, regex and grammar, got {' and '.join(constraints)}")

    def _check_logit_controls(self) -> None:
        """logit_bias, allowed_token_ids and bad_words: types and ranges (the vocabulary is
        the engine's to check)."""
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise InvalidOptionError("logit_bias must be a dict of token id -> bias, got a "
                                         f"{type(self.logit_bias).__name__}")
            _check_words("logit_bias", self.logit_bias, MAX_TOKEN_IDS)
            for token, bias in self.logit_bias.items():
                _check_token_id("logit_bias", token)
                if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias) \
                        or abs(bias) > MAX_LOGIT_BIAS:
                    raise InvalidOptionError(f"logit_bias of token {token} must be a number in "
                                             f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], got {bias!r}")
        if self.allowed_token_ids is not None:
            if not isinstance(self.allowed_token_ids, (list, tuple)) or not self.allowed_token_ids:
                raise InvalidOptionError("allowed_token_ids must be a non-empty list of token ids (an empty one "
                                         "allows nothing)")
            _check_words("allowed_token_ids", self.allowed_token_ids, MAX_TOKEN_IDS)
            for token in self.allowed_token_ids:
                _check_token_id("allowed_token_ids", token)
        if self.bad_words is not None:
            if not isinstance(self.bad_words, (list, tuple)):
                raise InvalidOptionError(f"bad_words must be a list of words, got a {type(self.bad_words).__name__}")
            for word in self.bad_words:
                if not isinstance(word, str) or not word.strip():
                    raise InvalidOptionError(f"bad_words must hold non-blank strings, got {word!r}")
            _check_words("bad_words", self.bad_words, MAX_BAD_WORDS)

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.grammar is not None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


def _check_token_id(field: str, token) -> None:
    if isinstance(token, bool) or not isinstance(token, int) or token < 0:
        raise InvalidOptionError(f"{field} holds {token!r}, which is not a token id (an integer >= 0)")


def _check_words(field: str, words, most: int) -> None:
    """At most `most` entries (strings: of at most MAX_WORD_CHARS characters)."""
    if len(words) > most:
        raise InvalidOptionError(f"{field} holds {len(words)} entries; at most {most} are allowed")
    longest = max((len(w) for w in words if isinstance(w, str)), default=0)
    if longest > MAX_WORD_CHARS:
        raise InvalidOptionError(f"{field} holds a string of {longest} characters; at most {MAX_WORD_CHARS} are allowed")
