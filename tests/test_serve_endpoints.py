"""`bessemer serve`'s vLLM-style extras (issue 35): /tokenize, /detokenize, /version,
/v1/models/{id}, CORS, and the graceful drain on SIGTERM; real subprocesses of the bf16
SmolLM2 engine, as in test_serve.py.

Two servers: `server` (module-wide: an API key, one CORS origin, a small body limit) and
`drained`, started by the drain test and stopped by its SIGTERM. `server` is SIGTERMed
twice by the last test (the second signal cuts its drain short).
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest

from test_serve import KEY, MODEL, Server

httpx = pytest.importorskip("httpx")

AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://app.example"
MAX_BODY = 100_000
DRAIN_S = 10.0  # the drain test's --drain-timeout: its short requests need ~2 s of it


@pytest.fixture(scope="module")
def engine(smollm2_engine):
    return smollm2_engine("bfloat16")


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    s = Server(engine, tmp_path_factory.mktemp("endpoints-logs") / "server.log", "--api-key", KEY,
               "--allowed-origins", json.dumps([ORIGIN]), "--max-request-bytes", str(MAX_BODY))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def tokenizer(engine):
    from bessemer.runtime.tokenizer import Tokenizer

    return Tokenizer(engine)


def post(server, path: str, body, headers=AUTH) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=60)


def assert_openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param, error
    return error


def test_tokenize_and_detokenize_agree_with_the_tokenizer_and_the_chat_route(server, tokenizer):
    text = "The capital of France is Paris."
    for special in (True, False):
        r = post(server, "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": special})
        assert r.status_code == 200, r.text
        assert r.json() == {"count": len(tokenizer.encode(text, special)), "max_model_len": 2048,
                            "tokens": tokenizer.encode(text, special)}
    tokens = post(server, "/tokenize", {"prompt": text}).json()["tokens"]
    assert post(server, "/detokenize", {"model": MODEL, "tokens": tokens}).json() == {"prompt": text}

    # messages go through the chat template exactly as chat completions renders them
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = post(server, "/tokenize", {"messages": messages}).json()
    served = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 1}).json()
    assert chat["count"] == len(chat["tokens"]) == served["usage"]["prompt_tokens"]
    without = post(server, "/tokenize", {"messages": messages, "add_generation_prompt": False}).json()
    assert without["count"] < chat["count"] and chat["tokens"][:without["count"]] == without["tokens"]


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"prompt": "hi", "bogus": 1}, 400, "bogus"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}, 400, "prompt"),
    ("/tokenize", {"prompt": 5}, 400, "prompt"),
    ("/tokenize", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"messages": []}},
     400, "chat_template_kwargs"),
    ("/tokenize", b"{not json", 400, None),
    ("/tokenize", {"prompt": "x" * (MAX_BODY + 1)}, 413, None),
    ("/detokenize", {"tokens": [1, 2, 10 ** 6]}, 400, "tokens"),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "hello"}, 400, "tokens"),
    ("/detokenize", {"tokens": [1], "skip_special_tokens": True}, 400, "skip_special_tokens"),
])
def test_bad_tokenize_requests_get_openai_errors(server, path, body, status, param):
    assert_openai_error(post(server, path, body), status, param)


def test_version_is_open_and_the_rest_need_the_key(server):
    import bessemer

    assert httpx.get(f"{server.url}/version").json() == {"version": bessemer.__version__}
    for method, path in [("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", f"/v1/models/{MODEL}")]:
        r = httpx.request(method, f"{server.url}{path}", json={"prompt": "hi", "tokens": [1]})
        assert assert_openai_error(r, 401)["code"] == "invalid_api_key"


def test_model_by_id(server):
    card = httpx.get(f"{server.url}/v1/models/{MODEL}", headers=AUTH).json()
    assert card == httpx.get(f"{server.url}/v1/models", headers=AUTH).json()["data"][0]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 2048
    error = assert_openai_error(httpx.get(f"{server.url}/v1/models/org/other-model", headers=AUTH), 404, "model")
    assert error["code"] == "model_not_found" and "org/other-model" in error["message"]
    model = server.client().models.retrieve(MODEL)  # the official client's call
    assert model.id == MODEL


def test_cors_preflight_and_headers_for_the_allowed_origin_only(server):
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    r = httpx.options(f"{server.url}/v1/chat/completions", headers=preflight)  # no key: browsers send none
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": ORIGIN, **AUTH})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    r = httpx.get(f"{server.url}/v1/models", headers={"Origin": ORIGIN})  # errors carry it too
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(f"{server.url}/v1/chat/completions", headers={**preflight, "Origin": "https://evil.example"})
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("flags, message", [
    (["--allowed-origins", "[bad json"], "--allowed-origins is not a valid JSON list"),
    (["--allowed-origins", "https://a.example/path"], "is not an origin"),
    (["--allowed-methods", "GET, P O S T"], "--allowed-methods: 'P O S T' is not an HTTP token"),
    (["--drain-timeout", "-1"], "--drain-timeout must be a number of seconds >= 0"),
])
def test_bad_cors_and_drain_flags_fail_before_the_engine_loads(flags, message, tmp_path):
    from click.testing import CliRunner

    from bessemer.cli.serve import main

    res = CliRunner().invoke(main, [str(tmp_path / "no-engine-here"), *flags])
    assert res.exit_code == 1 and message in res.output, res.output


def test_cors_flags_take_json_or_comma_lists():
    from bessemer.serving.cors import CorsPolicy

    assert CorsPolicy.from_flags(None, None, None) == CorsPolicy((), ("*",), ("*",))
    policy = CorsPolicy.from_flags('["https://a.example/", "http://localhost:3000"]', "GET,POST", " Authorization ")
    assert policy == CorsPolicy(("https://a.example", "http://localhost:3000"), ("GET", "POST"), ("Authorization",))


STORY = {"model": MODEL, "prompt": "Once upon a time, in a quiet harbour town,", "temperature": 0, "ignore_eos": True}


def stream(server, body: dict, out: dict, started: threading.Event, headers=None) -> None:
    """Streams `body` into out["text"], out["finish_reason"], out["error"] (an SSE error event)."""
    text = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}, headers=headers,
                      timeout=120) as r:
        out["status"] = r.status_code
        for line in r.iter_lines():
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            started.set()
            if "error" in chunk:
                out["error"] = chunk["error"]
                break
            text.append(chunk["choices"][0]["text"])
            out["finish_reason"] = chunk["choices"][0]["finish_reason"] or out.get("finish_reason")
    out["text"] = "".join(text)
    started.set()


@pytest.mark.slow
def test_sigterm_drains_running_requests_then_aborts_what_outlives_the_timeout(engine, tmp_path):
    s = Server(engine, tmp_path / "drained.log", "--drain-timeout", str(DRAIN_S))
    try:
        s.wait_ready()
        # without --allowed-origins: no CORS headers at all
        r = httpx.options(f"{s.url}/v1/completions",
                          headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
        assert not any(h.startswith("access-control-") for h in r.headers), r.headers
        short = {**STORY, "max_tokens": 48}
        alone = httpx.post(f"{s.url}/v1/completions", json=short, timeout=120).json()["choices"][0]["text"]

        plain: dict = {}
        plain_thread = threading.Thread(target=lambda: plain.setdefault(
            "r", httpx.post(f"{s.url}/v1/completions", json=short, timeout=120)))
        plain_thread.start()
        time.sleep(0.3)  # it arrives before the signal
        streamed, long = {}, {}
        threads, events = [], []
        for out, body in ((streamed, short), (long, {**STORY, "max_tokens": 1500})):
            events.append(threading.Event())
            threads.append(threading.Thread(target=stream, args=(s, body, out, events[-1])))
            threads[-1].start()
        assert all(e.wait(60) for e in events), "the streams did not start"

        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        health = httpx.get(f"{s.url}/health", timeout=5)
        assert_openai_error(health, 503)
        assert "shutting down" in health.json()["error"]["message"]
        refused = httpx.post(f"{s.url}/v1/completions", json=short, timeout=10)
        assert assert_openai_error(refused, 503)["code"] == "service_unavailable"
        assert httpx.get(f"{s.url}/version", timeout=5).status_code == 200  # still listening

        plain_thread.join(60)
        threads[0].join(60)
        assert time.monotonic() - t0 < DRAIN_S, "the short requests should finish inside the drain"
        got = plain["r"].json()
        assert plain["r"].status_code == 200 and got["choices"][0]["finish_reason"] == "length", got
        assert got["choices"][0]["text"] == alone and got["usage"]["completion_tokens"] == 48
        assert streamed.get("error") is None and streamed["finish_reason"] == "length"
        assert streamed["text"] == alone

        # the long one outlives the drain: aborted at its end, with an error event, and exit 0
        assert s.proc.wait(timeout=DRAIN_S + 5) == 0, s.log_path.read_text()[-2000:]
        elapsed = time.monotonic() - t0
        threads[1].join(10)
        assert long.get("error") is not None and "shutting down" in long["error"]["message"], long
        assert DRAIN_S - 0.5 <= elapsed < DRAIN_S + 3, elapsed
    finally:
        s.stop()


def test_a_second_sigterm_aborts_the_drain_at_once(server):
    """Last: `server` had the default 25 s drain; the second signal ends it."""
    out, started = {}, threading.Event()
    worker = threading.Thread(target=stream, args=(server, {**STORY, "max_tokens": 1500}, out, started, AUTH))
    worker.start()
    assert started.wait(60)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 503
    assert not out.get("text") and worker.is_alive()  # still generating, drained
    t0 = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 0
    worker.join(10)
    assert time.monotonic() - t0 < 5
    assert out.get("error") is not None and "shutting down" in out["error"]["message"], out
