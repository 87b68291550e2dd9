"""A tensor-parallel server whose worker rank died says so: /health is a 503 naming the rank,
and requests get a 503 (the server's fault), not a 400."""

import os
import signal
import subprocess
import time

import httpx

from test_serve import Server


def test_dead_worker_rank_makes_health_and_requests_503(smollm2_dir, tmp_path):
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    engine = build_engine(smollm2_dir, tmp_path / "engine", BuildConfig(dtype="bfloat16", max_seq_len=256, tp_size=2))
    server = Server(engine, tmp_path / "server.log")
    try:
        server.wait_ready()
        ok = server.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
        assert ok.status_code == 200, ok.text
        workers = subprocess.run(["ps", "-o", "pid=", "--ppid", str(server.proc.pid)], capture_output=True,
                                 text=True).stdout.split()
        assert workers, "the tp2 server has no worker process"
        for pid in workers:
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and httpx.get(f"{server.url}/health").status_code == 200:
            time.sleep(0.1)
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and "rank" in health.json()["error"]["message"], health.text
        r = server.post("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2})
        assert r.status_code == 503, r.text
    finally:
        server.stop()
