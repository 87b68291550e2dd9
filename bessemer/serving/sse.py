"""The server-sent events of a streamed response, as the bytes that go on the wire.

Most chunks of a stream carry nothing but a piece of text for one choice, so `TextEvents`
formats those around a template made once per choice: the chunk's JSON split where the
text goes, the text escaped as json.dumps escapes a string. The bytes are exactly those of
`event(chunk)`, without building the chunk's dicts and dumping them at every token
(tests/test_serve_sse.py holds the two to each other).
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring  # json.dumps(text, ensure_ascii=False) of a str, without an encoder per call
from typing import Callable

DONE = b"data: [DONE]\n\n"

_MARK = "\x00bessemer text\x00"  # stands in for the text while the template is made


def event(chunk: dict) -> bytes:
    return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()


class TextEvents:
    """`events(index, text)`: the event of `chunk(index, text)`, the chunk of one response
    whose only choice `index` carries `text` and nothing else of its own."""

    def __init__(self, chunk: Callable[[int, str], dict]):
        self._chunk = chunk
        self._templates: dict[int, tuple[bytes, bytes] | None] = {}  # choice index -> (before, after) the text

    def __call__(self, index: int, text: str) -> bytes:
        try:
            template = self._templates[index]
        except KeyError:
            template = self._templates[index] = self._template(index)
        if template is None:
            return event(self._chunk(index, text))
        before, after = template
        return before + encode_basestring(text).encode() + after

    def _template(self, index: int) -> tuple[bytes, bytes] | None:
        parts = event(self._chunk(index, _MARK)).split(encode_basestring(_MARK).encode())
        # the mark once, where the text goes; a model name holding it leaves the slow path
        return (parts[0], parts[1]) if len(parts) == 2 else None
