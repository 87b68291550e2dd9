"""Tensor parallelism on this machine: TP=2 (1 thread per rank) vs TP=1 (2 threads).

    python bench/tp.py --model DIR [--repeats 3] [--out bench/results]

Measures, for SmolLM2 in bf16 and fp32 (prefix caching off, EOS ignored):
  prefill   one 512-token prompt, max_tokens=1 -> prompt tok/s
  decode    batch 1, 128 new tokens -> (tokens - 1) / (last - first token time)
  rss       peak RSS of rank 0 and of the worker rank (RUSAGE_CHILDREN after it exits)
plus the shared-memory all_reduce latency per call for hidden 576 (1 row = a decode step,
512 rows = a prefill chunk; two forked ranks, medians of 5 batches), and `build-engine
--tp 2` time and per-rank peak RSS with --workers 1 vs 2. Each measurement runs in its
own process; systems are interleaved and medians of --repeats taken, because this machine
is shared and loaded.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NEW_TOKENS = 128
HIDDEN = 576


def _prompt(llm, n: int) -> list[int]:
    from bessemer.datasets import wikitext2_valid

    words = wikitext2_valid().read_text()[:20000]
    return llm.tokenizer.encode(words)[:n]


def measure(engine: str, threads: int) -> dict:
    from bessemer.runtime.llm import LLM, SamplingParams

    llm = LLM(engine, num_threads=threads, enable_prefix_caching=False)
    ids = _prompt(llm, 512)
    llm.generate([ids[:16]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))  # warm-up
    t = time.perf_counter()
    llm.generate([ids], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    prefill = len(ids) / (time.perf_counter() - t)
    out = llm.generate([ids[:32]], SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))[0]
    m = out.metrics
    decode = (len(out.token_ids) - 1) / (m["last_token_time"] - m["first_token_time"])
    llm.close()
    return {"prefill_tok_s": prefill, "decode_tok_s": decode,
            "rank0_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "worker_peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def _allreduce_rank(name: str, rank: int, rows: int, iters: int, batches: int, conn=None) -> list[float]:
    import numpy as np

    from bessemer import _C

    comm = _C.ShmCommunicator(name, rank, 2, rows * HIDDEN * 4 + 64, 30.0, rank == 0)
    if conn is not None:
        conn.send("ready")
    comm.barrier(30.0)
    comm.unlink()
    x = np.ones((rows, HIDDEN), dtype=np.float32)
    per_call = []
    for _ in range(batches):
        comm.barrier(30.0)
        t = time.perf_counter()
        for _ in range(iters):
            comm.all_reduce(x)
        per_call.append((time.perf_counter() - t) / iters * 1e6)
        x[...] = 1.0
    return per_call


def allreduce_latency(rows: int, iters: int, batches: int = 5) -> float:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    name = f"/bessemer-bench-{os.getpid()}-{rows}"
    recv, send = ctx.Pipe(duplex=False)
    # rank 0 (creates the segment) runs in the child, rank 1 here once it exists
    child = ctx.Process(target=_allreduce_rank, args=(name, 0, rows, iters, batches, send))
    child.start()
    recv.recv()
    try:
        per_call = _allreduce_rank(name, 1, rows, iters, batches)
    finally:
        child.join(60)
        child.kill()
    return statistics.median(per_call)


def build(model: str, out: Path, dtype: str, workers: int) -> dict:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bessemer.cli.build", model, "--output", str(out), "--dtype", dtype,
                    "--max-seq-len", "2048", "--tp", "2", "--workers", str(workers), "-q"], check=True)
    seconds = time.perf_counter() - t
    report = json.loads((out / "build_report.json").read_text())
    return {"build_s": seconds, "rank_peak_rss_mib": [r["peak_rss_mib"] for r in report["ranks"]],
            "process_peak_rss_mib": report["peak_rss_mib"]}


def _run_measure(engine: Path, threads: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "--_measure", str(engine), "--threads", str(threads)],
                       check=True, capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _median(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 2) if not isinstance(runs[0][k], list) else
            [round(statistics.median(r[k][i] for r in runs), 1) for i in range(len(runs[0][k]))]
            for k in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--_measure")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a._measure:
        print(json.dumps(measure(a._measure, a.threads)))
        return
    if not a.model:
        ap.error("--model DIR is required")
    results: dict = {"machine_cores": len(os.sched_getaffinity(0)), "repeats": a.repeats}
    results["allreduce_us_per_call"] = {f"rows={rows}": round(allreduce_latency(rows, iters), 1)
                                        for rows, iters in ((1, 2000), (16, 1000), (512, 100))}
    print(json.dumps(results["allreduce_us_per_call"]), file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bessemer-bench-tp-") as tmp:
        tmp = Path(tmp)
        builds = {1: [], 2: []}
        for rep in range(a.repeats):
            for workers in (1, 2):
                builds[workers].append(build(a.model, tmp / f"build-w{workers}", "float32", workers))
        results["build_fp32_tp2"] = {f"workers={w}": _median(b) for w, b in builds.items()}
        print(json.dumps(results["build_fp32_tp2"]), file=sys.stderr)
        for dtype in a.dtypes.split(","):
            engines = {}
            for tp in (1, 2):
                engines[tp] = tmp / f"{dtype}-tp{tp}"
                subprocess.run([sys.executable, "-m", "bessemer.cli.build", a.model, "--output", str(engines[tp]),
                                "--dtype", dtype, "--max-seq-len", "2048", "--tp", str(tp), "--workers", "2", "-q"],
                               check=True)
            runs = {"tp1_2threads": [], "tp2_1thread_per_rank": []}
            for rep in range(a.repeats):  # interleaved
                runs["tp1_2threads"].append(_run_measure(engines[1], 2))
                runs["tp2_1thread_per_rank"].append(_run_measure(engines[2], 1))
            med = {k: _median(v) for k, v in runs.items()}
            med["tp2_over_tp1"] = {k: round(med["tp2_1thread_per_rank"][k] / med["tp1_2threads"][k], 3)
                                   for k in ("prefill_tok_s", "decode_tok_s")}
            results[dtype] = med
            print(json.dumps({dtype: med}), file=sys.stderr)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tp.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
