"""Batch-1 decode through `bessemer serve` against the same engine through `LLM` (what
run-engine uses), and what the server spends per streamed token outside the engine.

    python bench/serve_decode.py ENGINE [--threads 2] [--tokens 256] [--rounds 5]
                                 [--compare-tree ../bessemer-main] [--serve-args FLAGS]
                                 [--compare-serve-args FLAGS] [--out FILE]

One `LLM` worker process and one server process (two with --compare-tree or
--compare-serve-args: the second runs another source tree's bessemer or other serve flags,
for an A/B) hold the same engine for the whole run; each round measures, one after the
other (so a burst of outside load hits all alike):

- llm: `LLM.generate` of --tokens greedy tokens (ignore_eos) after a 16-token prompt;
- whole: the same request to /v1/completions, not streamed;
- streamed: the same request streamed.

Decode tok/s leaves the prompt and the request's overhead out the same way on every path:
(tokens - 1) / (time for `tokens` tokens - time for 1 token) for llm and whole; for streamed,
the chunks after the client's first read over the time from that read to the last (a client
that wakes late for the first chunk finds several: counting them too would overstate the rate).

The client reads the stream from a bare socket and counts chunks by their "data: {" prefix (no
HTTP or JSON parsing), since it shares the cores with the server. The load it does add is not in
the server's own figure: CPU seconds per streamed token of each server thread, read from
/proc/<pid>/task/<tid>/schedstat (nanoseconds of CPU) before and after the request and split
into the event loop (the main thread: uvicorn, HTTP, the app's per-token work), the engine
(the thread named `bessemer-engine` and the kernels' workers it started, which inherit its
name) and the rest (helper threads; the engine's threads too on a tree without that name). The
event loop's share is what the streaming path adds over `LLM`; it is the figure to drive
down. It moves with the machine's load far less than tok/s does, but it does move (cache
and core sharing): compare trees in one run (--compare-tree), not across runs. Figures are
medians over --rounds; the load average is printed with each round.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = list(range(100, 116))
ENGINE_THREAD = "bessemer-engine"

# A persistent LLM worker: reads a token count per line, answers (time for 1 token, time
# for that many, CPU seconds of the process for the long one).
WORKER = r"""
import json, os, sys, time
from bessemer.runtime.llm import LLM, SamplingParams
llm = LLM(sys.argv[1], num_threads=int(sys.argv[2]), enable_prefix_caching=False)
prompt = json.loads(sys.argv[3])
def timed(n):
    t = time.perf_counter()
    llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    return time.perf_counter() - t
timed(8)
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    short = timed(1)
    cpu = os.times()
    long = timed(n)
    after = os.times()
    print(json.dumps({"short_s": short, "long_s": long, "cpu_s": after.user + after.system - cpu.user - cpu.system}),
          flush=True)
"""


def thread_cpu_ns(pid: int) -> dict[int, tuple[str, int]]:
    """tid -> (thread name, CPU nanoseconds so far) for every thread of `pid`."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
        out[int(tid)] = (name, ns)
    return out


def cpu_split(pid: int, before: dict, after: dict) -> dict[str, float]:
    """CPU seconds between two thread_cpu_ns readings: event loop, engine, rest."""
    split = {"event_loop": 0.0, "engine": 0.0, "rest": 0.0}
    for tid, (name, ns) in after.items():
        used = (ns - before.get(tid, (name, 0))[1]) / 1e9
        key = "event_loop" if tid == pid else "engine" if name == ENGINE_THREAD else "rest"
        split[key] += used
    return split


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs `tree`'s bessemer (its directory is also the child's cwd,
    which `python -m` and `-c` put first on sys.path)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}


class Server:
    def __init__(self, engine: Path, threads: int, tree: Path, serve_args: list[str]):
        sys.path.insert(0, str(REPO / "tests"))
        from ports import free_port

        self.port, self.tree, self.serve_args = free_port(), tree, serve_args
        env = tree_env(tree)
        self.proc = subprocess.Popen([sys.executable, "-m", "bessemer.cli.main", "serve", str(engine),
                                      "--port", str(self.port), "--threads", str(threads), "--no-prefix-cache",
                                      "--log-level", "warning", "--log-stats-interval", "0", *serve_args],
                                     env=env, cwd=tree,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 180
        while True:
            try:
                if self.get("/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("the server did not start")
            time.sleep(0.2)
        self.model = json.loads(self.get("/v1/models")[1])["data"][0]["id"]

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def body(self, tokens: int, stream: bool) -> bytes:
        return json.dumps({"model": self.model, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
                           "ignore_eos": True, "stream": stream}).encode()

    def whole(self, tokens: int) -> float:
        """Seconds for one non-streamed request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            t = time.perf_counter()
            conn.request("POST", "/v1/completions", self.body(tokens, False), {"content-type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            elapsed = time.perf_counter() - t
        finally:
            conn.close()
        if r.status != 200 or json.loads(data)["usage"]["completion_tokens"] != tokens:
            raise SystemExit(f"the request failed: {r.status} {data[:300]!r}")
        return elapsed

    def streamed(self, tokens: int) -> tuple[float, float, int]:
        """(the first read holding a token's chunk, the last read, token chunks in that first
        read) on the client's clock. A bare socket rather than http.client, whose chunked-body
        reader runs a few Python calls per chunk: what the client spends per token is taken
        from the same two cores as the server's kernels."""
        body = self.body(tokens, True)
        head = (f"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        first = last = None
        seen, at_first, tail, received = 0, 0, b"", []
        with socket.create_connection(("127.0.0.1", self.port), timeout=600) as sock:
            sock.sendall(head + body)
            while True:
                data = sock.recv(65536)
                if not data:
                    break
                now = time.perf_counter()
                if len(received) < 2:  # the status line and headers, kept for an error
                    received.append(data)
                # a token's chunk; [DONE] ends the stream. The HTTP chunk-size lines between
                # events never hold this, and `tail` finds one split across two reads.
                events = (tail + data).count(b"data: {")
                tail = data[-6:]
                if events:
                    seen += events
                    if first is None:
                        first, at_first = now, events
                    last = now
        response = b"".join(received)
        if not response.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"the request failed: {response[:300]!r}")
        if seen != tokens:
            raise SystemExit(f"expected {tokens} token chunks, counted {seen}")
        return first, last, at_first

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def measure(server: Server, n: int) -> dict:
    """One round's server figures: whole and streamed decode tok/s, CPU ms per token by thread."""
    short = server.whole(1)
    before = thread_cpu_ns(server.proc.pid)
    long = server.whole(n)
    whole_cpu = cpu_split(server.proc.pid, before, thread_cpu_ns(server.proc.pid))
    before, client_before = thread_cpu_ns(server.proc.pid), time.process_time()
    first, last, at_first = server.streamed(n)
    stream_cpu = cpu_split(server.proc.pid, before, thread_cpu_ns(server.proc.pid))
    client_cpu = time.process_time() - client_before
    return {"whole_tok_s": (n - 1) / (long - short), "streamed_tok_s": (n - at_first) / (last - first),
            "whole_cpu_ms_per_token": {k: 1e3 * v / n for k, v in whole_cpu.items()},
            "streamed_cpu_ms_per_token": {k: 1e3 * v / n for k, v in stream_cpu.items()},
            "client_cpu_ms_per_token": 1e3 * client_cpu / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=256, help="generated per request (the engine's max_seq_len allowing)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compare-tree", type=Path, default=None,
                    help="also serve the engine from this Bessemer source tree (a checkout of another commit, "
                         "its native module built), measured in the same rounds: an A/B under the same load")
    ap.add_argument("--serve-args", default="", help="more `bessemer serve` flags for this tree's server, one string "
                    "(e.g. '--stream-interval-ms 10')")
    ap.add_argument("--compare-serve-args", default=None,
                    help="more flags for the compared server (--compare-tree, this tree if not given): an A/B of flags")
    ap.add_argument("--out", type=Path, default=None, help="write every round's figures here as JSON")
    args = ap.parse_args()
    n = args.tokens

    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(args.engine), str(args.threads), json.dumps(PROMPT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=tree_env(REPO), cwd=REPO)
    servers = {"this": Server(args.engine, args.threads, REPO, shlex.split(args.serve_args))}
    if args.compare_tree is not None or args.compare_serve_args is not None:
        servers["compared"] = Server(args.engine, args.threads, (args.compare_tree or REPO).resolve(),
                                     shlex.split(args.compare_serve_args or ""))
    rounds = []
    try:
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit("the LLM worker did not start")
        for server in servers.values():
            server.whole(8)
            server.streamed(8)
        for i in range(args.rounds):
            worker.stdin.write(f"{n}\n")
            worker.stdin.flush()
            llm = json.loads(worker.stdout.readline())
            r = {"llm_tok_s": (n - 1) / (llm["long_s"] - llm["short_s"]), "llm_cpu_ms_per_token": 1e3 * llm["cpu_s"] / n}
            order = list(servers) if i % 2 == 0 else list(servers)[::-1]  # neither always goes first
            for name in order:
                r[name] = measure(servers[name], n)
            r["load"] = os.getloadavg()[0]
            rounds.append(r)
            for name in servers:
                m, s = r[name], r[name]["streamed_cpu_ms_per_token"]
                print(f"round {i + 1} {name:8}: llm {r['llm_tok_s']:6.1f}  whole {m['whole_tok_s']:6.1f}  streamed "
                      f"{m['streamed_tok_s']:6.1f} tok/s | streamed CPU ms/token: loop {s['event_loop']:.3f} "
                      f"engine {s['engine']:.3f} rest {s['rest']:.3f}, client {m['client_cpu_ms_per_token']:.3f} "
                      f"| load {r['load']:.2f}", flush=True)
    finally:
        for server in servers.values():
            server.stop()
        worker.stdin.close()
        worker.wait(30)

    def med(get) -> float:
        return statistics.median(get(r) for r in rounds)

    print(f"\nmedians of {len(rounds)} rounds, {n} tokens, {args.threads} threads, {args.engine.name}; "
          f"llm {med(lambda r: r['llm_tok_s']):.1f} tok/s, {med(lambda r: r['llm_cpu_ms_per_token']):.3f} CPU ms/token")
    for name, server in servers.items():
        print(f"{name} ({server.tree} {shlex.join(server.serve_args)}):")
        print(f"  decode tok/s: whole {med(lambda r: r[name]['whole_tok_s']):.1f} "
              f"({med(lambda r: r[name]['whole_tok_s'] / r['llm_tok_s']):.3f}x llm), "
              f"streamed {med(lambda r: r[name]['streamed_tok_s']):.1f} "
              f"({med(lambda r: r[name]['streamed_tok_s'] / r['llm_tok_s']):.3f}x llm)")
        for path in ("whole", "streamed"):
            parts = {k: med(lambda r: r[name][f"{path}_cpu_ms_per_token"][k]) for k in ("event_loop", "engine", "rest")}
            print(f"  {path} server CPU ms/token: " + ", ".join(f"{k} {v:.3f}" for k, v in parts.items()))
        print(f"  streaming client CPU ms/token {med(lambda r: r[name]['client_cpu_ms_per_token']):.3f}")
    if "compared" in servers:
        print("this / compared, event loop CPU per streamed token, median of the rounds' ratios: "
              f"{med(lambda r: r['this']['streamed_cpu_ms_per_token']['event_loop'] / r['compared']['streamed_cpu_ms_per_token']['event_loop']):.3f}")
    if args.out:
        args.out.write_text(json.dumps({"engine": str(args.engine), "tokens": n, "threads": args.threads,
                                        "trees": {k: str(v.tree) for k, v in servers.items()},
                                        "serve_args": {k: v.serve_args for k, v in servers.items()}, "rounds": rounds},
                                       indent=1) + "\n")


if __name__ == "__main__":
    main()
