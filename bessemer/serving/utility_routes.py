"""The routes beside generation that vLLM's clients and tools expect, registered onto the
app by `register`:

- GET /v1/models and GET /v1/models/{id}: the one model (another id is OpenAI's 404);
- POST /tokenize: {"prompt"} or {"messages"} (through the chat template, as chat
  completions render it) with "add_special_tokens" -> {"count", "max_model_len", "tokens"};
- POST /detokenize: {"tokens"} -> {"prompt"}; an id outside the vocabulary is a 400;
- GET /version: {"version"}. Open without the API key, as in vLLM: load balancers and
  dashboards read it, and the version of a public package tells nothing the key guards.

Bodies go through the same bounded reader as generation (413 / 408) and the same strict
parse (an unknown field is a 400 naming it).
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations.
import asyncio

import bessemer
from bessemer.runtime.async_llm import AsyncLLM
from bessemer.serving import protocol as P
from bessemer.serving.body import read_json
from bessemer.serving.limits import ServerLimits


def register(app, engine: AsyncLLM, model_name: str, limits: ServerLimits, dependencies: list, created: int) -> None:
    """`dependencies` guard every route but /version (the API key check)."""
    from fastapi import Request

    tokenizer = engine.llm.tokenizer
    max_model_len = engine.llm.max_seq_len
    guarded = {"dependencies": dependencies}

    def card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "bessemer",
                "max_model_len": max_model_len}

    @app.get("/v1/models", **guarded)
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}", **guarded)  # ids may hold slashes ("org/name")
    async def model(model_id: str):
        P.check_model(model_id, model_name)
        return card()

    @app.get("/version")
    async def version():
        return {"version": bessemer.__version__}

    @app.post("/tokenize", **guarded)
    async def tokenize(request: Request):
        body = await read_json(request, limits)
        chat = isinstance(body, dict) and "messages" in body
        req = P.parse(P.TokenizeChatRequest if chat else P.TokenizeCompletionRequest, body)
        P.check_model(req.model, model_name)
        if chat:
            messages = req.template_messages()
            text = await asyncio.to_thread(tokenizer.apply_chat_template, messages, req.add_generation_prompt,
                                           req.template_tools(), req.template_kwargs())
        else:
            text = req.prompt
        # as generation: a text that cannot fit the context is refused from its length,
        # and the rest is tokenized off the event loop
        tokenizer.check_length(text, max_model_len)
        tokens = await asyncio.to_thread(tokenizer.encode, text, req.add_special_tokens)
        return {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens}

    @app.post("/detokenize", **guarded)
    async def detokenize(request: Request):
        req = P.parse(P.DetokenizeRequest, await read_json(request, limits))
        P.check_model(req.model, model_name)
        if len(req.tokens) > limits.max_prompt_tokens:
            raise P.ApiError(400, f"tokens holds {len(req.tokens)} ids, over this server's limit of "
                                  f"{limits.max_prompt_tokens} (--max-prompt-tokens); split the request",
                             param="tokens")
        vocab = tokenizer.vocab_size
        bad = next((t for t in req.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise P.ApiError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1}); send ids this "
                                  "model's tokenizer produced", param="tokens")
        # special tokens stay in the text, as vLLM (and the tokenizer's decode by default) gives them
        return {"prompt": await asyncio.to_thread(tokenizer.decode, req.tokens, False)}
