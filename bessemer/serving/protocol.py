"""OpenAI wire format: request validation (pydantic) and the response, chunk and error bodies.

Requests are validated by hand-called `parse()` rather than FastAPI's body injection so that
every bad request gets OpenAI's error shape `{"error": {message, type, param, code}}` with a
400, not FastAPI's 422 `{"detail": ...}`. Unknown fields (`user`, `logit_bias`, ...) are
ignored, as OpenAI-compatible servers do.
"""

from __future__ import annotations

import json
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bessemer.runtime.sampling_params import SamplingParams


class ApiError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str | None = None
    schema_: dict = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    # None means the OpenAI default; clients send explicit nulls
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = Field(1, ge=1)  # the upper bound is the server's --max-n (app.py)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    # constrained output: OpenAI's response_format, and vLLM's guided_* extensions
    response_format: ResponseFormat | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def json_schema(self) -> dict | str | None:
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            return {"type": "object"}
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise ApiError(400, "response_format json_schema needs a json_schema object with a schema",
                               param="response_format")
            return rf.json_schema.schema_
        return self.guided_json

    def sampling_params(self, max_tokens: int, logprobs: int | None, json_schema=None) -> SamplingParams:
        """Raises InvalidOptionError (a 400) for values SamplingParams rejects.
        `json_schema` overrides the request's own (tool calls)."""
        return SamplingParams(
            json_schema=json_schema if json_schema is not None else self.json_schema(),
            regex=self.guided_regex, grammar=self.guided_grammar,
            max_tokens=max_tokens, temperature=_or(self.temperature, 1.0), top_k=_or(self.top_k, 0),
            top_p=_or(self.top_p, 1.0), min_p=_or(self.min_p, 0.0), seed=self.seed, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            repetition_penalty=_or(self.repetition_penalty, 1.0),
            presence_penalty=_or(self.presence_penalty, 0.0), frequency_penalty=_or(self.frequency_penalty, 0.0),
            min_tokens=self.min_tokens, n=self.n)


class CompletionRequest(_SamplingFields):
    # token-id lists come before strings so that [1, 2] is one tokenized prompt, not two
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise ApiError(400, "prompt is empty; give a string, a list of strings or token ids", param="prompt")
        return list(p)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[dict] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one

    def as_template_input(self) -> dict:
        content = self.content
        if isinstance(content, list):  # the chat templates of these models take plain strings
            content = "".join(part.text for part in content)
        out = {"role": "system" if self.role == "developer" else self.role, "content": content or ""}
        if self.tool_calls:
            # templates read arguments as a mapping; OpenAI sends them as a JSON string
            out["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                                    "arguments": _loads(c.get("function", {}).get("arguments"))}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

    def tool_call_schema(self) -> dict | None:
        """The JSON schema the output must follow when a call is forced ("required" or a
        named function): {"name": ..., "arguments": {...}}; None when none is forced."""
        if not self.tools or self.tool_choice in (None, "none", "auto"):
            return None
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
            if not tools:
                raise ApiError(400, f"tool_choice names function {self.tool_choice.function.name!r}, which is not "
                                    "among the tools", param="tool_choice")
        calls = [{"type": "object", "properties": {"name": {"const": t.function.name},
                                                   "arguments": t.function.parameters},
                  "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
        return calls[0] if len(calls) == 1 else {"anyOf": calls}

    def template_tools(self) -> list[dict] | None:
        return [t.model_dump() for t in self.tools] if self.tools else None

    def max_new_tokens(self, num_prompt_tokens: int, max_seq_len: int) -> int:
        """OpenAI's default for chat is "until the context is full"."""
        asked = self.max_completion_tokens or self.max_tokens
        return asked if asked is not None else max(1, max_seq_len - num_prompt_tokens)

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


def parse(model: type[BaseModel], body) -> BaseModel:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        # a union reports one error per member; the field path is what the user needs
        loc = [str(x) for x in first["loc"] if not _is_union_member(x)]
        param = ".".join(loc) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


def _is_union_member(loc_item) -> bool:
    return isinstance(loc_item, str) and (loc_item.startswith(("list[", "str", "int", "float")) or loc_item == "function-after")


def _or(value, default):
    return default if value is None else value


def _loads(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def tool_calls(text: str, forced: bool) -> list[dict] | None:
    """OpenAI tool_calls from generated text: the whole text when a call was forced
    (constrained to {"name", "arguments"}), else Hermes-style <tool_call>{...}</tool_call>
    blocks (what tool-capable chat templates such as Qwen2.5's and Hermes' ask for)."""
    if forced:
        bodies = [text]
    else:
        bodies = [part.split("</tool_call>", 1)[0] for part in text.split("<tool_call>")[1:]]
    calls = []
    for body in bodies:
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and isinstance(call.get("name"), str):
            arguments = call.get("arguments", call.get("parameters", {}))
            calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                          "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return calls or None


# ---- responses ----
def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}


def completion_logprobs(entries: list[dict[int, float]], token_ids: list[int], k: int, decode,
                        text_offset: int) -> dict:
    """The legacy completions shape: parallel lists per token."""
    tokens = [decode(t) for t in token_ids]
    offsets, pos = [], text_offset
    for tok in tokens:
        offsets.append(pos)
        pos += len(tok)
    return {"tokens": tokens,
            "token_logprobs": [e[t] for e, t in zip(entries, token_ids)],
            "top_logprobs": [{decode(t): lp for t, lp in _top(e, k)} for e in entries],
            "text_offset": offsets}


def chat_logprobs(entries: list[dict[int, float]], token_ids: list[int], k: int, decode) -> dict:
    def item(token: int, logprob: float) -> dict:
        text = decode(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**item(t, e[t]), "top_logprobs": [item(t2, lp) for t2, lp in _top(e, k)]}
                        for e, t in zip(entries, token_ids)]}


def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    # the sampler's dict also holds the chosen token when it is not among the k best
    return sorted(entry.items(), key=lambda kv: -kv[1])[:k]
