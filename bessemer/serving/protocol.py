"""OpenAI wire format: request validation (pydantic) and the response, chunk and error bodies.

Requests are validated by hand-called `parse()` rather than FastAPI's body injection so that
every bad request gets OpenAI's error shape `{"error": {message, type, param, code}}` with a
400, not FastAPI's 422 `{"detail": ...}`.

Every field is honoured or refused: the models forbid fields they do not declare (a 400
naming the field), and fields of OpenAI's and vLLM's APIs that Bessemer does not implement
are refused by name unless they hold the value that asks for nothing (UNSUPPORTED). The
fields that only identify a request or its user (`user`, `safety_identifier`,
`prompt_cache_key`, `request_id`) are taken: they change nothing in what is generated.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bessemer.runtime.sampling_params import SamplingParams
from bessemer.serving.api_error import ApiError, error_body  # noqa: F401 - re-exported
from bessemer.serving.tool_schemas import call_schema, close_objects

# Fields of the OpenAI and vLLM request schemas that Bessemer does not implement, with the
# values that ask for nothing (and so are accepted): anything else is a 400 naming the field.
UNSUPPORTED_ANY_ROUTE = {
    "use_beam_search": (None, False), "length_penalty": (None, 1, 1.0),
    "spaces_between_special_tokens": (None, True), "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,), "structural_tag": (None,), "logits_processors": (None,),
    "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "cache_salt": (None,),
    "kv_transfer_params": (None,), "vllm_xargs": (None,), "priority": (None, 0), "service_tier": (None, "auto", "default"),
    "store": (None, False), "metadata": (None,), "mm_processor_kwargs": (None,), "prompt_embeds": (None,),
}
UNSUPPORTED_COMPLETIONS = {"suffix": (None, ""), "add_special_tokens": (None, True)}
UNSUPPORTED_CHAT = {
    "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,), "reasoning_effort": (None,),
    "verbosity": (None,), "web_search_options": (None,), "functions": (None,), "function_call": (None,),
    "echo": (None, False), "continue_final_message": (None, False), "documents": (None,), "chat_template": (None,),
    "add_special_tokens": (None, False), "moderation": (None,), "prompt_cache_options": (None,),
    "prompt_cache_retention": (None,),
}
ID_FIELDS = {"user": None, "safety_identifier": None, "prompt_cache_key": None}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: Literal[False] | None = None


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict = Field(default_factory=lambda: {"type": "object"}, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` (the current name of its guided_* fields)."""
    json_: dict | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None


def choice_grammar(choices: list[str], param: str) -> str:
    """A Lark grammar whose language is exactly `choices` (one lexer terminal, so thousands
    of choices cost the lexer, not a parser row per choice)."""
    if not choices:
        raise ApiError(400, f"{param} is empty; give at least one choice", param=param)
    return "start: CHOICE\nCHOICE: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices) + "\n"


class _SamplingFields(_Strict):
    model: str | None = None
    # None means the OpenAI default; clients send explicit nulls
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    n: int = Field(1, ge=1)  # the upper bound is the server's --max-n (app.py)
    best_of: int | None = Field(None, ge=1)  # n best of best_of: only best_of == n (no reranking)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI sends token ids as strings
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    truncate_prompt_tokens: int | None = Field(None, ge=1)  # keep the prompt's last N tokens
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # constrained output: OpenAI's response_format, vLLM's structured_outputs and guided_*
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict | str | None = None
    guided_regex: str | None = None
    guided_grammar: str | None = None
    guided_choice: list[str] | None = None
    # identifiers only (module docstring)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    request_id: str | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def constraints(self) -> list[tuple[str, str, object]]:
        """Every constraint the request asks for: (its field, kind, value), kind being a
        SamplingParams field (json_schema, regex, grammar)."""
        found = []
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            found.append(("response_format", "json_schema", {"type": "object"}))
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None:
                raise ApiError(400, "response_format json_schema needs a json_schema object with a schema",
                               param="response_format")
            schema = rf.json_schema.schema_
            found.append(("response_format", "json_schema", close_objects(schema) if rf.json_schema.strict else schema))
        so = self.structured_outputs
        if so is not None:
            for name, kind, value in (("json", "json_schema", so.json_), ("regex", "regex", so.regex),
                                      ("grammar", "grammar", so.grammar)):
                if value is not None:
                    found.append((f"structured_outputs.{name}", kind, value))
            if so.choice is not None:
                found.append(("structured_outputs.choice", "grammar", choice_grammar(so.choice, "structured_outputs.choice")))
            if so.json_object:
                found.append(("structured_outputs.json_object", "json_schema", {"type": "object"}))
        for name, kind in (("guided_json", "json_schema"), ("guided_regex", "regex"), ("guided_grammar", "grammar")):
            if getattr(self, name) is not None:
                found.append((name, kind, getattr(self, name)))
        if self.guided_choice is not None:
            found.append(("guided_choice", "grammar", choice_grammar(self.guided_choice, "guided_choice")))
        return found

    def constraint(self, forced: tuple[str, dict] | None = None) -> dict:
        """The SamplingParams keyword of the one constraint ({} for none); `forced` is
        (its field, schema) of a forced tool call. Two constraints are a 400."""
        found = self.constraints() + ([(forced[0], "json_schema", forced[1])] if forced else [])
        if len(found) > 1:
            raise ApiError(400, f"{found[0][0]} and {found[1][0]} both constrain the output; give one of them",
                           param=found[1][0])
        return {found[0][1]: found[0][2]} if found else {}

    def sampling_params(self, max_tokens: int, logprobs: int | None, forced: tuple[str, dict] | None = None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """Raises InvalidOptionError (a 400) for values SamplingParams rejects."""
        if self.best_of is not None and self.best_of != self.n:
            raise ApiError(400, f"best_of {self.best_of} with n {self.n}: this server returns every sequence it "
                                "generates (no reranking), so best_of must equal n or be left out", param="best_of")
        return SamplingParams(
            **self.constraint(forced),
            max_tokens=max_tokens, temperature=_or(self.temperature, 1.0), top_k=_or(self.top_k, 0),
            top_p=_or(self.top_p, 1.0), min_p=_or(self.min_p, 0.0), seed=self.seed, stop=self.stop,
            stop_token_ids=self.stop_token_ids, ignore_eos=self.ignore_eos, logprobs=logprobs,
            repetition_penalty=_or(self.repetition_penalty, 1.0),
            presence_penalty=_or(self.presence_penalty, 0.0), frequency_penalty=_or(self.frequency_penalty, 0.0),
            min_tokens=self.min_tokens, n=self.n, logit_bias=self._logit_bias(),
            allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens, prompt_logprobs=_first(prompt_logprobs, self.prompt_logprobs))

    def _logit_bias(self) -> dict[int, float] | None:
        if self.logit_bias is None:
            return None
        out = {}
        for key, value in self.logit_bias.items():
            if not key.strip().isdigit():
                raise ApiError(400, f"logit_bias key {key!r} is not a token id", param="logit_bias")
            out[int(key)] = value
        return out

    def truncate(self, ids: list[int]) -> list[int]:
        """vLLM's truncate_prompt_tokens: the prompt's last N tokens."""
        n = self.truncate_prompt_tokens
        return ids[-n:] if n is not None and len(ids) > n else ids


class CompletionRequest(_SamplingFields):
    # token-id lists come before strings so that [1, 2] is one tokenized prompt, not two
    prompt: list[int] | list[list[int]] | str | list[str]
    max_tokens: int | None = Field(16, ge=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False  # the prompt comes back before the completion (with its logprobs)

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        if not p:
            raise ApiError(400, "prompt is empty; give a string, a list of strings or token ids", param="prompt")
        return list(p)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one
    refusal: str | None = None  # an assistant's earlier refusal: its text is the content

    def as_template_input(self) -> dict:
        content = self.content
        if isinstance(content, list):  # the chat templates of these models take plain strings
            content = "".join(part.text for part in content)
        out = {"role": "system" if self.role == "developer" else self.role, "content": content or self.refusal or ""}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            # templates read arguments as a mapping; OpenAI sends them as a JSON string
            out["tool_calls"] = [{**c, "function": {**c.get("function", {}),
                                                    "arguments": _loads(c.get("function", {}).get("arguments"))}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class _ChatTemplateFields(_Strict):
    """What the chat template renders: chat completions and vLLM's /tokenize share them."""
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    chat_template_kwargs: dict | None = None  # extra variables for the chat template (enable_thinking, ...)

    def template_messages(self) -> list[dict]:
        return [m.as_template_input() for m in self.messages]

    def template_tools(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def template_kwargs(self) -> dict:
        kwargs = self.chat_template_kwargs or {}
        taken = sorted(set(kwargs) & {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
        if taken:
            raise ApiError(400, f"chat_template_kwargs may not set {taken[0]!r}; it has a field of its own",
                           param="chat_template_kwargs")
        return kwargs


class ChatCompletionRequest(_SamplingFields, _ChatTemplateFields):
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # false: at most one call per message

    def forced_call(self) -> tuple[str, dict] | None:
        """("tool_choice", the JSON schema the output must follow) when a call is forced
        ("required" or a named function): {"name": ..., "arguments": {...}}; else None."""
        if not self.tools or self.tool_choice in (None, "none", "auto"):
            if self.tools and any(t.function.strict for t in self.tools) and self.tool_choice != "none":
                raise ApiError(400, "strict tools need tool_choice 'required' or a named function: in 'auto' mode "
                                    "calls are parsed from free text, not generated under their schema",
                               param="tools")
            return None
        tools = self.tools
        if isinstance(self.tool_choice, NamedToolChoice):
            tools = [t for t in tools if t.function.name == self.tool_choice.function.name]
            if not tools:
                raise ApiError(400, f"tool_choice names function {self.tool_choice.function.name!r}, which is not "
                                    "among the tools", param="tool_choice")
        return "tool_choice", call_schema([(t.function.name, t.function.parameters, bool(t.function.strict))
                                           for t in tools])

    def max_new_tokens(self, num_prompt_tokens: int, max_seq_len: int) -> int:
        """OpenAI's default for chat is "until the context is full"."""
        asked = self.max_completion_tokens or self.max_tokens
        return asked if asked is not None else max(1, max_seq_len - num_prompt_tokens)

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


# vLLM's /tokenize (a prompt, or messages through the chat template) and /detokenize
class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True


class TokenizeChatRequest(_ChatTemplateFields):
    model: str | None = None
    add_special_tokens: bool = False  # the template already holds the special tokens it wants


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[int]


def check_model(requested: str | None, served: str) -> None:
    """OpenAI's 404 for a model this server does not serve (None: the one it serves)."""
    if requested is not None and requested != served:
        raise ApiError(404, f"model {requested!r} does not exist; this server serves {served!r}",
                       param="model", code="model_not_found")


def check_context(num_prompt_tokens: int, max_tokens: int, max_seq_len: int) -> None:
    """vLLM's 400 for a request that cannot fit: prompt plus max_tokens over the context (a
    prompt that does not fit alone is the engine's to refuse, naming its length)."""
    if num_prompt_tokens < max_seq_len < num_prompt_tokens + max_tokens:
        raise ApiError(400, f"this model's maximum context length is {max_seq_len} tokens, but {num_prompt_tokens} "
                            f"prompt tokens and max_tokens {max_tokens} ask for {num_prompt_tokens + max_tokens}; "
                            "lower max_tokens or shorten the prompt", param="max_tokens")


def refuse_unsupported(body: dict, route: dict) -> dict:
    """The body less the UNSUPPORTED fields it leaves at their do-nothing values; a 400
    naming the first one it sets."""
    body = dict(body)
    for table in (UNSUPPORTED_ANY_ROUTE, route):
        for name, accepted in table.items():
            if name not in body:
                continue
            value = body.pop(name)
            if not any(value == a and type(value) is type(a) for a in accepted if a is not None) and value is not None:
                raise ApiError(400, f"{name} is not supported by this server (got {json.dumps(value)[:80]}); "
                                    "leave it out", param=name)
    return body


def parse(model: type[BaseModel], body) -> BaseModel:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    route = {CompletionRequest: UNSUPPORTED_COMPLETIONS, ChatCompletionRequest: UNSUPPORTED_CHAT}.get(model)
    if route is not None:  # the generation routes; the others declare every field they take
        body = refuse_unsupported(body, route)
    if model is ChatCompletionRequest and body.get("best_of") is not None:
        raise ApiError(400, "best_of is a completions field; chat has none", param="best_of")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        if first["type"] == "extra_forbidden":
            param = ".".join(str(x) for x in first["loc"])
            raise ApiError(400, f"unknown field {param!r}: this server does not support it; leave it out",
                           param=param) from None
        # a union reports one error per member; the field path is what the user needs
        loc = [str(x) for x in first["loc"] if not _is_union_member(x)]
        param = ".".join(loc) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param) from None


def _is_union_member(loc_item) -> bool:
    return isinstance(loc_item, str) and (loc_item.startswith(("list[", "str", "int", "float")) or loc_item == "function-after")


def _or(value, default):
    return default if value is None else value


def _first(*values):
    return next((v for v in values if v is not None), None)


def _loads(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


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


def _top(entry: dict[int, float | None], k: int) -> list[tuple[int, float]]:
    # the sampler's dict also holds the chosen token when it is not among the k best; a
    # prompt's first token has no logprob (None) and no alternatives
    return sorted(((t, lp) for t, lp in entry.items() if lp is not None), key=lambda kv: -kv[1])[:k]


def prompt_logprobs_json(entries: list | None) -> list | None:
    """vLLM's prompt_logprobs: per prompt token null (the first) or {token id: {logprob}}."""
    if entries is None:
        return None
    return [None if e is None else {str(t): {"logprob": lp} for t, lp in e.items()} for e in entries]
