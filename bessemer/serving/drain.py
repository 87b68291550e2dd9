"""Drain: the graceful part of a shutdown, one per server (serving/server.py drives it).

On SIGTERM the server does not stop listening at once: a load balancer must first see
`/health` turn 503 and move traffic away, and requests already running should get their
whole answer. So, from the signal on:

- `/health` and new generation requests answer 503 (app.py reads `draining`);
- the HTTP requests that arrived before the signal run on, for up to `timeout_s`
  (counted by `middleware`, which wraps the whole app: a streamed answer counts until
  its last byte is sent, not only until its handler returns);
- then the server aborts what is left (engine.close()), stops listening and exits 0.

A second signal ends the wait at once (`stop_waiting`).
"""

from __future__ import annotations

import asyncio
import time


class Drain:
    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.draining = False
        self._started_at: float | None = None
        self._stop_waiting = False
        self._num_running = 0  # HTTP requests that arrived before the drain began

    def begin(self) -> None:
        """Turns /health and new generation requests into 503s. Only sets flags, so a
        signal handler may call it; idempotent (the timeout runs from the first call)."""
        if self._started_at is None:
            self._started_at = time.monotonic()
        self.draining = True

    def stop_waiting(self) -> None:
        """A second signal: abort the running requests now rather than at the timeout."""
        self._stop_waiting = True

    @property
    def num_running(self) -> int:
        return self._num_running

    async def wait(self) -> int:
        """Begins the drain if no signal did, and returns once the requests that arrived
        before it are done, or `timeout_s` after it began, or after stop_waiting(): how
        many are still running (the caller aborts them)."""
        self.begin()
        deadline = self._started_at + self.timeout_s
        # polled, as uvicorn polls its connections: the counter has no waiters to wake
        while self._num_running and not self._stop_waiting and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self._num_running

    def middleware(self, app):
        """`app` wrapped in a pure ASGI layer that counts the HTTP requests arriving before
        the drain until each one's answer is sent."""
        drain = self

        async def counted(scope, receive, send):
            if scope["type"] != "http" or drain.draining:
                return await app(scope, receive, send)
            drain._num_running += 1
            try:
                return await app(scope, receive, send)
            finally:
                drain._num_running -= 1

        return counted
