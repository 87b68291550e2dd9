"""Every request field of the official openai client's chat and completions models, and
vLLM's extra fields, is honoured (a test shows its effect) or refused with a 400 naming it;
constraints that break the grammar compiler or its matcher fail alone; one request of
20,000 prompts does not starve another client. A real `bessemer serve` of SmolLM2 bf16
(greedy unless a test says otherwise), from an engine copy whose chat template renders
tools and a `persona` template variable.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import typing
from pathlib import Path

import numpy as np
import pytest

from test_serve import Server
from test_structured import TOOL_TEMPLATE

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

TEMPLATE = "{% if persona %}<|im_start|>system\n{{ persona }}<|im_end|>\n{% endif %}" + TOOL_TEMPLATE
PROMPT = "The three primary colors are"

# field -> the test (in this file unless "file::name") that shows it working
HONOURED_COMPLETIONS = {
    "model": "test_serve.py::test_bad_requests_get_openai_errors", "prompt": "test_serve.py::test_completions_and_chat_stream_like_plain",
    "max_tokens": "test_serve.py::test_completions_and_chat_stream_like_plain",
    "n": "test_serve.py::test_concurrent_requests_match_one_at_a_time", "stream": "test_serve.py::test_completions_and_chat_stream_like_plain",
    "stream_options": "test_serve.py::test_completions_and_chat_stream_like_plain", "temperature": "test_guided_choice_and_structured_outputs",
    "top_p": "test_sampling_fields_reach_the_sampler", "seed": "test_guided_choice_and_structured_outputs",
    "stop": "test_include_stop_str_in_output", "logprobs": "test_echo_returns_the_prompt_with_its_logprobs",
    "frequency_penalty": "test_sampling_fields_reach_the_sampler", "presence_penalty": "test_sampling_fields_reach_the_sampler",
    "echo": "test_echo_returns_the_prompt_with_its_logprobs", "logit_bias": "test_logit_bias_and_allowed_token_ids",
    "best_of": "test_conflicting_fields_are_400s", "user": "test_identifier_fields_are_taken",
}
HONOURED_CHAT = {
    "messages": "test_serve.py::test_completions_and_chat_stream_like_plain", "model": "test_serve.py::test_bad_requests_get_openai_errors",
    "max_tokens": "test_chat_template_kwargs_and_add_generation_prompt", "max_completion_tokens": "test_chat_template_kwargs_and_add_generation_prompt",
    "n": "test_serve.py::test_concurrent_requests_match_one_at_a_time", "temperature": "test_guided_choice_and_structured_outputs",
    "top_p": "test_sampling_fields_reach_the_sampler", "seed": "test_guided_choice_and_structured_outputs",
    "stop": "test_include_stop_str_in_output", "stream_options": "test_serve.py::test_completions_and_chat_stream_like_plain",
    "logprobs": "test_serve.py::test_completions_and_chat_stream_like_plain", "top_logprobs": "test_serve.py::test_completions_and_chat_stream_like_plain",
    "frequency_penalty": "test_sampling_fields_reach_the_sampler", "presence_penalty": "test_sampling_fields_reach_the_sampler",
    "logit_bias": "test_logit_bias_and_allowed_token_ids", "response_format": "test_strict_schemas_and_tool_schemas_as_people_write_them",
    "tools": "test_strict_schemas_and_tool_schemas_as_people_write_them", "tool_choice": "test_strict_schemas_and_tool_schemas_as_people_write_them",
    "parallel_tool_calls": "test_parallel_tool_calls_false_keeps_the_first_call", "user": "test_identifier_fields_are_taken",
    "safety_identifier": "test_identifier_fields_are_taken", "prompt_cache_key": "test_identifier_fields_are_taken",
}
# vLLM's extra fields (SamplingParams and the OpenAI-server extras) that Bessemer honours
HONOURED_VLLM = {
    "top_k": "test_sampling_fields_reach_the_sampler", "min_p": "test_sampling_fields_reach_the_sampler",
    "repetition_penalty": "test_sampling_fields_reach_the_sampler", "stop_token_ids": "test_skip_special_tokens",
    "ignore_eos": "test_skip_special_tokens", "min_tokens": "test_sampling_fields_reach_the_sampler",
    "include_stop_str_in_output": "test_include_stop_str_in_output", "skip_special_tokens": "test_skip_special_tokens",
    "allowed_token_ids": "test_logit_bias_and_allowed_token_ids", "bad_words": "test_bad_words",
    "prompt_logprobs": "test_echo_returns_the_prompt_with_its_logprobs", "truncate_prompt_tokens": "test_truncate_prompt_tokens",
    "guided_json": "test_structured.py::test_errors_and_speculation_metrics", "guided_regex": "test_guided_choice_and_structured_outputs",
    "guided_grammar": "test_constraints_that_break_the_compiler_or_matcher_fail_alone", "guided_choice": "test_guided_choice_and_structured_outputs",
    "structured_outputs": "test_guided_choice_and_structured_outputs", "request_id": "test_identifier_fields_are_taken",
    "chat_template_kwargs": "test_chat_template_kwargs_and_add_generation_prompt",
    "add_generation_prompt": "test_chat_template_kwargs_and_add_generation_prompt",
}
# refused unless left at the value that asks for nothing: (route, field, a value that asks for something)
REFUSED = [
    ("completions", "suffix", "tail"), ("completions", "add_special_tokens", False),
    ("chat", "audio", {"voice": "alloy", "format": "wav"}), ("chat", "modalities", ["text", "audio"]),
    ("chat", "prediction", {"type": "content", "content": "x"}), ("chat", "reasoning_effort", "low"),
    ("chat", "verbosity", "low"), ("chat", "web_search_options", {}), ("chat", "functions", [{"name": "f"}]),
    ("chat", "function_call", "auto"), ("chat", "metadata", {"k": "v"}), ("chat", "store", True),
    ("chat", "service_tier", "flex"), ("chat", "moderation", {"model": "x"}), ("chat", "prompt_cache_options", {}),
    ("chat", "prompt_cache_retention", "24h"), ("chat", "echo", True), ("chat", "continue_final_message", True),
    ("chat", "documents", [{"text": "x"}]), ("chat", "chat_template", "{{ messages }}"), ("chat", "add_special_tokens", True),
    ("chat", "best_of", 2), ("completions", "metadata", {"k": "v"}),
    ("completions", "use_beam_search", True), ("completions", "length_penalty", 2.0),
    ("completions", "spaces_between_special_tokens", False), ("completions", "guided_decoding_backend", "xgrammar"),
    ("completions", "guided_whitespace_pattern", " "), ("completions", "structural_tag", "{}"),
    ("completions", "logits_processors", ["x"]), ("completions", "return_tokens_as_token_ids", True),
    ("completions", "return_token_ids", True), ("completions", "cache_salt", "s"), ("completions", "priority", 1),
    ("completions", "kv_transfer_params", {}), ("completions", "vllm_xargs", {}), ("completions", "mm_processor_kwargs", {}),
    ("completions", "prompt_embeds", "AAAA"), ("completions", "no_such_field", 1), ("chat", "no_such_field", 1),
]


@pytest.fixture(scope="module")
def engine_dir(smollm2_engine, tmp_path_factory) -> Path:
    engine = smollm2_engine("bfloat16")
    copy = tmp_path_factory.mktemp("fields-engine") / "engine"
    copy.mkdir()
    for f in engine.iterdir():
        if f.name != "chat_template.jinja":
            (copy / f.name).symlink_to(f)
    (copy / "chat_template.jinja").write_text(TEMPLATE)
    return copy


@pytest.fixture(scope="module")
def server(engine_dir, tmp_path_factory):
    # limits raised so that the 20,000-prompt request and a grammar past the compiler's
    # stack reach the engine (the defaults refuse both: tests/test_constraint_safety.py).
    # Steps of 512 tokens: another request's token waits for the step in progress, and the
    # default 2048-token step takes seconds on a CI worker's one thread
    s = Server(engine_dir, tmp_path_factory.mktemp("fields-logs") / "server.log", "--max-prompts", "20000",
               "--max-prompt-tokens", "20000000", "--max-grammar-rules", "1000000", "--max-constraint-bytes",
               "20000000", "--max-request-bytes", "64000000", "--max-num-tokens", "512")
    s.wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tokenizer(engine_dir):
    from bessemer.runtime.tokenizer import Tokenizer

    return Tokenizer(engine_dir)


def complete(server, **body) -> dict:
    r = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, **body}, key=None)
    assert r.status_code == 200, r.text
    return r.json()


def chat(server, **body) -> dict:
    r = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a color."}],
                                             "max_tokens": 8, "temperature": 0, **body}, key=None)
    assert r.status_code == 200, r.text
    return r.json()


def refused(server, route: str, body: dict, param: str) -> str:
    path = "/v1/completions" if route == "completions" else "/v1/chat/completions"
    base = {"prompt": PROMPT, "max_tokens": 4} if route == "completions" else \
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = server.post(path, {**base, **body}, key=None)
    assert r.status_code == 400, (route, body, r.text)
    error = r.json()["error"]
    assert error["param"] == param, (route, body, error)
    return error["message"]


def test_every_request_field_is_honoured_or_refused(server):
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chats

    here = Path(__file__).parent
    for route, model, honoured in (("completions", completions.CompletionCreateParamsBase, HONOURED_COMPLETIONS),
                                   ("chat", chats.CompletionCreateParamsBase, HONOURED_CHAT)):
        refused_here = {field for r, field, _ in REFUSED if r == route}
        for field in typing.get_type_hints(model):
            assert field in honoured or field in refused_here, f"{route}: {field} is neither honoured nor refused"
    for test in {**HONOURED_COMPLETIONS, **HONOURED_CHAT, **HONOURED_VLLM}.values():
        file, _, name = test.rpartition("::")
        assert f"def {name}(" in (here / (file or Path(__file__).name)).read_text(), test
    for route, field, value in REFUSED:
        message = refused(server, route, {field: value}, field)
        assert field in message and ("not supported" in message or "unknown field" in message or "chat has none" in message)


def test_sampling_fields_reach_the_sampler(server):
    # a greedy continuation of a repetitive text repeats it; a penalty on repeats changes it
    echo = complete(server, prompt="la " * 20, max_tokens=16, ignore_eos=True)["choices"][0]["text"]
    for field, value in (("frequency_penalty", 2.0), ("presence_penalty", 2.0), ("repetition_penalty", 2.0)):
        penalised = complete(server, prompt="la " * 20, max_tokens=16, ignore_eos=True, **{field: value})
        assert penalised["choices"][0]["text"] != echo, field
    plain = complete(server, max_tokens=16, ignore_eos=True)["choices"][0]["text"]
    # top_k 1, top_p ~0 and min_p 1 each keep only the best token: sampling at temperature 2 is greedy
    for field, value in (("top_k", 1), ("top_p", 1e-6), ("min_p", 1.0)):
        hot = complete(server, max_tokens=16, ignore_eos=True, temperature=2.0, seed=3, **{field: value})
        assert hot["choices"][0]["text"] == plain, field
    # min_tokens: the end-of-sequence token is masked until then
    out = chat(server, max_tokens=40, min_tokens=30)
    assert out["usage"]["completion_tokens"] >= 30


def test_logit_bias_and_allowed_token_ids(server, tokenizer):
    token = tokenizer.encode(" banana", add_special_tokens=False)[-1]
    out = complete(server, logit_bias={str(token): 100}, logprobs=0)["choices"][0]
    assert out["logprobs"]["tokens"] == [tokenizer.decode([token])] * 8
    out = chat(server, logit_bias={str(token): 100})
    assert out["choices"][0]["message"]["content"] == tokenizer.decode([token] * 8)
    first = tokenizer.encode(complete(server, max_tokens=1)["choices"][0]["text"], add_special_tokens=False)[0]
    assert complete(server, max_tokens=1, logit_bias={str(first): -100})["choices"][0]["text"] != tokenizer.decode([first])
    allowed = tokenizer.encode(" red green blue", add_special_tokens=False)
    out = complete(server, allowed_token_ids=allowed, logprobs=0, max_tokens=6, ignore_eos=True)["choices"][0]
    assert {tokenizer.encode(t, add_special_tokens=False)[0] for t in out["logprobs"]["tokens"]} <= set(allowed)
    assert refused(server, "completions", {"logit_bias": {"x": 1}}, "logit_bias")
    assert refused(server, "completions", {"logit_bias": {"10": 500}}, None) is not None


def test_bad_words(server):
    text = complete(server, max_tokens=12)["choices"][0]["text"]
    word = text.split()[0]
    banned = complete(server, max_tokens=12, bad_words=[word])["choices"][0]["text"]
    assert word not in banned.split(), (text, banned)


def test_include_stop_str_in_output(server):
    text = complete(server, max_tokens=16, ignore_eos=True)["choices"][0]["text"]
    stop = text.split()[2]
    cut = complete(server, max_tokens=16, ignore_eos=True, stop=[stop])["choices"][0]
    kept = complete(server, max_tokens=16, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)["choices"][0]
    assert cut["finish_reason"] == kept["finish_reason"] == "stop"
    assert not cut["text"].endswith(stop) and kept["text"] == cut["text"] + stop
    assert chat(server, stop=["e"], include_stop_str_in_output=True)["choices"][0]["message"]["content"].endswith("e")


def test_skip_special_tokens(server, tokenizer):
    eos = tokenizer.eos_token_id
    body = dict(max_tokens=3, ignore_eos=True, logit_bias={str(eos): 100})
    assert complete(server, **body)["choices"][0]["text"] == ""
    assert complete(server, skip_special_tokens=False, **body)["choices"][0]["text"] == tokenizer.eos_token * 3
    # stop_token_ids: the same token ends the output once it is a stop token again
    out = complete(server, stop_token_ids=[eos], **body)["choices"][0]
    assert out["finish_reason"] == "stop" and out["text"] == ""


def test_echo_returns_the_prompt_with_its_logprobs(server, tokenizer, engine_dir):
    from bessemer.runtime.llm import LLM
    from bessemer.runtime.sampler import log_softmax

    ids = tokenizer.encode(PROMPT)
    out = complete(server, echo=True, logprobs=1, max_tokens=2)["choices"][0]
    assert out["text"].startswith(PROMPT) and len(out["logprobs"]["tokens"]) == len(ids) + 2
    lps = out["logprobs"]["token_logprobs"]
    assert lps[0] is None
    # oracle: the engine's own logits at every prompt position (scored in one prefill)
    logits = LLM(engine_dir, num_threads=1).score([ids])[0]  # (len, vocab)
    expected = [float(log_softmax(logits[i])[ids[i + 1]]) for i in range(len(ids) - 1)]
    np.testing.assert_allclose(lps[1:len(ids)], expected, atol=2e-3)  # bf16 engine: prefill vs chunked rows
    vllm = complete(server, prompt_logprobs=0, max_tokens=1)["choices"][0]["prompt_logprobs"]
    assert vllm[0] is None and len(vllm) == len(ids)
    np.testing.assert_allclose([vllm[i + 1][str(ids[i + 1])]["logprob"] for i in range(len(ids) - 1)], expected, atol=2e-3)
    assert complete(server, echo=True, max_tokens=1)["choices"][0]["text"].startswith(PROMPT)


def test_truncate_prompt_tokens(server):
    assert complete(server, truncate_prompt_tokens=3, max_tokens=1)["usage"]["prompt_tokens"] == 3
    assert chat(server, truncate_prompt_tokens=5, max_tokens=1)["usage"]["prompt_tokens"] == 5


def test_identifier_fields_are_taken(server):
    out = complete(server, user="u1", request_id="my-request-7")
    assert out["id"] == "my-request-7"
    assert chat(server, user="u", safety_identifier="s", prompt_cache_key="k")["choices"][0]["message"]["content"]


def test_chat_template_kwargs_and_add_generation_prompt(server):
    plain = chat(server, max_tokens=1)["usage"]["prompt_tokens"]
    persona = chat(server, max_completion_tokens=1, chat_template_kwargs={"persona": "You are terse."})
    assert persona["usage"]["prompt_tokens"] > plain + 3
    # without the generation prompt the "<|im_start|>assistant\n" the template adds is gone
    assert chat(server, max_tokens=1, add_generation_prompt=False)["usage"]["prompt_tokens"] < plain
    assert "messages" in refused(server, "chat", {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs")


def test_guided_choice_and_structured_outputs(server):
    colors = ["red", "green", "blue", "a long answer with \"quotes\""]
    for seed in range(4):
        # max_tokens: room for the longest choice (7 tokens) and the end of text after it
        out = complete(server, guided_choice=colors, temperature=1.0, seed=seed, n=2, max_tokens=16)
        assert all(c["text"] in colors and c["finish_reason"] == "stop" for c in out["choices"]), out
    cases = [({"choice": ["yes", "no"]}, lambda t: t in ("yes", "no")),
             ({"regex": "[0-9]{3}"}, lambda t: len(t) == 3 and t.isdigit()),
             ({"json": {"enum": ["north", "south", 7]}}, lambda t: json.loads(t) in ("north", "south", 7)),
             ({"grammar": 'root ::= "x" [0-9]'}, lambda t: len(t) == 2 and t[0] == "x")]
    for so, check in cases:
        choice = complete(server, structured_outputs=so, max_tokens=40, temperature=1.0, seed=1)["choices"][0]
        assert choice["finish_reason"] == "stop" and check(choice["text"]), (so, choice)
    # json_object: whatever is generated is a prefix of a JSON object (the model may not close it in time)
    text = complete(server, structured_outputs={"json_object": True}, max_tokens=12)["choices"][0]["text"]
    assert text.lstrip().startswith("{"), text
    # a regex through guided_regex, with 2000 choices in one request (a lexer terminal, not 2000 parser rows)
    many = [f"item{i}" for i in range(2500)]
    assert complete(server, guided_choice=many, max_tokens=8)["choices"][0]["text"] in many
    assert len(complete(server, guided_regex="[a-c]{4}")["choices"][0]["text"]) == 4


def test_conflicting_fields_are_400s(server):
    assert "best_of" in refused(server, "completions", {"best_of": 3, "n": 1}, "best_of")
    assert complete(server, best_of=2, n=2)["choices"][1]["index"] == 1  # best_of == n asks for nothing more
    assert "both constrain" in refused(server, "completions", {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice")
    assert "both constrain" in refused(server, "completions", {"response_format": {"type": "json_object"},
                                                              "structured_outputs": {"regex": "a"}},
                                       "structured_outputs.regex")
    assert "context length" in refused(server, "completions", {"max_tokens": 100_000}, "max_tokens")
    assert "context length" in refused(server, "chat", {"max_tokens": 100_000}, "max_tokens")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert "response_format" in refused(server, "chat", {"tools": tools, "tool_choice": "required",
                                                         "response_format": {"type": "json_object"}}, "response_format")
    assert "could not call" in refused(server, "chat", {"tools": tools, "response_format": {"type": "json_object"}},
                                       "response_format")


UNIT_DEFS = {"$defs": {"Unit": {"enum": ["celsius", "fahrenheit"]},
                       "Place": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]},
                                                                  "unit": {"$ref": "#/$defs/Unit"}},
                                 "required": ["city", "unit"]}},
             "type": "object", "properties": {"place": {"$ref": "#/$defs/Place"},
                                              "days": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 9},
                                                                 {"type": "null"}]}},
             "required": ["place", "days"]}


def test_strict_schemas_and_tool_schemas_as_people_write_them(server):
    tools = [{"type": "function", "function": {"name": "forecast", "parameters": UNIT_DEFS, "strict": True}},
             {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}]
    for seed in range(3):
        out = chat(server, tools=tools, tool_choice="required", temperature=1.0, seed=seed, max_tokens=80)
        choice = out["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        call = choice["message"]["tool_calls"][0]["function"]
        args = json.loads(call["arguments"])
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in tools}[call["name"]]
        jsonschema.validate(args, schema)
        if call["name"] == "forecast":  # closed objects: only the declared keys
            assert set(args) <= {"place", "days"} and set(args["place"]) <= {"city", "unit"}
    assert "recursive" in refused(server, "chat", {"tools": [{"type": "function", "function": {
        "name": "tree", "parameters": {"type": "object", "properties": {"child": {"$ref": "#"}}}}}],
        "tool_choice": "required"}, "tools")
    assert "does not resolve" in refused(server, "chat", {"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}}}],
        "tool_choice": "required"}, "tools")
    assert "strict" in refused(server, "chat", {"tools": tools[:1], "tool_choice": "auto"}, "tools")
    # response_format strict: an object schema left open is closed
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"]}
    for seed in range(3):
        out = chat(server, temperature=1.0, seed=seed, max_tokens=40, response_format={
            "type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}})
        assert list(json.loads(out["choices"][0]["message"]["content"])) == ["color"]


def test_parallel_tool_calls_false_keeps_the_first_call():
    from bessemer.serving.tool_parsers import FORMATS, parse

    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert [c["function"]["name"] for c in parse(text, FORMATS["hermes"])[1]] == ["a", "b"]
    assert [c["function"]["name"] for c in parse(text, FORMATS["hermes"], max_calls=1)[1]] == ["a"]


def chain(n: int) -> str:
    """A Lark grammar of n rules, each referring to the next: the compiler recurses n deep."""
    return "start: r0\n" + "".join(f'r{i}: r{i + 1} | "x"\n' for i in range(n)) + f'r{n}: "y"\n'


def test_constraints_that_break_the_compiler_or_matcher_fail_alone(server):
    errors = []
    stream = threading.Thread(target=lambda: errors.append(complete(server, max_tokens=200, ignore_eos=True)))
    stream.start()  # a long generation on another connection throughout
    # 100,000 nested rules overflow any compile stack: the helper process dies, not the server
    message = refused(server, "completions", {"guided_grammar": chain(100_000)}, None)
    assert "crashed" in message or "failed on it" in message, message
    assert httpx.get(f"{server.url}/health").status_code == 200
    # matcher limits hit while generating: finish_reason "error" with the reason, never "stop"
    for grammar in (chain(3000), "start: " + " | ".join(f'"w{i}"' for i in range(2001)) + "\n", 'start: "a" start\n'):
        choice = complete(server, guided_grammar=grammar)["choices"][0]
        assert choice["finish_reason"] == "error" and "constraint failed" in choice["error"]["message"], choice
    r = server.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "stream": True,
                                        "guided_grammar": 'start: "a" start\n'}, key=None)
    last = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")][-1]
    assert last["choices"][0]["finish_reason"] == "error" and last["choices"][0]["error"]["message"]
    # constraints that admit no output at all are refused before generating
    for body in ({"guided_json": {"$ref": "#"}}, {"guided_grammar": "root ::= root"}):
        assert "matches no output" in refused(server, "completions", body, None)
    stream.join()
    assert errors[0]["choices"][0]["finish_reason"] == "length"  # the other request never noticed


@pytest.mark.slow
def test_one_request_of_20000_prompts_does_not_starve_another(server):
    # ~100 tokens a prompt: 2 million tokens in all, hours of prefill in FIFO order on this
    # engine, and tokenized in seconds (the server tokenizes ~0.5M tokens/s)
    words = " ".join(f"w{i}" for i in range(30))
    body = json.dumps({"prompt": [f"{i} {words}" for i in range(20_000)], "max_tokens": 1, "temperature": 0}).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as big:
        big.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body)
        deadline = time.monotonic() + 240
        while server.metrics().get("bessemer_num_requests_waiting", 0) < 10_000:  # queued, in one command
            assert time.monotonic() < deadline, "the 20,000 prompts were never queued"
            time.sleep(0.5)
        latencies = []
        for _ in range(3):
            start = time.monotonic()
            r = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0}, key=None)
            assert r.status_code == 200
            latencies.append(time.monotonic() - start)
        print(f"another client's 2-token request while 20,000 prompts wait: {[round(t, 2) for t in latencies]} s")
        assert server.metrics()["bessemer_num_requests_waiting"] > 10_000  # the big request was still queued
        assert max(latencies) < 30, latencies  # FIFO admission took minutes
    # hung up: the 20,000 sequences are aborted
    deadline = time.monotonic() + 60
    while server.metrics()["bessemer_num_requests_waiting"] > 0:
        assert time.monotonic() < deadline, "the hung-up request's prompts stayed queued"
        time.sleep(0.5)
