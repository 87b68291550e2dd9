"""How the kernels' thread pool waits between parallel regions, measured: batch-1 decode of
one engine under each wait policy, on an idle machine and beside a busy process, through
`LLM` (what run-engine uses) and through `bessemer serve` (a streamed request).

    python bench/thread_policy.py ENGINE [--policies default,passive,spin:10000] [--repeats 3]
                                  [--scenarios idle,busy] [--server] [--out bench/results]

A policy is an environment for the worker process, which loads the native module after it
is set (libgomp reads it once, when it loads): `default` is Bessemer's own policy
(bessemer/thread_policy.py: a short spin, and fewer threads while other tasks hold cores);
the others keep every thread on and differ in how workers wait: `fixed` Bessemer's short
spin, `active` spins until the next region, `passive` sleeps at once, `spin:N` spins N
rounds then sleeps, `libgomp` libgomp's own default. `busy` runs one extra process that keeps a core
busy for the whole scenario. Runs of all policies are interleaved round by round, so a
burst of outside load hits them alike; each figure is the median of --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

POLICY_VAR = "BESSEMER_THREAD_POLICY"

NEW_TOKENS = 128
PROMPT_TOKENS = 16

WORKER = r"""
import json, sys, time
from bessemer.runtime.llm import LLM, SamplingParams
llm = LLM(sys.argv[1], num_threads=int(sys.argv[2]), enable_prefix_caching=False)
prompt = list(range(100, 100 + %d))
params = SamplingParams(max_tokens=%d, temperature=0, ignore_eos=True)
llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
t = time.perf_counter()
llm.generate([prompt], params)
print(json.dumps({"tok_s": (params.max_tokens - 1) / (time.perf_counter() - t)}))
""" % (PROMPT_TOKENS, NEW_TOKENS)


def policy_env(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", POLICY_VAR)}
    if policy == "default":
        return env
    env[POLICY_VAR] = "fixed"  # every other policy: all threads on, only the wait differs
    if policy == "active":
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif policy.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = policy.split(":", 1)[1]
    elif policy == "libgomp":
        env[POLICY_VAR] = "libgomp"  # libgomp's own default wait (300000 spins)
    elif policy != "fixed":
        raise SystemExit(f"unknown policy {policy!r}: use default, fixed, active, passive, libgomp or spin:N")
    return env


def run_llm(engine: Path, policy: str, threads: int) -> float:
    out = subprocess.run([sys.executable, "-c", WORKER, str(engine), str(threads)], env=policy_env(policy),
                         capture_output=True, text=True, timeout=900)
    if out.returncode:
        raise SystemExit(f"worker failed ({policy}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["tok_s"]


def run_server(engine: Path, policy: str, threads: int) -> float:
    """Streams one greedy request of NEW_TOKENS through `bessemer serve`: decode tok/s
    between the first and the last streamed token (after a warm-up request)."""
    import httpx

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from ports import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bessemer.cli.main", "serve", str(engine), "--port", str(port),
                             "--threads", str(threads), "--no-prefix-cache", "--log-level", "warning"],
                            env=policy_env(policy), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"server did not start ({policy})")
            time.sleep(0.2)
        body = {"model": httpx.get(f"{url}/v1/models").json()["data"][0]["id"],
                "prompt": list(range(100, 100 + PROMPT_TOKENS)), "max_tokens": NEW_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True}
        httpx.post(f"{url}/v1/completions", json={**body, "max_tokens": 8, "stream": False}, timeout=300)
        times = []
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    times.append(time.perf_counter())
        return (len(times) - 1) / (times[-1] - times[0])
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", type=Path)
    ap.add_argument("--policies", default="default,fixed,libgomp,passive")
    ap.add_argument("--scenarios", default="idle,busy")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--server", action="store_true", help="also measure through bessemer serve")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    policies = args.policies.split(",")
    paths = ["llm", "server"] if args.server else ["llm"]
    results: dict[str, dict[str, list[float]]] = {}
    for scenario in args.scenarios.split(","):
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if scenario == "busy" else None
        try:
            for rep in range(args.repeats):
                for policy in policies:
                    for path in paths:
                        run = run_llm if path == "llm" else run_server
                        tok_s = run(args.engine, policy, args.threads)
                        results.setdefault(f"{scenario}/{path}", {}).setdefault(policy, []).append(tok_s)
                        print(f"{scenario:5} {path:6} {policy:12} round {rep + 1}: {tok_s:7.1f} tok/s "
                              f"(load {os.getloadavg()[0]:.2f})", flush=True)
        finally:
            if busy:
                busy.kill()
    print(f"\nbatch-1 decode tok/s, median of {args.repeats} ({args.threads} threads)")
    print(f"{'':14}" + "".join(f"{p:>14}" for p in policies))
    for key, by_policy in results.items():
        print(f"{key:14}" + "".join(f"{statistics.median(by_policy[p]):14.1f}" for p in policies))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "thread_policy.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
