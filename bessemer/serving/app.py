"""The OpenAI-compatible HTTP app over one AsyncLLM, built by `build_app` (no module state).

Routes: POST /v1/completions, POST /v1/chat/completions (JSON, or SSE when `stream`), GET
/v1/models, /health, /metrics. Constrained output: `response_format` (json_object,
json_schema) and vLLM's guided_json/guided_regex/guided_grammar on both routes; `tools` on
chat where the chat template renders them: a forced call (tool_choice "required" or a
named function) is generated under the call's JSON schema, "auto" parses Hermes-style
<tool_call> blocks; calls come back as OpenAI `tool_calls`. Every error is OpenAI's JSON error shape with a 4xx status
(503 while shutting down, 500 only for a bug). A request's sequences are aborted, and their
KV blocks freed, as soon as its client disconnects.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations, and
# `Request` is imported inside build_app, where string annotations could not be resolved.
import asyncio
import hmac
import json
import time
import uuid

from bessemer.errors import BessemerError
from bessemer.runtime.async_llm import (AsyncLLM, EngineClosedError, EngineFailedError, RequestStream,
                                        SequenceFailedError)
from bessemer.serving import protocol as P
from bessemer.serving.body import read_body
from bessemer.serving.limits import ServerLimits
from bessemer.serving.metrics import ServerMetrics
from bessemer.serving.streams import Collected, events

def _shutting_down() -> P.ApiError:
    return P.ApiError(503, "the server is shutting down; the request was aborted", "server_error",
                      code="service_unavailable")


def build_app(engine: AsyncLLM, model_name: str, api_key: str | None = None, limits: ServerLimits | None = None):
    """`api_key` guards every route but /health; `limits` bound what one request may send
    (serving/limits.py; the defaults without one)."""
    from fastapi import Depends, FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="Bessemer", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = ServerMetrics()
    created = int(time.time())
    tokenizer = engine.llm.tokenizer
    limits = limits or ServerLimits()

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

    v1 = {"dependencies": [Depends(authorize)]}

    # ---- plain routes ----
    @app.get("/health")
    async def health():
        problem = engine.failure()
        if problem:
            return error_response(P.ApiError(503, problem, "server_error"))
        return {"status": "ok"}

    @app.get("/v1/models", **v1)
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "bessemer", "max_model_len": engine.llm.max_seq_len}]}

    @app.get("/metrics", **v1)  # with --api-key, the counters are the key holder's too
    async def prometheus():
        return PlainTextResponse(metrics.render(engine.stats()), media_type="text/plain; version=0.0.4")

    # ---- generation ----
    async def read(request: Request, model: type):
        raw = await read_body(request, limits)  # 413 / 408 before anything parses it
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise P.ApiError(400, f"the request body is not valid JSON ({e})") from None
        except RecursionError:
            raise P.ApiError(400, "the request body's JSON is nested too deeply") from None
        req = P.parse(model, body)
        if req.n > limits.max_n:
            raise P.ApiError(400, f"n is {req.n} but this server allows at most {limits.max_n} completions "
                                  "per prompt (its --max-n)", param="n")
        if req.model is not None and req.model != model_name:
            raise P.ApiError(404, f"model {req.model!r} does not exist; this server serves {model_name!r}",
                             param="model", code="model_not_found")
        return req

    async def start(prompts: list[list[int]], params) -> list[RequestStream]:
        """Queues a request's prompts in one engine command (all or none)."""
        streams = await engine.add_requests(prompts, params)
        for ids in prompts:
            metrics.request_started(len(ids))
        return streams

    def check_prompts(prompts: list[list[int]], max_tokens: int | None) -> None:
        total = sum(len(p) for p in prompts)
        if total > limits.max_prompt_tokens:
            raise P.ApiError(400, f"the request's prompts hold {total} tokens together, over this server's limit of "
                                  f"{limits.max_prompt_tokens} (--max-prompt-tokens); split the request", param="prompt")
        if max_tokens is not None:
            for ids in prompts:
                P.check_context(len(ids), max_tokens, engine.llm.max_seq_len)

    def head(rid: str, obj: str, choices: list, **extra) -> dict:
        return {"id": rid, "object": obj, "created": int(time.time()), "model": model_name,
                "choices": choices, **extra}

    def finish(choice: dict, finish_reason: str | None, error: str | None) -> dict:
        """A choice's end: a constraint that failed ends it with finish_reason "error" and
        says why, in the OpenAI error shape."""
        choice["finish_reason"] = finish_reason
        if error is not None:
            choice["error"] = P.error_body(error, "constraint_error")["error"]
        return choice

    def request_id(req, prefix: str) -> str:
        return req.request_id or f"{prefix}-{uuid.uuid4().hex}"

    @app.post("/v1/completions", **v1)
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
        streams = await start(prompts, params)
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
            async def chunks():
                offsets: dict[int, int] = {}  # text_offset continues across chunks
                if req.echo:  # the prompt first, as its own chunk per choice
                    for i in range(len(prompts) * params.n):
                        text, _ = echoed(i)
                        offsets[i] = len(text)
                        yield head(rid, "text_completion", [{"index": i, "text": text, "logprobs": None,
                                                             "finish_reason": None}]), 0
                async for i, d in events(streams, params.n, metrics):
                    lp = logprobs(d.logprobs, d.token_ids, offsets.get(i, 0)) if d.logprobs else None
                    offsets[i] = offsets.get(i, 0) + len(d.text)
                    choice = {"index": i, "text": d.text, "logprobs": lp}
                    yield head(rid, "text_completion", [finish(choice, d.finish_reason, d.error)]), len(d.token_ids)

            return sse(chunks(), lambda u: head(rid, "text_completion", [], usage=u), num_prompt, req.include_usage)

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

    @app.post("/v1/chat/completions", **v1)
    async def chat_completions(request: Request):
        req: P.ChatCompletionRequest = await read(request, P.ChatCompletionRequest)
        messages = [m.as_template_input() for m in req.messages]
        tokenizer.check_length("".join(m["content"] for m in messages if isinstance(m.get("content"), str)),
                               engine.llm.max_seq_len)
        prompt = await asyncio.to_thread(tokenizer.encode_chat, messages, req.template_tools(),
                                         req.add_generation_prompt, req.template_kwargs())
        prompt = req.truncate(prompt)
        check_prompts([prompt], req.max_completion_tokens or req.max_tokens)
        k = req.num_logprobs()
        forced = req.forced_call()  # "required" or a named function: the output is the call
        if forced is not None and req.response_format is not None and req.response_format.type != "text":
            raise P.ApiError(400, "response_format and a forced tool call (tool_choice) both constrain the output; "
                                  "give one of them", param="response_format")
        if req.tools and req.tool_choice != "none" and forced is None and req.constraints():
            raise P.ApiError(400, f"{req.constraints()[0][0]} constrains the output, so the model could not call "
                                  "the tools it is given; send tool_choice 'none', or leave the constraint out",
                             param=req.constraints()[0][0])
        params = req.sampling_params(req.max_new_tokens(len(prompt), engine.llm.max_seq_len), k, forced)
        parse_calls = bool(req.tools) and req.tool_choice != "none"
        streams = await start([prompt], params)
        rid, chunk = request_id(req, "chatcmpl"), "chat.completion.chunk"

        def logprobs(entries, token_ids):
            return None if k is None else P.chat_logprobs(entries, token_ids, k, decode_token)

        def message(text: str) -> tuple[dict, bool]:
            calls = P.tool_calls(text, forced is not None, req.parallel_tool_calls is not False) if parse_calls else None
            if calls:
                return {"role": "assistant", "content": None, "tool_calls": calls}, True
            return {"role": "assistant", "content": text}, False

        if req.stream:
            async def chunks():
                # OpenAI sends the role first, in a chunk of its own
                yield head(rid, chunk, [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None} for i in range(params.n)]), 0
                texts: dict[int, str] = {}
                async for i, d in events(streams, params.n, metrics):
                    if forced is not None:  # a forced call goes out whole, as one tool_calls delta
                        texts[i] = texts.get(i, "") + d.text
                        if d.finish_reason is None:
                            continue
                        msg, called = message(texts[i])
                        delta = {"tool_calls": [{"index": j, **c} for j, c in enumerate(msg.get("tool_calls") or [])]}
                        choice = {"index": i, "delta": delta if called else {"content": texts[i]}, "logprobs": None}
                        yield head(rid, chunk, [finish(choice, "tool_calls" if called else d.finish_reason,
                                                       d.error)]), len(d.token_ids)
                        continue
                    choice = {"index": i, "delta": {"content": d.text} if d.text else {},
                              "logprobs": logprobs(d.logprobs, d.token_ids) if d.logprobs else None}
                    yield head(rid, chunk, [finish(choice, d.finish_reason, d.error)]), len(d.token_ids)

            return sse(chunks(), lambda u: head(rid, chunk, [], usage=u), len(prompt), req.include_usage)

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

    def sse(chunks, usage_chunk, num_prompt_tokens: int, include_usage: bool):
        """`chunks` yields (chunk, new token count); closing it (client gone) aborts."""
        async def body():
            num_output = 0
            try:
                async for chunk, num_tokens in chunks:
                    num_output += num_tokens
                    yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            except EngineClosedError:  # headers are out: report it the way OpenAI streams errors
                yield f"data: {json.dumps(_shutting_down().body())}\n\n"
                return
            except SequenceFailedError as e:  # this request's own failure; the others go on
                yield f"data: {json.dumps(P.error_body(str(e), 'server_error'))}\n\n"
                return
            finally:
                await chunks.aclose()
            if include_usage:
                yield f"data: {json.dumps(usage_chunk(P.usage(num_prompt_tokens, num_output)))}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

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
