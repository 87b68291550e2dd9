"""One HTTP request's engine streams (one per prompt) as a single sequence of choices.

OpenAI numbers the choices of a request with several prompts and n samples each as
prompt_index * n + sample_index; `events` merges the streams in arrival order under that
numbering, records metrics, and aborts whatever is unfinished when it is closed (client
gone, error), which frees the KV blocks at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

from bessemer.runtime.async_llm import Delta, EngineClosedError, RequestStream
from bessemer.serving.metrics import ServerMetrics


async def events(streams: list[RequestStream], n: int, metrics: ServerMetrics) -> AsyncIterator[tuple[int, Delta]]:
    """Yields (choice index, delta). Raises EngineClosedError when the server shuts down."""
    merged = _merged(streams) if len(streams) > 1 else None
    try:
        if merged is None:  # one prompt (with its n samples): read directly, no task or queue hop per token
            stream = streams[0]
            async for item in stream:
                yield _checked(stream, item, metrics).index, item
        else:
            async for p, item in merged:
                yield p * n + _checked(streams[p], item, metrics).index, item
    finally:
        if merged is not None:
            await merged.aclose()  # its pump tasks end now, not when the generator is collected
        for s in streams:
            if not s.finished:
                metrics.aborted(s)
                s.abort()


def _checked(stream: RequestStream, item: Delta, metrics: ServerMetrics) -> Delta:
    metrics.observe(stream, item)
    if item.finish_reason == "abort":  # only close() sends these: the server is stopping
        raise EngineClosedError("the server is shutting down")
    return item


async def _merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, Delta]]:
    """(prompt index, delta) of several streams in arrival order; a stream's error is raised."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(p: int, stream: RequestStream) -> None:
        try:
            async for d in stream:
                queue.put_nowait((p, d))
        except Exception as e:  # noqa: BLE001 - re-raised by the consumer below
            queue.put_nowait((p, e))
        finally:
            queue.put_nowait((p, None))

    tasks = [asyncio.ensure_future(pump(p, s)) for p, s in enumerate(streams)]
    try:
        remaining = len(streams)
        while remaining:
            p, item = await queue.get()
            if item is None:
                remaining -= 1
                continue
            if isinstance(item, Exception):
                raise item
            yield p, item
    finally:
        for t in tasks:
            t.cancel()


@dataclass
class Choice:
    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None  # why a constraint ended it (finish_reason "error")

    @property
    def text(self) -> str:
        return "".join(self.texts)


@dataclass
class Collected:
    """A whole (non-streaming) response: the deltas joined per choice, exactly as a
    streaming client would join them."""

    choices: list[Choice]
    prompt_logprobs: dict[int, list] = field(default_factory=dict)  # prompt index -> its entries, if asked

    @property
    def num_output_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices)

    @classmethod
    async def gather(cls, streams: list[RequestStream], n: int, metrics: ServerMetrics) -> Collected:
        choices = [Choice() for _ in range(len(streams) * n)]
        prompt_logprobs: dict[int, list] = {}
        gen = events(streams, n, metrics)
        try:
            async for i, d in gen:
                c = choices[i]
                c.texts.append(d.text)
                c.token_ids += d.token_ids
                c.logprobs += d.logprobs or []
                c.finish_reason = d.finish_reason or c.finish_reason
                c.error = d.error or c.error
                if d.prompt_logprobs is not None:
                    prompt_logprobs[i // n] = d.prompt_logprobs
        finally:
            await gen.aclose()
        return cls(choices, prompt_logprobs)
