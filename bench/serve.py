"""Serving benchmark: real `bessemer serve` subprocesses on loopback, streamed completions.

    python bench/serve.py --engine engines/smollm2-bf16 [--out bench/results/serve.json]

(a) total output tokens/s for --requests (64) requests (128-token prompts, --output-tokens
    (128) output tokens) sent at once vs one at a time;
(b) --prefix-requests (32) requests sharing a 1024-token system prompt plus distinct 32-token
    questions, sent one at a time: mean TTFT with prefix caching vs --no-prefix-cache;
(c) p50/p99 TTFT and inter-token latency with --streams (16) concurrent streams.

Times are taken on the client from the SSE chunks by `bessemer bench serve`'s client
(bessemer/serving_bench; that command is the general tool, for any server, rate and prompt
set). Every phase uses prompts of its own, so no phase is sped up by blocks an earlier one
left in the cache.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this tree's bessemer, not whatever is installed
    sys.path.insert(0, str(REPO))

from bessemer.serving_bench.prompts import Prompt  # noqa: E402
from bessemer.serving_bench.runner import first_model, run  # noqa: E402
from bessemer.serving_bench.target import Target  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, engine: str, *flags: str):
        self.url = f"http://127.0.0.1:{(port := free_port())}"
        self.proc = subprocess.Popen([sys.executable, "-m", "bessemer.cli.main", "serve", engine, "--port", str(port),
                                      "--log-level", "warning", *flags])
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError("server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def prompts(seed: int, count: int, length: int, vocab: int = 40000) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab, length).tolist() for _ in range(count)]


def run_requests(url: str, batch: list[list[int]], max_tokens: int, concurrent: bool) -> tuple[list, float]:
    """Streams `batch` all at once or one at a time with `bessemer bench serve`'s client
    (bessemer/serving_bench): per-request results and the wall time."""
    target = Target(url, "completions", asyncio.run(first_model(url, None, 30.0)), ignore_eos=True)
    sent = [Prompt(None, tuple(p), len(p), max_tokens) for p in batch]
    done = asyncio.run(run(target, sent, math.inf, None if concurrent else 1, 0, 600.0, lambda _: None))
    failed = [r.error for r in done.results if not r.ok]
    if failed:
        raise RuntimeError(f"{len(failed)} requests failed, the first: {failed[0]}")
    return done.results, done.duration_s


def throughput(url: str, count: int, output_tokens: int) -> dict:
    out = {}
    for name, seed, concurrent in (("one_at_a_time", 1, False), ("all_at_once", 2, True)):
        results, wall = run_requests(url, prompts(seed, count, 128), output_tokens, concurrent)
        out[name] = {"output_tok_s": sum(r.output_tokens for r in results) / wall, "wall_s": wall}
    out["ratio"] = out["all_at_once"]["output_tok_s"] / out["one_at_a_time"]["output_tok_s"]
    return out


def prefix_ttft(url: str, count: int) -> float:
    system = prompts(3, 1, 1024)[0]
    batch = [system + q for q in prompts(4, count, 32)]
    results, _ = run_requests(url, batch, 8, concurrent=False)
    return float(np.mean([r.ttft_s for r in results]))


def latency(url: str, streams: int) -> dict:
    results, _ = run_requests(url, prompts(5, streams, 128), 64, concurrent=True)
    ttft = [r.ttft_s for r in results]
    itl = [t for r in results for t in r.itl_s]
    return {"ttft_p50_s": float(np.percentile(ttft, 50)), "ttft_p99_s": float(np.percentile(ttft, 99)),
            "itl_p50_s": float(np.percentile(itl, 50)), "itl_p99_s": float(np.percentile(itl, 99))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True, help="engine directory (e.g. built with build-engine)")
    ap.add_argument("--threads", default=None, help="passed to bessemer serve")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--prefix-requests", type=int, default=32)
    ap.add_argument("--streams", type=int, default=16)
    args = ap.parse_args()
    flags = ["--threads", args.threads] if args.threads else []

    result = {"engine": args.engine}
    server = Server(args.engine, *flags)
    try:
        result[f"throughput_{args.requests}x128in_{args.output_tokens}out"] = throughput(
            server.url, args.requests, args.output_tokens)
        result[f"latency_{args.streams}_streams"] = latency(server.url, args.streams)
        result["prefix_1024_mean_ttft_s"] = {"prefix_caching": prefix_ttft(server.url, args.prefix_requests)}
    finally:
        server.stop()
    server = Server(args.engine, "--no-prefix-cache", *flags)
    try:
        result["prefix_1024_mean_ttft_s"]["no_prefix_cache"] = prefix_ttft(server.url, args.prefix_requests)
    finally:
        server.stop()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
