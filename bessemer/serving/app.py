"""The OpenAI-compatible HTTP app over one AsyncLLM, built by `build_app` (no module state).

Routes: POST /v1/completions, POST /v1/chat/completions (JSON, or SSE when `stream`),
/health, /metrics; the models, /tokenize, /detokenize and /version are utility_routes.py's.
Constrained output: `response_format` (json_object, json_schema) and vLLM's
guided_json/guided_regex/guided_grammar on both routes; `tools` on chat where the chat
template renders them: a forced call (tool_choice "required" or a named function) is
generated under the call's JSON schema, "auto" parses the calls in the format
`tool_call_parser` names (serving/tool_parsers.py); calls come back as OpenAI
`tool_calls`, streamed a name and argument fragments at a time. Every error is OpenAI's
JSON error shape with a 4xx status (503 while shutting down, 500 only for a bug). A
request's sequences are aborted, and their KV blocks freed, as soon as its client
disconnects.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations, and
# `Request` is imported inside build_app, where string annotations could not be resolved.
import asyncio
import dataclasses
import hmac
import time
import uuid

from bessemer.errors import BessemerError
from bessemer.runtime.async_llm import (AsyncLLM, EngineClosedError, EngineFailedError, RequestStream,
                                        SequenceFailedError)
from bessemer.serving import protocol as P
from bessemer.serving import sse as S
from bessemer.serving import tool_parsers
from bessemer.serving import utility_routes
from bessemer.serving.body import read_json
from bessemer.serving.cors import CorsPolicy
from bessemer.serving.drain import Drain
from bessemer.serving.limits import ServerLimits
from bessemer.serving.metrics import ServerMetrics
from bessemer.serving.streams import Collected, events

# How often the engine hands a non-streamed request's deltas to the event loop (they are
# read only once the request ends; the metrics count its tokens this much later): not at
# every token, since each hand-over wakes the loop, which then takes a core from the
# kernels' threads mid-step (runtime/async_llm.py, add_requests).
WHOLE_RESPONSE_DELIVERY_S = 0.05


def _shutting_down() -> P.ApiError:
    return P.ApiError(503, "the server is shutting down; the request was aborted", "server_error",
                      code="service_unavailable")


def build_app(engine: AsyncLLM, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None,
              metrics_prefix: str = "bessemer", drain: Drain | None = None, cors: CorsPolicy | None = None,
              tool_call_parser: str = "auto", stream_interval_s: float = 0.0):
    """`api_key` guards every route but /health; `limits` bound what one request may send
    (serving/limits.py; the defaults without one); `metrics_prefix` names the /metrics series
    ("bessemer" or "vllm", serving/metrics.py); once `drain` begins (SIGTERM, serving/drain.py)
    /health and new generation requests get 503; `cors` says which browser origins may call;
    `tool_call_parser` is the format of the model's own tool calls (tool_parsers.PARSER_NAMES);
    `stream_interval_s` > 0 sends a stream's tokens together at most that often (the first at
    once; each token's event unchanged, several in one write): fewer wake-ups of the event
    loop and the client, which share the cores with the kernels' threads."""
    if not stream_interval_s >= 0:
        raise ValueError(f"stream_interval_s must be >= 0, got {stream_interval_s}")
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="Bessemer", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics(model_name, engine.llm.max_seq_len, metrics_prefix)
    engine.step_listeners.append(metrics.engine_step)
    app.state.metrics = metrics  # the server's periodic stats line reads it (serving/stats_log.py)
    created = int(time.time())
    tokenizer = engine.llm.tokenizer
    limits = limits or ServerLimits()
    auto_calls = tool_parsers.pick_format(tool_call_parser, tokenizer.chat_template)
    drain = drain or Drain(limits.drain_timeout_s)

    def decode_token(token: int) -> str:
        return tokenizer.decode([token], skip_special_tokens=False)

    # ---- errors: always {"error": {...}} ----
    def error_response(e: P.ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(P.ApiError)
    async def api_error(request, e: P.ApiError):
        return error_response(e)

    @app.exception_handler(BessemerError)  # InvalidOptionError, RequestError: the request's fault
    async def bessemer_error(request, e: BessemerError):
        return error_response(P.ApiError(400, str(e)))

    @app.exception_handler(EngineClosedError)
    async def engine_closed(request, e):
        return error_response(_shutting_down())

    @app.exception_handler(EngineFailedError)
    async def engine_failed(request, e):
        return error_response(P.ApiError(503, str(e), "server_error"))

    @app.exception_handler(HTTPException)  # unknown route, wrong method
    async def http_error(request, e: HTTPException):
        return error_response(P.ApiError(e.status_code, str(e.detail)))

    @app.exception_handler(Exception)
    async def internal_error(request, e: Exception):
        return error_response(P.ApiError(500, f"internal error: {type(e).__name__}: {e}", "server_error"))

    # A dependency rather than middleware: BaseHTTPMiddleware would sit between the
    # endpoints and `request.receive`, which the disconnect watch below reads.
    def authorize(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise P.ApiError(401, "invalid or missing API key; send 'Authorization: Bearer KEY'",
                             code="invalid_api_key")

    def accepting() -> None:
        if drain.draining:  # the requests already running go on; a load balancer retries this one elsewhere
            raise P.ApiError(503, "the server is shutting down and takes no new requests; send the request to "
                                  "another replica, or retry once this one has restarted", "server_error",
                             code="service_unavailable")

    v1 = {"dependencies": [Depends(authorize)]}
    generation = {"dependencies": [Depends(authorize), Depends(accepting)]}

    # ---- plain routes ----
    @app.get("/health")
    async def health():
        problem = "the server is shutting down" if drain.draining else engine.failure()
        if problem:
            return error_response(P.ApiError(503, problem, "server_error"))
        return {"status": "ok"}

    utility_routes.register(app, engine, model_name, limits, v1["dependencies"], created)

    @app.get("/metrics", **v1)  # with --api-key, the counters are the key holder's too
    async def prometheus():
        return PlainTextResponse(metrics.render(engine.stats()), media_type="text/plain; version=0.0.4")

    # ---- generation ----
    async def read(request: Request, model: type):
        req = P.parse(model, await read_json(request, limits))  # 413 / 408 before anything parses it
        if req.n > limits.max_n:
            raise P.ApiError(400, f"n is {req.n} but this server allows at most {limits.max_n} completions "
                                  "per prompt (its --max-n)", param="n")
        P.check_model(req.model, model_name)
        return req

    async def start(prompts: list[list[int]], params, streamed: bool) -> list[RequestStream]:
        """Queues a request's prompts in one engine command (all or none)."""
        interval_s = stream_interval_s if streamed else WHOLE_RESPONSE_DELIVERY_S
        streams = await engine.add_requests(prompts, params, interval_s)
        for stream, ids in zip(streams, prompts):
            metrics.request_started(stream, len(ids), params)
        return streams

    def check_prompts(prompts: list[list[int]], max_tokens: int | None) -> None:
        total = sum(len(p) for p in prompts)
        if total > limits.max_prompt_tokens:
            raise P.ApiError(400, f"the request's prompts hold {total} tokens together, over this server's limit of "
                                  f"{limits.max_prompt_tokens} (--max-prompt-tokens); split the request", param="prompt")
        if max_tokens is not None:
            for ids in prompts:
                P.check_context(len(ids), max_tokens, engine.llm.max_seq_len)

    def head(rid: str, obj: str, choices: list, created: int | None = None, **extra) -> dict:
        return {"id": rid, "object": obj, "created": int(time.time()) if created is None else created,
                "model": model_name, "choices": choices, **extra}

    def finish(choice: dict, finish_reason: str | None, error: str | None) -> dict:
        """A choice's end: a constraint that failed ends it with finish_reason "error" and
        says why, in the OpenAI error shape."""
        choice["finish_reason"] = finish_reason
        if error is not None:
            choice["error"] = P.error_body(error, "constraint_error")["error"]
        return choice

    def request_id(req, prefix: str) -> str:
        return req.request_id or f"{prefix}-{uuid.uuid4().hex}"

    @app.post("/v1/completions", **generation)
    async def completions(request: Request):
        req: P.CompletionRequest = await read(request, P.CompletionRequest)
        texts = req.prompts()
        if len(texts) > limits.max_prompts:
            raise P.ApiError(400, f"the request has {len(texts)} prompts, over this server's limit of "
                                  f"{limits.max_prompts} (--max-prompts); split it", param="prompt")
        # tokenizing a long prompt takes seconds: off the event loop, so /health and the
        # other connections keep being served meanwhile
        for p in texts:
            if isinstance(p, str) and req.truncate_prompt_tokens is None:
                tokenizer.check_length(p, engine.llm.max_seq_len)
        prompts = await asyncio.to_thread(lambda: [
            req.truncate(tokenizer.encode(p) if isinstance(p, str) else p)
            for p in texts])
        check_prompts(prompts, req.max_tokens)
        # echo with logprobs: the prompt's tokens come back with their logprobs too
        echo_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
        params = req.sampling_params(req.max_tokens, req.logprobs, prompt_logprobs=echo_logprobs)
        streams = await start(prompts, params, req.stream)
        rid, num_prompt = request_id(req, "cmpl"), sum(len(p) for p in prompts)

        def logprobs(entries, token_ids, offset):
            if req.logprobs is None:
                return None
            return P.completion_logprobs(entries, token_ids, req.logprobs, decode_token, offset)

        def echoed(i: int) -> tuple[str, list[int]]:
            ids = prompts[i // params.n]
            return tokenizer.decode(ids, skip_special_tokens=False), ids

        def prompt_entries(prompt_logprobs, ids) -> list:
            # the first prompt token has no logprob (nothing before it): OpenAI sends null
            return [e if e is not None else {ids[0]: None} for e in prompt_logprobs]

        if req.stream:
            created = int(time.time())  # one for every chunk of the stream, as OpenAI's

            def chunk(choices: list, **extra) -> dict:
                return head(rid, "text_completion", choices, created, **extra)

            text_event = S.TextEvents(lambda i, text: chunk([{"index": i, "text": text, "logprobs": None,
                                                               "finish_reason": None}]))

            async def chunks():
                offsets: dict[int, int] = {}  # text_offset continues across chunks
                if req.echo:  # the prompt first, as its own chunk per choice
                    for i in range(len(prompts) * params.n):
                        text, _ = echoed(i)
                        offsets[i] = len(text)
                        yield text_event(i, text), 0
                async for i, d in events(streams, params.n, metrics):
                    if not d.logprobs and d.finish_reason is None:  # most tokens: text only
                        offsets[i] = offsets.get(i, 0) + len(d.text)
                        yield text_event(i, d.text), len(d.token_ids)
                        continue
                    lp = logprobs(d.logprobs, d.token_ids, offsets.get(i, 0)) if d.logprobs else None
                    offsets[i] = offsets.get(i, 0) + len(d.text)
                    choice = {"index": i, "text": d.text, "logprobs": lp}
                    yield S.event(chunk([finish(choice, d.finish_reason, d.error)])), len(d.token_ids)

            return sse(chunks(), streams, lambda u: chunk([], usage=u), num_prompt, req.include_usage)

        result = await until_disconnect(request, Collected.gather(streams, params.n, metrics))
        choices = []
        for i, c in enumerate(result.choices):
            text, entries, ids = c.text, c.logprobs, c.token_ids
            if req.echo:
                prompt_text, prompt_ids = echoed(i)
                text = prompt_text + text
                if echo_logprobs is not None:
                    entries, ids = prompt_entries(result.prompt_logprobs[i // params.n], prompt_ids) + entries, \
                        prompt_ids + ids
            choice = {"index": i, "text": text, "logprobs": logprobs(entries, ids, 0)}
            if req.prompt_logprobs is not None:
                choice["prompt_logprobs"] = P.prompt_logprobs_json(result.prompt_logprobs[i // params.n])
            choices.append(finish(choice, c.finish_reason, c.error))
        return head(rid, "text_completion", choices, usage=P.usage(num_prompt, result.num_output_tokens))

    @app.post("/v1/chat/completions", **generation)
    async def chat_completions(request: Request):
        req: P.ChatCompletionRequest = await read(request, P.ChatCompletionRequest)
        messages = req.template_messages()
        tokenizer.check_length("".join(m["content"] for m in messages if isinstance(m.get("content"), str)),
                               engine.llm.max_seq_len)
        # with tool_choice "none" a template that cannot render tools simply goes without them
        tools = req.template_tools() if req.tool_choice != "none" or tokenizer.supports_tools else None
        prompt = await asyncio.to_thread(tokenizer.encode_chat, messages, tools,
                                         req.add_generation_prompt, req.template_kwargs())
        prompt = req.truncate(prompt)
        check_prompts([prompt], req.max_completion_tokens or req.max_tokens)
        k = req.num_logprobs()
        forced = req.forced_call()  # "required" or a named function: the output is the call
        if forced is not None and req.response_format is not None and req.response_format.type != "text":
            raise P.ApiError(400, "response_format and a forced tool call (tool_choice) both constrain the output; "
                                  "give one of them", param="response_format")
        constraints = req.constraints() if req.tools and req.tool_choice != "none" and forced is None else []
        if constraints:
            raise P.ApiError(400, f"{constraints[0][0]} constrains the output, so the model could not call "
                                  "the tools it is given; send tool_choice 'none', or leave the constraint out",
                             param=constraints[0][0])
        params = req.sampling_params(req.max_new_tokens(len(prompt), engine.llm.max_seq_len), k, forced)
        parse_calls = bool(req.tools) and req.tool_choice != "none"
        call_format = tool_parsers.FORMATS["forced"] if forced is not None else auto_calls
        max_calls = 1 if req.parallel_tool_calls is False else None
        if parse_calls and any(tokenizer.is_special(marker) for marker in call_format.opens):
            # the format's marker is a special token (Mistral's [TOOL_CALLS]): the parser must see it, as in vLLM
            params = dataclasses.replace(params, skip_special_tokens=False)
        streams = await start([prompt], params, req.stream)
        rid, chunk = request_id(req, "chatcmpl"), "chat.completion.chunk"

        def logprobs(entries, token_ids):
            return None if k is None else P.chat_logprobs(entries, token_ids, k, decode_token)

        def message(text: str) -> tuple[dict, bool]:
            content, calls = tool_parsers.parse(text, call_format, max_calls) if parse_calls else (text, [])
            if calls:
                return {"role": "assistant", "content": content, "tool_calls": calls}, True
            return {"role": "assistant", "content": text}, False

        if req.stream:
            created = int(time.time())  # one for every chunk of the stream, as OpenAI's

            def chunk_of(choices: list, **extra) -> dict:
                return head(rid, chunk, choices, created, **extra)

            content_event = S.TextEvents(lambda i, text: chunk_of([{"index": i, "delta": {"content": text},
                                                                    "logprobs": None, "finish_reason": None}]))

            async def chunks():
                # OpenAI sends the role first, in a chunk of its own
                yield S.event(chunk_of([{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None} for i in range(params.n)])), 0
                parsers = {i: tool_parsers.CallStream(call_format, max_calls) for i in range(params.n)} \
                    if parse_calls else {}
                async for i, d in events(streams, params.n, metrics):
                    if d.text and not parse_calls and not d.logprobs and d.finish_reason is None:  # most tokens
                        yield content_event(i, d.text), len(d.token_ids)
                        continue
                    delta, reason = {"content": d.text} if d.text else {}, d.finish_reason
                    if parse_calls:  # content as it comes, calls a name and argument fragments at a time
                        delta = parsers[i].feed(d.text, final=d.finish_reason is not None).delta()
                        if reason is not None and d.error is None and parsers[i].num_complete:
                            reason = "tool_calls"
                    choice = {"index": i, "delta": delta,
                              "logprobs": logprobs(d.logprobs, d.token_ids) if d.logprobs else None}
                    yield S.event(chunk_of([finish(choice, reason, d.error)])), len(d.token_ids)

            return sse(chunks(), streams, lambda u: chunk_of([], usage=u), len(prompt), req.include_usage)

        result = await until_disconnect(request, Collected.gather(streams, params.n, metrics))
        choices = []
        for i, c in enumerate(result.choices):
            msg, called = message(c.text) if c.error is None else ({"role": "assistant", "content": c.text}, False)
            choice = {"index": i, "message": msg, "logprobs": logprobs(c.logprobs, c.token_ids)}
            choices.append(finish(choice, "tool_calls" if called else c.finish_reason, c.error))
        extra = {}
        if req.prompt_logprobs is not None:
            extra["prompt_logprobs"] = P.prompt_logprobs_json(result.prompt_logprobs[0])
        return head(rid, "chat.completion", choices, usage=P.usage(len(prompt), result.num_output_tokens), **extra)

    def sse(chunks, streams: list[RequestStream], usage_chunk, num_prompt_tokens: int, include_usage: bool):
        """`chunks` yields (the event's bytes, new token count); closing it (client gone) aborts.
        An event whose successor comes without waiting for the engine (the next delta is
        waiting in `streams`, or they all ended) goes out with it, in one write."""
        def successor_waits() -> bool:
            return not (any(s.ready for s in streams) or all(s.finished for s in streams))

        async def body():
            num_output, held = 0, []
            try:
                async for event, num_tokens in chunks:
                    num_output += num_tokens
                    held.append(event)
                    if successor_waits():
                        yield b"".join(held)
                        held.clear()
            except EngineClosedError:  # headers are out: report it the way OpenAI streams errors
                yield b"".join(held) + S.event(_shutting_down().body())
                return
            except SequenceFailedError as e:  # this request's own failure; the others go on
                yield b"".join(held) + S.event(P.error_body(str(e), 'server_error'))
                return
            finally:
                await chunks.aclose()
            if include_usage:
                held.append(S.event(usage_chunk(P.usage(num_prompt_tokens, num_output))))
            yield b"".join(held) + S.DONE

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    app.add_middleware(drain.middleware)
    (cors or CorsPolicy()).install(app)  # last: outermost, so that its headers reach every answer
    return app


async def until_disconnect(request, coro):
    """Awaits `coro`, cancelling it (and so aborting its sequences) if the client hangs up:
    a non-streaming response would otherwise compute on for nobody."""
    task = asyncio.ensure_future(coro)
    disconnected = False

    async def watch():
        nonlocal disconnected
        while (await request.receive())["type"] != "http.disconnect":
            pass
        disconnected = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if not disconnected:  # this handler itself was cancelled
            task.cancel()
            raise
        raise P.ApiError(499, "the client closed the connection") from None
    finally:
        watcher.cancel()
