"""Structured output: every constrained request yields text that parses and validates
(many seeds, SmolLM2), through LLM and through a real `bessemer serve` driven by the
official openai client (response_format, guided_regex, tools / tool_choice); with and
without speculative decoding."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bessemer.errors import InvalidOptionError, RequestError
from bessemer.runtime.llm import LLM, SamplingParams

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "city": {"enum": ["Paris", "Rome", "Oslo"]}}}
CODE = r"[A-Z]{2}-[0-9]{3}"
YES_NO = 'root ::= answer " (" [0-9] ")"\nanswer ::= "yes" | "no"'
ASK = [{"role": "user", "content": "Describe a person as JSON with name, age and city."}]


@pytest.fixture(scope="module")
def llms(smollm2_engine):
    engine = smollm2_engine("bfloat16")
    return LLM(engine, num_threads=2), LLM(engine, num_threads=2, speculative={"method": "ngram", "num_tokens": 3})


@pytest.mark.parametrize("spec", [False, True], ids=["plain", "ngram"])
def test_constrained_outputs_always_validate(llms, spec):
    llm = llms[spec]
    ids = llm.tokenizer.encode_chat(ASK)
    requests = [SamplingParams(max_tokens=60, temperature=1.0, seed=10, n=8, json_schema=PERSON),
                SamplingParams(max_tokens=20, temperature=1.0, seed=20, n=6, regex=CODE),
                SamplingParams(max_tokens=20, temperature=1.0, seed=30, n=6, grammar=YES_NO),
                SamplingParams(max_tokens=12, temperature=0)]  # unconstrained, in the same batch
    outs = llm.generate([ids] * len(requests), requests)
    for c in outs[0].outputs:
        assert c.finish_reason == "stop", c.text
        jsonschema.validate(json.loads(c.text), PERSON)
    assert all(re.fullmatch(CODE, c.text) for c in outs[1].outputs), [c.text for c in outs[1].outputs]
    assert all(re.fullmatch(r"(yes|no) \([0-9]\)", c.text) for c in outs[2].outputs), [c.text for c in outs[2].outputs]
    assert not outs[3].text.startswith("{")  # the batch's unconstrained request is free
    assert llm.blocks.num_free == llm.num_kv_blocks


def test_greedy_constrained_is_the_same_with_speculation(llms):
    plain, spec = llms
    ids = plain.tokenizer.encode_chat(ASK)
    params = SamplingParams(max_tokens=60, temperature=0, json_schema=PERSON, logprobs=1)
    a, b = plain.generate([ids], params)[0], spec.generate([ids], params)[0]
    assert a.token_ids == b.token_ids and a.text == b.text


def test_bad_constraints_are_one_clear_error(llms):
    llm = llms[0]
    with pytest.raises(InvalidOptionError, match="at most one"):
        SamplingParams(regex="a", grammar='root ::= "a"')
    with pytest.raises(RequestError, match="regex constraint does not compile"):
        llm.generate([[1, 2, 3]], SamplingParams(regex="[0-9"))
    assert llm.blocks.num_free == llm.num_kv_blocks and not llm.has_unfinished()


# ---- the OpenAI server ----
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou can call these functions: {{ tools | tojson }}\n"
    "Call one by answering with a JSON object {\"name\": ..., \"arguments\": ...}.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                   "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                  "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "additionalProperties": False, "required": ["zone"],
                                       "properties": {"zone": {"type": "string", "maxLength": 10}}}}}


@pytest.fixture(scope="module")
def server(smollm2_engine, tmp_path_factory):
    """SmolLM2 bf16 with n-gram speculation, from a copy of the engine whose chat template
    renders tools (SmolLM2's own does not)."""
    from test_serve import Server

    engine = smollm2_engine("bfloat16")
    copy = tmp_path_factory.mktemp("tool-engine") / "engine"
    copy.mkdir()
    for f in engine.iterdir():
        (copy / f.name).symlink_to(f)
    (copy / "chat_template.jinja").unlink()
    (copy / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    s = Server(copy, tmp_path_factory.mktemp("logs") / "server.log", "--speculative", "ngram",
               "--num-speculative-tokens", "3")
    s.wait_ready()
    yield s
    s.stop()


def test_response_format_json_schema_and_object(server):
    client = server.client()
    for seed in range(6):
        r = client.chat.completions.create(
            model="smollm2", messages=ASK, temperature=1.0, seed=seed, max_tokens=60,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    r = client.chat.completions.create(model="smollm2", messages=ASK, temperature=0.7, seed=1, max_tokens=80,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":  # a free-form object may outgrow max_tokens
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = client.completions.create(model="smollm2", prompt="Part number:", max_tokens=12, temperature=1.0, seed=3,
                                  n=4, extra_body={"guided_regex": CODE})
    assert all(re.fullmatch(CODE, c.text) for c in r.choices), [c.text for c in r.choices]


def test_tool_calls_in_openai_shape(server):
    client = server.client()
    ask = [{"role": "user", "content": "What is the weather in Rome?"}]
    for seed in range(4):
        r = client.chat.completions.create(model="smollm2", messages=ask, tools=[WEATHER, TIME],
                                           tool_choice="required", temperature=1.0, seed=seed, max_tokens=60)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.id.startswith("call_")
        spec = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]["function"]
        jsonschema.validate(json.loads(call.function.arguments), spec["parameters"])
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model="smollm2", messages=ask, tools=[WEATHER, TIME], tool_choice=named,
                                       temperature=0, max_tokens=60)
    assert r.choices[0].message.tool_calls[0].function.name == "get_time"
    stream = client.chat.completions.create(model="smollm2", messages=ask, tools=[WEATHER], tool_choice="required",
                                            temperature=0, max_tokens=60, stream=True)
    deltas = [tc for chunk in stream for c in chunk.choices for tc in (c.delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call_")
    assert len(deltas) > 2  # the name first, then the arguments a fragment at a time
    arguments = "".join(d.function.arguments or "" for d in deltas)
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])


def test_errors_and_speculation_metrics(server, smollm2_engine):
    r = server.post("/v1/chat/completions", {"messages": ASK, "guided_regex": "[0-9"}, key=None)
    assert r.status_code == 400 and "does not compile" in r.json()["error"]["message"]
    r = server.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER],
                                             "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                    key=None)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    # a prompt that repeats itself gives the n-gram proposer matches, whatever ran before
    # on this server (tests may run in any order, on any xdist worker)
    count = "one two three four five six seven eight nine ten " * 4
    r = server.post("/v1/completions", {"prompt": count, "max_tokens": 24, "temperature": 0}, key=None)
    assert r.status_code == 200
    metrics = server.metrics()
    assert metrics["bessemer_spec_decode_num_draft_tokens_total"] > 0
    assert 0 <= metrics["bessemer_spec_decode_draft_acceptance_rate"] <= 1


def test_tools_need_a_template_that_renders_them(smollm2_engine):
    llm_tok = LLM(smollm2_engine("bfloat16"), num_threads=1).tokenizer
    assert not llm_tok.supports_tools
    with pytest.raises(RequestError, match="does not support tools"):
        llm_tok.encode_chat(ASK, tools=[WEATHER])


def test_run_engine_json_schema_flag(smollm2_engine, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(PERSON))
    proc = subprocess.run([sys.executable, "-m", "bessemer.cli.run", str(smollm2_engine("bfloat16")), "--chat", "--prompt", ASK[0]["content"],
                           "--json-schema", str(schema), "--max-new-tokens", "60", "--json", "-q",
                           "--speculative", "ngram"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    jsonschema.validate(json.loads(json.loads(proc.stdout)["text"]), PERSON)


def test_json_whitespace_is_bounded(smollm2_dir):
    """Between JSON tokens: nothing, one space, or a newline and an indent of up to 20 (so a
    sampled model cannot spend max_tokens on newlines inside a valid object); compact and
    pretty-printed JSON both pass. Oracle: llguidance's matcher on SmolLM2's tokens."""
    import llguidance
    import llguidance.hf
    from transformers import AutoTokenizer

    from bessemer.runtime.grammar_compiler import GrammarCompiler

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    lltok = llguidance.hf.from_tokenizer(tok)
    schema = json.dumps({"type": "object", "properties": {"color": {"enum": ["red", "blue"]}}, "required": ["color"]})
    grammar = GrammarCompiler._grammar(llguidance, "json_schema", schema)

    def accepts(text: str) -> bool:
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        return all(m.consume_token(t) for t in tok.encode(text, add_special_tokens=False)) and m.is_accepting()

    assert accepts('{"color":"red"}') and accepts('{"color": "red"}') and accepts('{\n  "color": "red"\n}')
    assert not accepts('{\n\n\n\n"color":"red"}') and not accepts('{  "color":"red"}')
