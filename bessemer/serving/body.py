"""Reading one request body within ServerLimits, before anything parses it: its size
(413, from Content-Length before a byte is read when the client sends one, else counted
while it arrives, so a chunked body is never buffered whole) and how long it may take to
arrive (408); `read_json` parses it.
"""

from __future__ import annotations

import asyncio
import json

from bessemer.serving.limits import ServerLimits
from bessemer.serving.protocol import ApiError


async def read_body(request, limits: ServerLimits) -> bytes:
    """The whole body, or ApiError 413 (too large) / 408 (too slow)."""
    too_large = ApiError(413, f"the request body is too large: this server takes at most {limits.max_body_bytes} "
                              "bytes (its --max-request-bytes); shorten the prompt", code="request_too_large")
    length = request.headers.get("content-length", "")
    if length and not length.isdigit():
        raise ApiError(400, "the Content-Length header is not a number")
    if length and int(length) > limits.max_body_bytes:
        raise too_large  # refused before a byte of it is read

    async def receive() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limits.max_body_bytes:  # chunked, or a Content-Length that lied
                raise too_large
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(receive(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {limits.body_timeout_s:g} s",
                       code="request_timeout") from None


async def read_json(request, limits: ServerLimits):
    """The body parsed as JSON (any value; the route's model checks its shape), or
    ApiError 413 / 408 as read_body, or 400 for JSON that does not parse."""
    raw = await read_body(request, limits)  # 413 / 408 before anything parses it
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON ({e})") from None
    except RecursionError:
        raise ApiError(400, "the request body's JSON is nested too deeply") from None
