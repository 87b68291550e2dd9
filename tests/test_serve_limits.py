"""`bessemer serve` against slow and oversized clients (issue 25), as a real subprocess.

The connection guard (serving/http.py) and the body limits (serving/body.py) with tight
settings so that each is reached quickly: a head or body that does not arrive in time
gets 408 and the connection closes, a 200 KB header 431 (not a reset), a body over
--max-request-bytes 413 before it is read, `n` over --max-n 400. The last test sends them
all while a long greedy generation streams on another connection, which must end with the
same text as when it ran alone. The server runs the bf16 SmolLM2 engine (the smallest
engine with a tokenizer).
"""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_serve import KEY, MODEL, Server

httpx = pytest.importorskip("httpx")

MAX_BODY = 1_000_000
MAX_N = 4
HEADER_TIMEOUT = 2.0
BODY_TIMEOUT = 2.0
AUTH = {"Authorization": f"Bearer {KEY}"}
STORY = {"model": MODEL, "prompt": "Once upon a time, in a quiet harbour town,", "max_tokens": 600,
         "temperature": 0, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def server(smollm2_engine, tmp_path_factory):
    s = Server(smollm2_engine("bfloat16"), tmp_path_factory.mktemp("robust-logs") / "server.log",
               "--api-key", KEY, "--max-request-bytes", str(MAX_BODY), "--max-n", str(MAX_N),
               "--header-timeout", str(HEADER_TIMEOUT), "--body-timeout", str(BODY_TIMEOUT))
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


def raw_exchange(server, data: bytes, pause: float = 0.0, more: bytes = b"") -> tuple[int, bytes]:
    """Sends `data`, waits `pause` s, sends `more`; returns (status, whole answer) once the
    server closes the connection (or after 20 s)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        sock.sendall(data)
        if pause:
            time.sleep(pause)
        if more:
            try:
                sock.sendall(more)
            except OSError:  # the server may have answered and shut its side already
                pass
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def head(path: str, length: int, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n{extra}\r\n").encode()


def completion(extra: dict) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 4, **extra}).encode()


def test_n_above_the_limit_gets_400(server):
    r = httpx.post(f"{server.url}/v1/completions", content=completion({"n": MAX_N + 1}), headers=AUTH, timeout=60)
    assert r.status_code == 400 and "--max-n" in r.json()["error"]["message"] and r.json()["error"]["param"] == "n"
    r = httpx.post(f"{server.url}/v1/completions", content=completion({"n": MAX_N, "max_tokens": 1}), headers=AUTH,
                   timeout=60)
    assert r.status_code == 200 and len(r.json()["choices"]) == MAX_N


def test_a_body_over_the_limit_gets_413_before_it_is_sent(server):
    # the client announces 50 MB and sends 10 bytes: the answer comes without the rest
    t = time.monotonic()
    status, answer = raw_exchange(server, head("/v1/completions", 50_000_000) + b'{"prompt":')
    assert status == 413 and b"--max-request-bytes" in answer and time.monotonic() - t < 5
    # chunked, with no length announced: counted while read
    chunk = b"x" * 100_000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(MAX_BODY // len(chunk) + 2)) + b"0\r\n\r\n"
    request = head("/v1/completions", 0).replace(b"Content-Length: 0", b"Transfer-Encoding: chunked")
    assert raw_exchange(server, request + body)[0] == 413


def test_slow_clients_get_408_and_lose_the_connection(server):
    t = time.monotonic()
    status, _ = raw_exchange(server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    assert status == 408 and HEADER_TIMEOUT <= time.monotonic() - t < HEADER_TIMEOUT + 5
    t = time.monotonic()
    status, answer = raw_exchange(server, head("/v1/completions", 100) + b'{"prompt": "h')  # 13 of 100 bytes
    assert status == 408 and b"body" in answer and BODY_TIMEOUT <= time.monotonic() - t < BODY_TIMEOUT + 5


def test_a_huge_header_gets_431(server):
    r = httpx.get(f"{server.url}/health", headers={"X-Padding": "a" * 200_000}, timeout=20)
    assert r.status_code == 431 and "headers exceed" in r.json()["error"]["message"]
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def stream_text(server) -> str:
    text = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=STORY, headers=AUTH, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                chunk = json.loads(line[len("data:"):])
                assert "error" not in chunk, chunk
                text.append(chunk["choices"][0]["text"])
    return "".join(text)


@pytest.mark.slow
def test_bad_requests_do_not_disturb_a_long_generation(server):
    alone = stream_text(server)
    with ThreadPoolExecutor(8) as pool:
        story = pool.submit(stream_text, server)
        time.sleep(1.0)  # the story is generating
        assert not story.done()
        header = pool.submit(httpx.get, f"{server.url}/health", headers={"X-Padding": "a" * 200_000}, timeout=20)
        many = pool.submit(httpx.post, f"{server.url}/v1/completions", content=completion({"n": MAX_N + 1}),
                           headers=AUTH, timeout=60)
        # the large bodies and slow clients meanwhile, on connections of their own
        huge = pool.submit(raw_exchange, server, head("/v1/completions", 50_000_000) + b"{")
        slow = pool.submit(raw_exchange, server, head("/v1/completions", 100) + b'{"prompt"')
        head_never = pool.submit(raw_exchange, server, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        waits = []
        while not (huge.done() and slow.done() and head_never.done()):
            t = time.monotonic()
            assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
            waits.append(time.monotonic() - t)
            time.sleep(0.05)
        assert max(waits) < 1.0, waits
        assert huge.result()[0] == 413 and slow.result()[0] == 408 and head_never.result()[0] == 408
        assert header.result().status_code == 431 and many.result().status_code == 400
        assert not story.done(), "the story ended before the bad requests were all sent; make it longer"
        assert story.result() == alone
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
