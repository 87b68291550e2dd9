"""CorsPolicy: which browser origins may call the server (`bessemer serve --allowed-origins`,
`--allowed-methods`, `--allowed-headers`, as vLLM's flags). No imports of the serving stack
at module level, so the CLI can check the flags before the engine loads.

With no origins (the default) the server sends no CORS headers at all, so browsers keep
pages of other origins from reading its answers. With origins, Starlette's CORSMiddleware
answers preflight OPTIONS requests itself (before the API key check: browsers send
preflights without credentials) and adds the headers to every answer. It is pure ASGI,
so the disconnect watch in app.py still reads `request.receive` directly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from bessemer.errors import InvalidOptionError

_ORIGIN = re.compile(r"\*|[a-z][a-z0-9+.-]*://[^/\s]+")  # scheme://host[:port], no path
_TOKEN = re.compile(r"\*|[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # an HTTP method or header name (RFC 9110 token)


@dataclass(frozen=True)
class CorsPolicy:
    allowed_origins: tuple[str, ...] = ()
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)

    @classmethod
    def from_flags(cls, origins: str | None, methods: str | None, headers: str | None) -> CorsPolicy:
        """Each flag a JSON list (vLLM's form) or a comma-separated list; None for its default."""
        default = cls()
        return cls(_parse("--allowed-origins", origins, _ORIGIN) if origins is not None else default.allowed_origins,
                   _parse("--allowed-methods", methods, _TOKEN) if methods is not None else default.allowed_methods,
                   _parse("--allowed-headers", headers, _TOKEN) if headers is not None else default.allowed_headers)

    def install(self, app) -> None:
        """Adds the middleware to `app` when any origin is allowed; call it last, so that
        it wraps the other middleware and every answer, errors included, carries it."""
        if not self.allowed_origins:
            return
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(self.allowed_origins),
                           allow_methods=list(self.allowed_methods), allow_headers=list(self.allowed_headers))


def _parse(flag: str, value: str, pattern: re.Pattern) -> tuple[str, ...]:
    text = value.strip()
    if text.startswith("["):
        try:
            items = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidOptionError(f"{flag} is not a valid JSON list ({e}); give a JSON list of strings or "
                                     "a comma-separated list") from None
        if not all(isinstance(item, str) for item in items):
            raise InvalidOptionError(f"{flag} must list strings, got {text[:80]}")
    else:
        items = text.split(",")
    # browsers send an origin without a trailing slash: "https://a.example/" would never match
    items = [item.strip().rstrip("/") if pattern is _ORIGIN else item.strip() for item in items if item.strip()]
    for item in items:
        if not pattern.fullmatch(item):
            what = "an origin such as https://example.com or *" if pattern is _ORIGIN else "an HTTP token or *"
            raise InvalidOptionError(f"{flag}: {item!r} is not {what}")
    return tuple(items)
