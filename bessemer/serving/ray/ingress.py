"""The ingress: the HTTP side of the replicas, with no engine of its own.

Every request is forwarded whole to one replica (RoutedCall, keyed by its prompt's prefix)
and the replica's response streamed back as it comes. A replica that dies before it sent
anything has its request retried once on another (generation had not reached the client);
one that dies mid-response ends the stream with an error event (SSE) or a 503.
/health and /metrics ask every replica and answer for all of them (/metrics: those that
answered, each sample labelled with its replica).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from starlette.responses import JSONResponse, PlainTextResponse, Response

from bessemer.serving.api_error import error_body
from bessemer.serving.body import read_body
from bessemer.serving.limits import ServerLimits
from bessemer.serving.protocol import ApiError
from bessemer.serving.ray.merged_metrics import merge_metrics
from bessemer.serving.ray.replica import REPLICA_HEADER
from bessemer.serving.ray.routing_key import RoutedCall, prefix_hashes, prompt_text

# what a replica's app reads of the ASGI scope (the rest, e.g. the proxy's state, stays here)
_SCOPE_KEYS = ("type", "asgi", "http_version", "method", "scheme", "path", "raw_path", "root_path",
               "query_string", "headers", "client", "server")
_FAN_OUT_TIMEOUT_S = 5.0


def _replica_lost(e: Exception) -> str:
    return f"the replica serving this request stopped ({type(e).__name__}); retry the request"


class Ingress:
    def __init__(self, engine, num_replicas: int, limits: ServerLimits):
        """`engine`: a handle to the EngineReplica deployment; `num_replicas`: how many the
        fan-out asks (the deployment's count); `limits`: the replicas' ServerLimits, whose
        body size and time bounds the ingress applies while it reads a body (413 / 408 before
        a byte is forwarded, and a body it refuses is never buffered whole here)."""
        self.engine = engine.options(stream=True)
        self.num_replicas = num_replicas
        self.limits = limits

    async def __call__(self, request) -> Response:
        scope = {k: request.scope[k] for k in _SCOPE_KEYS if k in request.scope}
        scope["asgi"] = {"version": "3.0", "spec_version": "2.3"}  # 2.3: the app listens for disconnects
        try:
            body = await read_body(request, self.limits)
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        path = scope["path"]
        if path in ("/health", "/metrics") and scope["method"] == "GET":
            answers = await self._fan_out(RoutedCall(scope, body))
            if path == "/health":
                return JSONResponse(*_health(answers, self.num_replicas))
            texts = {replica: text for replica, (status, text) in answers.items() if status == 200}
            if not texts:  # e.g. 401 without the API key: every replica says the same
                status, text = next(iter(answers.values()))
                return PlainTextResponse(text, status_code=status)
            return PlainTextResponse(merge_metrics(texts), media_type="text/plain; version=0.0.4")
        return _Forwarded(self.engine, RoutedCall(scope, body, prefix_hashes(prompt_text(path, body))))

    async def _fan_out(self, call: RoutedCall) -> dict[str, tuple[int, str]]:
        """Each replica's (status, body), by replica id."""
        async def ask(i: int):
            status, replica, chunks = 503, f"#{i}", []
            try:
                async for m in self.engine.handle.remote(dataclasses.replace(call, pin=i)):
                    if m["type"] == "http.response.start":
                        status = m["status"]
                        replica = dict(m["headers"]).get(REPLICA_HEADER, replica.encode()).decode()
                    else:
                        chunks.append(m.get("body", b""))
            except Exception as e:  # a replica that cannot answer is unhealthy, not an ingress error
                return replica, (503, f"{type(e).__name__}: {e}")
            return replica, (status, b"".join(chunks).decode())

        # One at a time: Ray's router tells a request's calls apart by the id of the HTTP
        # request that made them, so concurrent calls from one request would be confused.
        answers = {}
        for i in range(self.num_replicas):
            try:
                replica, answer = await asyncio.wait_for(ask(i), _FAN_OUT_TIMEOUT_S)
            except asyncio.TimeoutError:
                replica, answer = f"#{i}", (503, f"no answer within {_FAN_OUT_TIMEOUT_S:g} s")
            answers[replica] = answer  # pins wrap around while fewer replicas run: that one answers once
        return answers


def _health(answers: dict[str, tuple[int, str]], expected: int) -> tuple[dict, int]:
    """200 "ok" when every replica is healthy, 200 "degraded" when some are (the endpoint
    still serves), 503 when none is."""
    healthy = [r for r, (status, _) in answers.items() if status == 200]
    replicas = {r: "ok" if status == 200 else text for r, (status, text) in answers.items()}
    if not healthy:
        return {"status": "unavailable", "replicas": replicas, "expected": expected}, 503
    status = "ok" if len(healthy) >= expected else "degraded"
    return {"status": status, "replicas": replicas, "expected": expected}, 200


class _Forwarded(Response):
    """A response that relays one replica's ASGI messages (Ray Serve sends a Response it is
    given by calling it; Response's own fields are never used)."""

    def __init__(self, engine, call: RoutedCall):  # no super().__init__: there is no body to render
        self.engine, self.call = engine, call
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        import ray.exceptions

        lost = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        for attempt in range(2):
            stream = self.engine.handle.remote(self.call)
            started = sse = False
            try:
                async for message in stream:
                    if message["type"] == "http.response.start":
                        started = True
                        sse = dict(message.get("headers", [])).get(b"content-type", b"").startswith(
                            b"text/event-stream")
                    await send(message)
                return
            except lost as e:
                if not started and attempt == 0:
                    continue  # nothing reached the client: the other replica takes it
                await _send_lost(send, started, sse, _replica_lost(e))
                return
            finally:
                stream.cancel()  # the client went away (or we are done): the replica aborts the request


async def _send_lost(send, started: bool, sse: bool, why: str) -> None:
    error = error_body(why, "server_error")
    if not started:
        body = json.dumps(error).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    elif sse:  # headers are out: report it the way the app streams errors
        await send({"type": "http.response.body", "body": f"data: {json.dumps(error)}\n\n".encode(),
                    "more_body": False})
    else:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
