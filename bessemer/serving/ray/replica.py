"""One engine replica: an AsyncLLM and serving/app.py's FastAPI app, driven one request at
a time over ASGI by the ingress (a RoutedCall in, the app's ASGI messages streamed out).

A plain class: application.py makes it a Ray Serve deployment, so importing this module
needs no Ray. A client that hangs up cancels the ingress's call; Ray cancels this
generator, which tells the app `http.disconnect`, and the app aborts the request's
sequences exactly as it does on one server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from bessemer.serving.ray.routing_key import RoutedCall

REPLICA_HEADER = b"x-bessemer-replica"
_APP_DONE = object()


class EngineReplica:
    def __init__(self, engine_dir: str, model_name: str | None = None, app_options: dict | None = None,
                 chat_template: str | None = None, engine_options: dict | None = None):
        """`app_options` go to serving.app.build_app (api_key, limits, metrics_prefix, cors,
        tool_call_parser); `engine_options` to AsyncLLM (num_threads, kv_cache_gib, ...)."""
        from ray import serve

        from bessemer.runtime.async_llm import AsyncLLM
        from bessemer.serving.app import build_app

        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.engine = AsyncLLM(engine_dir, **(engine_options or {}))
        if chat_template is not None:
            self.engine.llm.tokenizer.chat_template = chat_template
        self.app = build_app(self.engine, model_name or Path(engine_dir).resolve().name, **(app_options or {}))

    async def handle(self, call: RoutedCall) -> AsyncIterator[dict]:
        """Runs the app on one request, yielding its ASGI send messages; the replica's id is
        added to the response headers."""
        sent: asyncio.Queue = asyncio.Queue()
        disconnected = asyncio.Event()
        body = [{"type": "http.request", "body": call.body, "more_body": False}]

        async def receive() -> dict:
            if body:
                return body.pop()
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            await sent.put(message)

        task = asyncio.ensure_future(self.app(call.scope, receive, send))
        task.add_done_callback(lambda _: sent.put_nowait(_APP_DONE))
        try:
            while (message := await sent.get()) is not _APP_DONE:
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message.get("headers", []),
                                                      (REPLICA_HEADER, self.replica_id.encode())]}
                yield message
            task.result()
        finally:
            if not task.done():  # the caller went away: let the app abort its sequences, then stop it
                disconnected.set()
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout=5)
                except (Exception, asyncio.CancelledError):  # how it ended no longer matters to anyone
                    task.cancel()

    def check_health(self) -> None:
        """Ray calls this periodically and replaces a replica whose engine has failed."""
        problem = self.engine.failure()
        if problem:
            raise RuntimeError(problem)

    def __del__(self):  # Ray's graceful shutdown of a replica
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
