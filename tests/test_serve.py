"""`bessemer serve` as a real subprocess on loopback, driven by the official openai client.

Two servers of the bf16 SmolLM2 engine run for the whole module: `server` (defaults, with
an API key) and `small` (`--kv-cache-gib 0 --no-prefix-cache`: the minimum KV pool, so
concurrent long prompts must be preempted, and no prefix cache, so it is the reference for
prefix-cache hits; `--drain-timeout 0`: SIGTERM aborts at once; `--stream-interval-ms 200`:
a stream's tokens go out together). Outputs are greedy, so
"correct" means "equal to the same request served alone". `small` is SIGTERMed by the
last test.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from ports import free_port
from tolerances import PREEMPTION_TIE_MARGIN

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

MODEL = "smollm2"
KEY = "test-key"


class Server:
    BIND_RETRIES = 5  # another process may take the port between free_port() and the server's bind

    def __init__(self, engine, log_path, *flags: str):
        self.engine, self.flags = engine, flags
        self.log_path = log_path
        self.key = KEY if "--api-key" in flags else "unused"
        self.binds_left = self.BIND_RETRIES
        self.start()

    def start(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bessemer.cli.main", "serve", str(self.engine), "--port", str(self.port),
             "--model-name", MODEL, "--log-level", "warning", *self.flags],
            stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and "address already in use" in self.log_path.read_text() \
                    and self.binds_left > 0:
                self.binds_left -= 1
                self.start()
                continue
            assert self.proc.poll() is None, f"server exited {self.proc.returncode}:\n{self.log_path.read_text()}"
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not ready:\n{self.log_path.read_text()}")

    def client(self):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=120)

    def metrics_text(self) -> str:
        return httpx.get(f"{self.url}/metrics", headers={"Authorization": f"Bearer {self.key}"}).text

    def metrics(self) -> dict[str, float]:
        """Series -> value, keyed without the model_name label every series carries
        (`bessemer_request_success_total{finished_reason="stop"}`)."""
        def key(series: str) -> str:
            return re.sub(r'model_name="[^"]*",?', "", series).replace("{}", "")

        return {key(line.rsplit(" ", 1)[0]): float(line.rsplit(" ", 1)[1])
                for line in self.metrics_text().splitlines() if line and not line.startswith("#")}

    def post(self, path: str, body, key: str | None = KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return httpx.post(f"{self.url}{path}", content=content, headers=headers, timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def servers(smollm2_engine, tmp_path_factory):
    engine = smollm2_engine("bfloat16")
    logs = tmp_path_factory.mktemp("serve-logs")
    started = [Server(engine, logs / "server.log", "--api-key", KEY),
               Server(engine, logs / "small.log", "--kv-cache-gib", "0", "--no-prefix-cache",
                      "--drain-timeout", "0", "--stream-interval-ms", "200")]
    try:
        for s in started:
            s.wait_ready()
        yield started
    finally:
        for s in started:
            s.stop()


@pytest.fixture(scope="module")
def server(servers):
    return servers[0]


@pytest.fixture(scope="module")
def small(servers):
    return servers[1]


@pytest.fixture(scope="module")
def tokenizer(smollm2_engine):
    from bessemer.runtime.tokenizer import Tokenizer

    return Tokenizer(smollm2_engine("bfloat16"))


def token_prompt(tokenizer, seed: int, length: int) -> list[int]:
    """A distinct prompt of exactly `length` tokens."""
    words = " ".join(f"{w}{(seed * 7919 + i * 104729) % 1000}" for i, w in
                     enumerate(["river", "stone", "lamp", "orbit", "cedar", "violet"] * (length // 2)))
    return tokenizer.encode(f"Record {seed}: {words}", add_special_tokens=False)[:length]


def complete(client, prompt, max_tokens=12, **extra):
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    extra_body={"ignore_eos": True, **extra})
    return out.choices[0].text


def test_completions_and_chat_stream_like_plain(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == [MODEL]

    plain = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12, temperature=0)
    assert plain.choices[0].text and plain.choices[0].finish_reason in ("stop", "length")
    assert plain.usage.prompt_tokens > 0 and plain.usage.total_tokens == plain.usage.prompt_tokens + plain.usage.completion_tokens
    chunks = list(client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=12,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == plain.choices[0].text
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    streamed = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                              stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content

    # n, logprobs and several prompts in one request
    out = client.completions.create(model=MODEL, prompt=["Once upon", "Hello"], max_tokens=4, temperature=0,
                                    n=2, logprobs=2)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert out.choices[0].text == out.choices[1].text  # greedy: both samples agree
    assert len(out.choices[0].logprobs.tokens) == 4 and len(out.choices[0].logprobs.top_logprobs[0]) == 2
    chat_lp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, temperature=0,
                                             logprobs=True, top_logprobs=3)
    assert len(chat_lp.choices[0].logprobs.content) == 3
    assert len(chat_lp.choices[0].logprobs.content[0].top_logprobs) == 3


def test_concurrent_requests_match_one_at_a_time(server):
    client = server.client()
    prompts = [f"Fact number {i} about the ocean is that" for i in range(32)]  # the 32
    alone = [complete(client, p) for p in prompts]
    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(lambda p: complete(client, p), prompts))
    assert together == alone


def test_small_kv_pool_preempts_and_stays_correct(server, small, tokenizer):
    # 8 prompts of 250 tokens take 16 blocks each: together the whole minimum pool (128
    # blocks of 16 for max_seq_len 2048). Past 256 tokens each needs a 17th block, so some
    # are preempted and recomputed.
    prompts = [token_prompt(tokenizer, i, 250) for i in range(8)]

    def greedy(client, p):
        return client.completions.create(model=MODEL, prompt=p, max_tokens=16, temperature=0,
                                         logprobs=2).choices[0].logprobs

    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: greedy(small.client(), p), prompts))
    assert small.metrics()["bessemer_num_preemptions_total"] > 0
    for got, ref in zip(together, [greedy(server.client(), p) for p in prompts]):
        if got.tokens == ref.tokens:
            continue
        # A recomputed sequence runs its tokens through the prefill GEMM instead of the decode
        # GEMV: fp32 sums in another order. Outputs may then part only where the reference's
        # two best tokens are within PREEMPTION_TIE_MARGIN (these synthetic prompts have such
        # near-ties); a real recompute bug diverges at a confident token and fails here.
        j = next(i for i, (a, b) in enumerate(zip(got.tokens, ref.tokens)) if a != b)
        best, second = sorted(ref.top_logprobs[j].values(), reverse=True)[:2]
        assert best - second < PREEMPTION_TIE_MARGIN, (j, ref.top_logprobs[j], got.tokens, ref.tokens)


def test_prefix_cache_hits_and_same_output(server, small, tokenizer):
    prefix = token_prompt(tokenizer, 99, 512)
    questions = [tokenizer.encode(f" Question {q}: what comes next?", add_special_tokens=False) for q in (1, 2)]
    first = complete(server.client(), prefix + questions[0])
    before = server.metrics()
    second = complete(server.client(), prefix + questions[1])
    after = server.metrics()
    assert after["bessemer_prefix_cache_hits_total"] - before["bessemer_prefix_cache_hits_total"] >= 512
    assert after["bessemer_prefix_cache_queries_total"] > before["bessemer_prefix_cache_queries_total"]
    assert [first, second] == [complete(small.client(), prefix + q) for q in questions]
    assert small.metrics()["bessemer_prefix_cache_hits_total"] == 0


def test_seeded_and_greedy_requests_are_bit_identical_cached_and_concurrent(server, small, tokenizer):
    """A seeded sampled request (temperature 1, seed 42) and a greedy one, with logprobs: their
    tokens and logprobs are the same bits on a prefix-cache miss, on a hit, and among 6
    concurrent requests of other lengths, and equal those of the server without a prefix
    cache (batch invariance, DESIGN: the kernels fix every reduction order per shape, and the
    seeded stream is a function of the seed and the token's index, not of the batch)."""
    prompt = token_prompt(tokenizer, 4242, 100)  # 6 full KV blocks of 16 and 4 tokens
    requests = [dict(temperature=1.0, seed=42), dict(temperature=0.0)]

    def run(client, extra):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, logprobs=3,
                                        extra_body={"ignore_eos": True}, **extra).choices[0]
        return out.text, out.logprobs.tokens, out.logprobs.token_logprobs, out.logprobs.top_logprobs

    want = [run(small.client(), extra) for extra in requests]
    assert want[0][0] != want[1][0]  # the seeded sample is not the greedy text (else it proves less)
    hits = server.metrics()["bessemer_prefix_cache_hits_total"]
    assert [run(server.client(), extra) for extra in requests] == want, "prefix-cache miss"
    assert server.metrics()["bessemer_prefix_cache_hits_total"] - hits >= 96
    assert [run(server.client(), extra) for extra in requests] == want, "prefix-cache hit"

    others = [token_prompt(tokenizer, 5000 + i, 10 + 15 * i) for i in range(6)]
    with ThreadPoolExecutor(8) as pool:
        busy = [pool.submit(complete, server.client(), p, 12) for p in others]
        mine = [pool.submit(run, server.client(), extra) for extra in requests]
        assert [f.result() for f in mine] == want, "among 6 concurrent requests"
        assert all(f.result() for f in busy)


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400, None),
    ("/v1/completions", {"prompt": "hi", "top_p": 2}, 400, None),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": [1] * 3000}, 400, None),
    ("/v1/completions", {"prompt": [10 ** 9]}, 400, None),
    ("/v1/completions", {"max_tokens": 4}, 400, "prompt"),
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("/v1/nonexistent", {}, 404, None),
])
def test_bad_requests_get_openai_errors(server, path, body, status, param):
    r = server.post(path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param


def test_api_key_and_client_errors(server):
    for key in (None, "wrong"):
        r = server.post("/v1/completions", {"prompt": "hi"}, key=key)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model=MODEL, prompt="hi", max_tokens=-5)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="nope", max_retries=0).models.list()
    assert httpx.get(f"{server.url}/health").status_code == 200


def raw_stream(server, path: str, body: dict) -> list[bytes]:
    """The HTTP chunks of a streamed response, as the server wrote them (a bare socket:
    httpx would join and split them as it reads)."""
    import socket

    content = json.dumps({**body, "stream": True}).encode()
    head = (f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer {KEY}"
            f"\r\ncontent-length: {len(content)}\r\nconnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        sock.sendall(head + content)
        response = b"".join(iter(lambda: sock.recv(65536), b""))
    status, rest = response.split(b"\r\n", 1)
    assert status == b"HTTP/1.1 200 OK", response[:300]
    rest = rest.split(b"\r\n\r\n", 1)[1]
    chunks = []
    while True:  # chunked transfer coding: hex size, CRLF, data, CRLF; size 0 ends it
        size, rest = rest.split(b"\r\n", 1)
        if int(size, 16) == 0:
            return chunks
        chunks.append(rest[:int(size, 16)])
        rest = rest[int(size, 16) + 2:]


def test_stream_interval_sends_the_same_events_in_fewer_writes(server, small):
    """`small` (--stream-interval-ms 200) sends a stream's tokens together: the same events
    as `server` (every token at once), byte for byte but for the time each response was
    created, in a few writes rather than one per token."""
    def events(chunks: list[bytes]) -> list[bytes]:
        return [re.sub(rb'"created": \d+', b'"created": 0', e) for e in b"".join(chunks).split(b"\n\n")]

    for path, extra in (("/v1/completions", {"prompt": "The story of a lighthouse keeper:"}),
                        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell a story."}]})):
        body = {"model": MODEL, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "request_id": "r1",
                "stream_options": {"include_usage": True}, **extra}
        each, held = raw_stream(server, path, body), raw_stream(small, path, body)
        assert events(held) == events(each)
        num_events = len(events(each)) - 1  # the last is the empty rest after [DONE]'s blank line
        assert num_events >= 16 + 2  # the tokens' events, usage and [DONE]
        assert len(held) < num_events // 2, (path, [len(c) for c in held])


def test_client_disconnect_aborts(server):
    body = {"prompt": "Tell me a long story.", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith("data:"))
    deadline = time.monotonic() + 10
    while server.metrics()["bessemer_num_requests_running"] > 0:
        assert time.monotonic() < deadline, "the abandoned request is still running"
        time.sleep(0.1)
    m = server.metrics()
    assert m['bessemer_request_success_total{finished_reason="abort"}'] >= 1
    assert m["bessemer_kv_cache_usage_perc"] == 0


def test_sigterm_during_stream_exits_cleanly(small):
    """`small` runs with --drain-timeout 0: SIGTERM aborts what is running at once (the
    drain itself is tested in test_serve_endpoints.py)."""
    body = {"prompt": "Tell me a long story.", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{small.url}/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))
        small.proc.send_signal(signal.SIGTERM)
        rest = [line for line in lines if line.startswith("data:")]
    assert small.proc.wait(timeout=10) == 0
    assert "error" in json.loads(rest[-1][len("data:"):])  # told why the stream ended early


BAD_WHILE_BUSY = [
    ("NaN temperature", b'{"model": "smollm2", "prompt": "hi", "max_tokens": 4, "temperature": NaN}', "temperature"),
    ("NaN repetition_penalty",
     b'{"model": "smollm2", "prompt": "hi", "max_tokens": 4, "repetition_penalty": NaN}', "repetition_penalty"),
    ("seed -1", {"model": MODEL, "prompt": "hi", "max_tokens": 4, "seed": -1}, "seed"),
    ("empty stop", {"model": MODEL, "prompt": "hi", "max_tokens": 4, "stop": [""]}, "stop"),
    ("lone surrogate", b'{"model": "smollm2", "prompt": "hi \\ud800 there", "max_tokens": 4}', None),
    ("deep JSON", b'{"model": "smollm2", "prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", None),
]


def test_bad_requests_fail_alone_while_a_long_generation_runs(server, tokenizer):
    """Each bad request gets a 400 naming it; a long generation running meanwhile on another
    connection finishes with the same text as when it runs alone."""
    import threading

    prompt = token_prompt(tokenizer, 77, 48)
    alone = complete(server.client(), prompt, max_tokens=96)
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("text", complete(server.client(), prompt, max_tokens=96)))
    worker.start()
    statuses = []
    for name, body, needle in BAD_WHILE_BUSY:
        r = server.post("/v1/completions", body)
        statuses.append((name, r.status_code))
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        if needle:
            assert needle in r.json()["error"]["message"], (name, r.text)
    huge = server.post("/v1/completions", {"model": MODEL, "prompt": "word " * (5 * 2**20), "max_tokens": 4})
    statuses.append(("20 MB body", huge.status_code))
    assert huge.status_code == 413 and "at most" in huge.json()["error"]["message"], huge.text[:300]
    worker.join(timeout=300)
    assert result.get("text") == alone, statuses
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_metrics_need_the_api_key_when_one_is_set(server):
    assert httpx.get(f"{server.url}/metrics").status_code == 401
    assert "bessemer_" in httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).text


def test_a_huge_prompt_is_refused_without_freezing_the_server(server):
    """A 10 MB prompt (under the body limit) cannot fit the engine: it is refused from its
    length in characters, before tokenizing (which takes ~12 s and held the interpreter,
    freezing /health and every stream), and /health answers meanwhile."""
    import threading

    result = {}
    body = {"model": MODEL, "prompt": "lorem ipsum dolor " * 600_000, "max_tokens": 4}
    worker = threading.Thread(target=lambda: result.setdefault("r", server.post("/v1/completions", body)))
    t0 = time.monotonic()
    worker.start()
    health = httpx.get(f"{server.url}/health", timeout=10)
    worker.join(timeout=120)
    assert health.status_code == 200
    r = result["r"]
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text[:300]
    assert time.monotonic() - t0 < 5.0
