"""SpeculativeConfig: how draft tokens are proposed, and how many per step.

    LLM(engine, speculative="ngram")                               # prompt lookup, k = 4
    LLM(engine, speculative={"method": "ngram", "num_tokens": 6, "ngram_max": 3})
    LLM(engine, speculative={"method": "draft", "draft_engine": "engines/smollm2-w4a16"})
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from bessemer.errors import InvalidOptionError

METHODS = ("ngram", "draft")
# The longest n-gram prompt lookup may search for. Matches longer than a few tokens add
# almost nothing (vLLM's prompt_lookup_max defaults to 5), while each extra length is one
# more filtering pass over the sequence's earlier occurrences in every step.
MAX_NGRAM = 64


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"  # "ngram": prompt lookup, no model; "draft": a draft engine
    num_tokens: int = 4  # k: draft tokens verified per target step
    ngram_max: int = 4  # ngram: the longest suffix looked up in the sequence's earlier tokens (<= MAX_NGRAM)
    ngram_min: int = 1  # ngram: the shortest
    draft_engine: str | None = None  # draft: the engine directory (same tokenizer as the target)

    def __post_init__(self):
        if self.method not in METHODS:
            raise InvalidOptionError(f"speculative method {self.method!r} is unknown; use one of {', '.join(METHODS)}")
        if not isinstance(self.num_tokens, int) or not 1 <= self.num_tokens <= 16:
            raise InvalidOptionError(f"speculative num_tokens must be an integer in 1..16, got {self.num_tokens!r}")
        for name, value in (("ngram_min", self.ngram_min), ("ngram_max (--ngram-max)", self.ngram_max)):
            if not isinstance(value, int) or not 1 <= value <= MAX_NGRAM:
                raise InvalidOptionError(f"speculative {name} must be an integer in 1..{MAX_NGRAM} (longer "
                                         f"n-grams rarely match and cost time every step), got {value!r}")
        if self.ngram_min > self.ngram_max:
            raise InvalidOptionError(f"ngram_min and ngram_max must satisfy ngram_min <= ngram_max, "
                                     f"got {self.ngram_min} and {self.ngram_max}")
        if (self.method == "draft") != (self.draft_engine is not None):
            raise InvalidOptionError("a draft engine goes with method 'draft' and only with it: pass "
                                     "--draft-engine DIR (speculative={'method': 'draft', 'draft_engine': DIR})")

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """None, a method name, a dict of fields, or a SpeculativeConfig."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            return cls(method=value)
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise InvalidOptionError(f"unknown speculative option {unknown[0]!r}; known: {', '.join(sorted(known))}")
            return cls(**value)
        raise InvalidOptionError(f"speculative must be a method name, a dict or a SpeculativeConfig, got {value!r}")
