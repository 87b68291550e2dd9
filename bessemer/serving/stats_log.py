"""A periodic stats line in the server log, worded as vLLM's so log searches carry over:

    Avg prompt throughput: 212.3 tokens/s, Avg generation throughput: 48.0 tokens/s,
    Running: 3 reqs, Waiting: 0 reqs, GPU KV cache usage: 4.2%, Prefix cache hit rate: 31.0%

A thread rather than an event-loop task: the app runs without a lifespan, and the line
must come out on time even while the loop is busy. It reads only what is safe from any
thread (the ServerMetrics counters, AsyncLLM.stats()). An idle server logs nothing: a line
comes only when an engine step ran or a token was counted since the last one.
"""

from __future__ import annotations

import logging
import threading
import time

from bessemer.runtime.async_llm import AsyncLLM, EngineStats
from bessemer.serving.metrics import ServerMetrics, kv_cache_usage


def stats_line(prompt_rate: float, generation_rate: float, stats: EngineStats) -> str:
    hit_rate = stats.num_hit_tokens / stats.num_queried_tokens if stats.num_queried_tokens else 0.0
    # running and waiting count sequences (a request with n=4 is 4), as the /metrics gauges do;
    # the hit rate is since start (vLLM's is over recent requests)
    return (f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, Avg generation throughput: "
            f"{generation_rate:.1f} tokens/s, Running: {stats.num_running} reqs, Waiting: {stats.num_waiting} reqs, "
            f"GPU KV cache usage: {kv_cache_usage(stats) * 100:.1f}%, Prefix cache hit rate: {hit_rate * 100:.1f}%")


class StatsLogger:
    """Logs `stats_line` every `interval` seconds at info on `logger` while started."""

    def __init__(self, metrics: ServerMetrics, engine: AsyncLLM, interval: float,
                 logger: logging.Logger | None = None):
        self.metrics, self.engine, self.interval = metrics, engine, interval
        self.logger = logger or logging.getLogger("uvicorn.error")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bessemer-stats-log", daemon=True)

    def start(self) -> StatsLogger:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _snapshot(self) -> tuple[float, int, int, int]:
        m = self.metrics
        return time.monotonic(), m.num_prompt_tokens, m.num_generation_tokens, self.engine.stats().num_steps

    def _run(self) -> None:
        last = self._snapshot()
        while not self._stop.wait(self.interval):
            now = self._snapshot()
            if now[1:] != last[1:]:
                elapsed = now[0] - last[0]
                self.logger.info(stats_line((now[1] - last[1]) / elapsed, (now[2] - last[2]) / elapsed,
                                            self.engine.stats()))
            last = now
