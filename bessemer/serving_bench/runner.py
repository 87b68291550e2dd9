"""Sends the prompts as vLLM's benchmark_serving does: request i leaves at the i-th arrival of
a Poisson process of `rate` requests/s (exponential gaps drawn with `seed`), or all at once
when the rate is infinite; with a concurrency cap a request that has arrived waits for a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable

import httpx
import numpy as np

from bessemer.serving_bench.client import RequestResult, http_error, send
from bessemer.serving_bench.target import Target, auth_headers
from bessemer.serving_bench.prompts import Prompt


@dataclass(frozen=True)
class Run:
    request_rate: float  # math.inf: all at once
    max_concurrency: int | None
    duration_s: float  # first departure to last answer, as vLLM's benchmark duration
    results: list[RequestResult]


def arrival_times(num: int, rate: float, seed: int) -> np.ndarray:
    """Seconds after the start at which each request leaves (the first at 0)."""
    if math.isinf(rate):
        return np.zeros(num)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, num)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def http_client(max_concurrency: int | None, timeout_s: float) -> httpx.AsyncClient:
    # httpx queues requests beyond its pool (100 by default) inside the client, where they would
    # count as server latency: the pool is as large as the load asks for
    limits = httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)


async def run(target: Target, prompts: list[Prompt], rate: float, max_concurrency: int | None, seed: int,
              timeout_s: float, progress: Callable[[str], None]) -> Run:
    leave = arrival_times(len(prompts), rate, seed)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    counts = {"done": 0, "failed": 0}
    step = max(1, len(prompts) // 10)

    async def one(http, i: int) -> RequestResult:
        await asyncio.sleep(max(0.0, start + leave[i] - time.perf_counter()))
        async with slots:
            result = await send(http, target, prompts[i])
        counts["done"] += 1
        counts["failed"] += not result.ok
        if counts["done"] % step == 0 or counts["done"] == len(prompts):
            elapsed = time.perf_counter() - start
            eta = elapsed / counts["done"] * (len(prompts) - counts["done"])
            progress(f"{counts['done']}/{len(prompts)} requests done ({counts['failed']} failed), "
                     f"{elapsed:.1f} s elapsed, ETA {eta:.0f} s")
        return result

    async with http_client(max_concurrency, timeout_s) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(http, i) for i in range(len(prompts))))
        duration = time.perf_counter() - start
    return Run(rate, max_concurrency, duration, list(results))


async def probe(target: Target, prompt: Prompt, timeout_s: float) -> RequestResult:
    """One request before the timed run, as vLLM's initial test run: a wrong URL, model or
    endpoint fails here with its reason, and the server's first-request costs are paid."""
    async with http_client(1, timeout_s) as http:
        return await send(http, target, prompt)


async def first_model(base_url: str, api_key: str | None, timeout_s: float) -> str:
    """The id of the first model GET /v1/models lists (what a server of one model serves)."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        r = await http.get(f"{base_url}/v1/models", headers=auth_headers(api_key))
        if r.status_code != 200:
            raise ValueError(http_error(r.status_code, r.text))
        return r.json()["data"][0]["id"]
