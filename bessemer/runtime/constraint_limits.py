"""ConstraintLimits: how large a request's JSON schema, regex or grammar may be before
anything compiles it, and how long compiling it may take.

A constraint is a program the client writes for the server to compile: its size is bounded
here, with a message naming the limit (a 400), before it reaches llguidance. The bounds are
also what the compiler's stack is sized for (runtime/grammar_compiler.py): a Lark chain of
rules `r0: r1 | "x"`, `r1: r2 | "x"`, ... recurses once per rule while it compiles (about
3 KB of stack each: 3000 rules overflowed a default 8 MB thread), so the rule count is
bounded and the compile thread's stack holds well over that many. What still gets past the
bounds is compiled first in a helper process, which may crash alone.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from bessemer.errors import InvalidOptionError, RequestError

# a rule or terminal definition at the start of a line: Lark `name:` / `?name:` /
# `NAME.2:`, GBNF `name ::=`
_RULE = re.compile(r"^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_\-]*(\.-?\d+)?[ \t]*(::=|:)", re.MULTILINE)


@dataclass(frozen=True)
class ConstraintLimits:
    max_bytes: int = 256 * 1024  # the schema / regex / grammar text, UTF-8
    max_rules: int = 10_000  # rule and terminal definitions of a grammar
    max_schema_depth: int = 64  # nesting of a JSON schema document (objects and arrays)
    compile_timeout_s: float = 20.0  # for the helper process to compile it

    def __post_init__(self):
        for name in ("max_bytes", "max_rules", "max_schema_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidOptionError(f"{flag(name)} must be a positive integer, got {value!r}")
        if not 0 < self.compile_timeout_s < float("inf"):
            raise InvalidOptionError(f"{flag('compile_timeout_s')} must be a positive number of seconds, "
                                     f"got {self.compile_timeout_s!r}")

    def check(self, kind: str, text: str) -> None:
        """Raises RequestError naming the limit a constraint of `kind` (json_schema, regex,
        grammar) exceeds; `text` is what will be compiled."""
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.max_bytes:
            raise RequestError(f"the {kind} constraint is {size} bytes, over this server's limit of {self.max_bytes} "
                               f"({flag('max_bytes')}); send a smaller one")
        if kind == "grammar":
            rules = len(_RULE.findall(text))
            if rules > self.max_rules:
                raise RequestError(f"the grammar defines {rules} rules, over this server's limit of {self.max_rules} "
                                   f"({flag('max_rules')}); send a smaller grammar")
        elif kind == "json_schema":
            try:
                schema = json.loads(text)
            except ValueError as e:
                raise RequestError(f"the json_schema constraint is not valid JSON ({e})") from None
            depth = json_depth(schema)
            if depth > self.max_schema_depth:
                raise RequestError(f"the JSON schema is nested {depth} levels deep, over this server's limit of "
                                   f"{self.max_schema_depth} ({flag('max_schema_depth')}); flatten the schema")


def flag(name: str) -> str:
    """The `bessemer serve` flag of a limit."""
    return "--" + {"max_bytes": "max-constraint-bytes", "max_rules": "max-grammar-rules",
                   "max_schema_depth": "max-schema-depth", "compile_timeout_s": "constraint-timeout"}[name]


def json_depth(value) -> int:
    """Nesting depth of a parsed JSON document (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
