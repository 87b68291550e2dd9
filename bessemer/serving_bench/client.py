"""One streamed request to an OpenAI-compatible server, timed as vLLM's benchmark_serving
times it: TTFT at the first chunk that carries output, one inter-token latency (ITL) per later
such chunk, E2E latency at the end of the stream. Output tokens come from the usage chunk
(`stream_options.include_usage`) when the server sends one, else one per chunk."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

from bessemer.serving_bench.prompts import Prompt
from bessemer.serving_bench.target import Target


@dataclass(frozen=True)
class RequestResult:
    ok: bool
    error: str = ""
    ttft_s: float = 0.0
    e2el_s: float = 0.0
    itl_s: tuple[float, ...] = field(default=(), repr=False)
    prompt_tokens: int = 0
    output_tokens: int = 0


def http_error(status: int, body: str) -> str:
    """One line: errors are printed as one `error:` line, and bodies hold newlines."""
    return f"HTTP {status}: {' '.join(body.split())[:200]}"


def carries_output(choice: dict) -> bool:
    """Whether a chunk's choice holds generated text: chat servers open with a role-only
    chunk and may close with an empty one, which are no tokens."""
    if "text" in choice:
        return bool(choice["text"])
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


async def send(http: httpx.AsyncClient, target: Target, prompt: Prompt) -> RequestResult:
    """Never raises for the server's or the network's failures: they are the result's `error`."""
    start = time.perf_counter()
    times: list[float] = []
    usage = None
    try:
        async with http.stream("POST", target.url, json=target.body(prompt), headers=target.headers) as r:
            if r.status_code != 200:
                return RequestResult(False, http_error(r.status_code, (await r.aread()).decode("utf-8", "replace")))
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:  # a stream that fails after its headers reports it this way
                    return RequestResult(False, f"stream error: {json.dumps(chunk['error'])[:200]}")
                if chunk.get("choices") and carries_output(chunk["choices"][0]):
                    times.append(time.perf_counter())
                usage = chunk.get("usage") or usage
    except (httpx.HTTPError, ValueError) as e:
        return RequestResult(False, " ".join(f"{type(e).__name__}: {e}".split())[:300])
    end = time.perf_counter()
    if not times:
        return RequestResult(False, "the stream carried no output")
    usage = usage or {}
    output = usage.get("completion_tokens", len(times))
    prompt_tokens = usage.get("prompt_tokens", prompt.num_tokens_hint)
    return RequestResult(True, "", times[0] - start, end - start,
                         tuple(b - a for a, b in zip(times, times[1:])), prompt_tokens, output)
