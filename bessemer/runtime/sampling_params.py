"""SamplingParams: what one request asks of the sampler and the stop checks (vLLM's fields).

Validated on construction, so a bad value is one InvalidOptionError (a 400 in the server)
before anything is queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.errors import InvalidOptionError


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
    # Structured output (at most one; runtime/structured.py): the text must match
    json_schema: dict | str | None = None  # a JSON schema ({"type": "object"}: any JSON object)
    regex: str | None = None  # a regular expression (the whole output)
    grammar: str | None = None  # a grammar: Lark, or GBNF/EBNF (`root ::= ...`)

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
        constraints = [name for name in ("json_schema", "regex", "grammar") if getattr(self, name) is not None]
        if len(constraints) > 1:
            raise InvalidOptionError(f"give at most one of json_schema, regex and grammar, got {' and '.join(constraints)}")

    @property
    def constrained(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.grammar is not None

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
