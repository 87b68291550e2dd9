"""Tool calls as vLLM users know them: each `--tool-call-parser` format parsed from realistic
model text, whole and as a stream cut anywhere (the deltas add up to the whole result);
auto-detection from the chat template; `--chat-template`; and through a real `bessemer
serve` with the official openai client, streamed `delta.tool_calls` in "auto" mode that the
model really writes (SmolLM2, greedy, copies the call format from earlier turns of the
conversation), forced calls streamed a name and argument fragments at a time,
`parallel_tool_calls: false` while streaming, and tool_choice "none" on a template that
renders no tools.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest

from bessemer.errors import InvalidOptionError
from bessemer.runtime.tokenizer import check_chat_template
from bessemer.serving.tool_parsers import FORMATS, CallStream, parse, pick_format

# (format, model text, content, [(name, arguments)]); content None: no call, the whole text is content
CASES = [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
               '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET", "note": "a \\"}\\" b"}}\n</tool_call>',
     None, [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "CET", "note": 'a "}" b'})]),
    ("hermes", 'Let me check the weather.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
               '</tool_call>',
     "Let me check the weather.\n", [("get_weather", {"city": "Oslo"})]),
    ("hermes", '<tool_call>\n{"name": get_weather, "arguments": {}}\n</tool_call>', None, []),
    ("hermes", 'I would use <tool_call> here, but no.', None, []),
    ("hermes", '<tool_call>\n{"arguments": {"city": "Rome"}, "name": "get_weather"}\n</tool_call>',  # keys swapped
     None, [("get_weather", {"city": "Rome"})]),
    ("qwen3", '<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Rome"}}\n</tool_call>',
     "<think>\nThe user wants the weather.\n</think>\n\n", [("get_weather", {"city": "Rome"})]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]', None,
     [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", '
                '"arguments": {"zone": "UTC"}}]', None,
     [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})]),
    ("mistral", 'I will look it up. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
     "I will look it up. ", [("get_weather", {"city": "Rome"})]),
    ("mistral", '[TOOL_CALLS] get_weather(city="Paris")', None, []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None,
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": '
                    '{"zone": "UTC"}}', None, [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})]),
    ("llama3_json", 'Let me look that up. <|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
     "Let me look that up. ", [("get_weather", {"city": "Oslo"})]),
    ("llama3_json", '{"answer": 42, "name": 7}', None, []),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par', None, []),  # cut short by max_tokens
    ("forced", '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}', None,
     [("get_weather", {"city": "Rome", "unit": "celsius"})]),
    ("forced", '{ "name" : "get_time" , "arguments" : { "zone" : "a\\\\b" } }', None, [("get_time", {"zone": "a\\b"})]),
]


def streamed(fmt: str, text: str, rng: random.Random, max_calls: int | None = None):
    """(content, [(name, arguments text)], the delta entries) of `text` fed in pieces of 1-7 characters."""
    stream, entries, content, at = CallStream(FORMATS[fmt], max_calls), [], "", 0
    while True:
        size = rng.randint(1, 7)
        piece = stream.feed(text[at:at + size], final=at + size >= len(text))
        content += piece.content
        entries += piece.tool_calls
        at += size
        if at >= len(text):
            break
    calls: list[list] = []
    for e in entries:
        if "id" in e:
            assert e["type"] == "function" and e["id"].startswith("call_") and e["index"] == len(calls)
            calls.append([e["function"]["name"], ""])
        else:  # after the first, a call's entries carry argument fragments only
            assert set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
            assert e["index"] == len(calls) - 1
        calls[-1][1] += e["function"].get("arguments", "")
    return content, [tuple(c) for c in calls], entries


@pytest.mark.parametrize("fmt,text,content,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_format_parses_realistic_text(fmt, text, content, expected):
    got_content, calls = parse(text, FORMATS[fmt])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == expected
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert got_content == (text if not expected else content)


@pytest.mark.parametrize("fmt,text,content,expected", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_streaming_in_random_pieces_adds_up_to_the_whole(fmt, text, content, expected):
    whole_content, whole_calls = parse(text, FORMATS[fmt])
    for seed in range(25):
        got_content, calls, _ = streamed(fmt, text, random.Random(seed))
        if whole_calls:
            assert calls == [(c["function"]["name"], c["function"]["arguments"]) for c in whole_calls]
            assert got_content == (whole_content or "")
        elif expected == [] and text.endswith("Par"):  # a call cut short: the stream had begun it
            assert calls == [("get_weather", '{"city": "Par')]
        else:  # not a call: the stream sends the text unchanged, as content
            assert (got_content, calls) == (text, [])


def test_arguments_stream_while_they_are_written():
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    stream = CallStream(FORMATS["hermes"])
    pieces = [stream.feed(ch, final=i == len(text) - 1) for i, ch in enumerate(text)]
    first = next(i for i, p in enumerate(pieces) if p.tool_calls)
    assert text[:first + 1].endswith('"arguments":')  # the name goes out as soon as its header is read
    fragments = [p.tool_calls[0]["function"]["arguments"] for p in pieces[first + 1:] if p.tool_calls]
    assert len(fragments) > 10 and "".join(fragments) == '{"city": "Paris", "unit": "celsius"}'
    assert stream.num_complete == 1 and not any(p.content for p in pieces)


def test_parallel_tool_calls_false_keeps_the_first_call_when_streaming():
    text = CASES[1][1]
    for seed in range(10):
        content, calls, _ = streamed("hermes", text, random.Random(seed), max_calls=1)
        assert content == "" and calls == [("get_weather", '{"city": "Paris"}')]
    assert [c["function"]["name"] for c in parse(text, FORMATS["hermes"], max_calls=1)[1]] == ["get_weather"]


def test_auto_picks_the_format_the_chat_template_asks_for():
    qwen = '... within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, ...}\n</tool_call>'
    mistral = '{%- if message.tool_calls %}{{ "[TOOL_CALLS][" }}{% endif %}'
    llama = '{{- "<|python_tag|>" }} Respond in the format {"name": function name, "parameters": dictionary}'
    assert pick_format("auto", qwen).name == "hermes"
    assert pick_format("auto", mistral).name == "mistral"
    assert pick_format("auto", llama).name == "llama3_json"
    assert pick_format("auto", None).name == "hermes"  # the common format when the template does not say
    assert pick_format("mistral", qwen).name == "mistral"  # a named parser wins over the template
    with pytest.raises(InvalidOptionError, match="unknown tool-call parser 'pythonic'"):
        pick_format("pythonic", qwen)


def test_bad_chat_template_files_are_one_line_errors(tmp_path):
    with pytest.raises(InvalidOptionError, match="line 1"):
        check_chat_template("{% if messages %}", "--chat-template t.jinja")
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes(b"caf\xe9 {{ messages }}")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }}")
    for path, message in ((tmp_path / "missing.jinja", "does not exist"), (latin1, "is not UTF-8"),
                          (broken, "does not parse as a Jinja template")):
        # refused before the engine loads: the engine directory need not even exist
        proc = subprocess.run([sys.executable, "-m", "bessemer.cli.main", "serve", str(tmp_path / "no-engine"),
                               "--chat-template", str(path)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and "--chat-template" in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ---- through a real server ----
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user query."
    "\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n\nFor each function call, return a "
    "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MISTRAL_TEMPLATE = HERMES_TEMPLATE.replace(
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>", "as a JSON list after [TOOL_CALLS]")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def conversation(answer: str) -> list[dict]:
    """Three earlier turns in which the assistant answered `answer`: SmolLM2 answers the
    same question the same way (greedy), so it writes the call format for real."""
    return [QUESTION, {"role": "assistant", "content": answer}] * 3 + [QUESTION]


@pytest.fixture(scope="module")
def servers(smollm2_engine, tmp_path_factory):
    """hermes: SmolLM2 with `--chat-template` (auto-detects hermes); mistral: an engine copy
    whose own template asks for [TOOL_CALLS]; plain: SmolLM2's template, no tools."""
    from test_serve import Server

    engine = smollm2_engine("bfloat16")
    tmp = tmp_path_factory.mktemp("tool-parsers")
    (tmp / "hermes.jinja").write_text(HERMES_TEMPLATE)
    copy = tmp / "mistral-engine"
    copy.mkdir()
    for f in engine.iterdir():
        if f.name != "chat_template.jinja":
            (copy / f.name).symlink_to(f)
    (copy / "chat_template.jinja").write_text(MISTRAL_TEMPLATE)
    started = {"hermes": Server(engine, tmp / "hermes.log", "--chat-template", str(tmp / "hermes.jinja")),
               "mistral": Server(copy, tmp / "mistral.log"),
               "plain": Server(engine, tmp / "plain.log", "--tool-call-parser", "llama3_json"),
               "llama3_json": Server(engine, tmp / "llama3.log", "--chat-template", str(tmp / "hermes.jinja"),
                                     "--tool-call-parser", "llama3_json"),
               "qwen3": Server(engine, tmp / "qwen3.log", "--chat-template", str(tmp / "hermes.jinja"),
                               "--tool-call-parser", "qwen3")}
    try:
        for s in started.values():
            s.wait_ready()
        yield started
    finally:
        for s in started.values():
            s.stop()


def stream_chat(server, messages, **kw):
    """(content, {index: [name, arguments]}, the tool-call deltas, finish reasons) of a streamed chat."""
    stream = server.client().chat.completions.create(model="smollm2", messages=messages, temperature=0,
                                                     max_tokens=60, stream=True, **kw)
    content, calls, deltas, reasons, order = "", {}, [], [], []
    for chunk in stream:
        for c in chunk.choices:
            if c.delta.content:
                content += c.delta.content
                order.append("content")
            for tc in c.delta.tool_calls or []:
                deltas.append(tc)
                order.append("call")
                if tc.id is not None:
                    assert tc.type == "function" and tc.function.name and not tc.function.arguments
                    calls[tc.index] = [tc.function.name, ""]
                else:
                    assert tc.function.name is None
                calls[tc.index][1] += tc.function.arguments or ""
            if c.finish_reason is not None:
                reasons.append(c.finish_reason)
    if "call" in order:  # content before a call streams first, as content
        assert "content" not in order[order.index("call"):]
    return content, calls, deltas, reasons


def test_hermes_auto_calls_stream_like_vllm(servers):
    server = servers["hermes"]
    answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls, deltas, reasons = stream_chat(server, conversation(answer), tools=[WEATHER])
    assert content == "Let me check.\n" and reasons == ["tool_calls"]
    assert calls == {0: ["get_weather", '{"city": "Paris"}']}
    assert len(deltas) > 3  # the name, then the arguments a token or so at a time
    whole = server.client().chat.completions.create(model="smollm2", messages=conversation(answer), temperature=0,
                                                    max_tokens=60, tools=[WEATHER]).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.content == content
    assert [(c.function.name, c.function.arguments) for c in whole.message.tool_calls] == [tuple(calls[0])]


def test_parallel_tool_calls_false_holds_when_streaming(servers):
    two = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
           '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>')
    _, calls, _, reasons = stream_chat(servers["hermes"], conversation(two), tools=[WEATHER])
    assert calls == {0: ["get_weather", '{"city": "Paris"}'], 1: ["get_weather", '{"city": "Rome"}']}
    _, calls, _, reasons = stream_chat(servers["hermes"], conversation(two), tools=[WEATHER], parallel_tool_calls=False)
    assert calls == {0: ["get_weather", '{"city": "Paris"}']} and reasons == ["tool_calls"]


def test_forced_calls_stream_name_first_then_arguments(servers):
    content, calls, deltas, reasons = stream_chat(servers["hermes"], [QUESTION], tools=[WEATHER],
                                                  tool_choice="required")
    assert content == "" and reasons == ["tool_calls"] and calls[0][0] == "get_weather"
    assert isinstance(json.loads(calls[0][1])["city"], str)
    assert deltas[0].function.name == "get_weather" and len(deltas) > 2


def test_mistral_auto_calls_stream(servers):
    answer = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    content, calls, deltas, reasons = stream_chat(servers["mistral"], conversation(answer), tools=[WEATHER])
    assert content == "" and reasons == ["tool_calls"] and len(deltas) > 3
    assert calls == {0: ["get_weather", '{"city": "Paris"}']}


@pytest.mark.parametrize("parser, answer", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("qwen3", '<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
              '"arguments": {"city": "Paris"}}\n</tool_call>'),
])
def test_llama3_json_and_qwen3_auto_calls_stream(servers, parser, answer):
    """The two other parsers through a real server named by --tool-call-parser."""
    content, calls, deltas, reasons = stream_chat(servers[parser], conversation(answer), tools=[WEATHER])
    assert reasons == ["tool_calls"] and len(deltas) > 3, (content, calls, reasons)
    assert calls == {0: ["get_weather", '{"city": "Paris"}']}
    assert "<tool_call>" not in content and "get_weather" not in content


def test_tool_choice_none_on_a_template_without_tools(servers):
    server = servers["plain"]
    answer = '{"name": "get_weather", "parameters": {"city": "Paris"}}'  # llama3_json, this server's parser
    r = server.post("/v1/chat/completions", {"messages": conversation(answer), "tools": [WEATHER],
                                             "tool_choice": "auto", "max_tokens": 8}, key=None)
    assert r.status_code == 400 and "does not support tools" in r.json()["error"]["message"]
    for stream in (False, True):  # the tools are not rendered, and nothing is parsed as a call
        if stream:
            content, calls, _, reasons = stream_chat(server, conversation(answer), tools=[WEATHER], tool_choice="none")
        else:
            choice = server.client().chat.completions.create(
                model="smollm2", messages=conversation(answer), tools=[WEATHER], tool_choice="none", temperature=0,
                max_tokens=60).choices[0]
            content, calls, reasons = choice.message.content, choice.message.tool_calls or {}, [choice.finish_reason]
        assert content == answer and not calls and reasons == ["stop"]


def test_markers_that_are_special_tokens_are_known(smollm2_engine):
    """The server decodes with skip_special_tokens false when a format's marker is a special
    token (a real Mistral's [TOOL_CALLS]); SmolLM2's chat markers are, plain text is not."""
    from bessemer.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(smollm2_engine("bfloat16"))
    assert tokenizer.is_special("<|im_end|>") and not tokenizer.is_special("<tool_call>")
    assert not tokenizer.is_special("[TOOL_CALLS]")  # not one token here
