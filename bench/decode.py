"""Bessemer engines (fp32, bf16) vs HF transformers fp32 on SmolLM2, in one run.

Workloads (same token ids for every system, EOS ignored, 2 threads by default):
  prefill   one 512-token prompt, time to first token -> prompt tok/s
  decode    batch 1, 128 new tokens -> (tokens - 1) / (last token time - first token time)
  batch8    8 prompts generated together, 128 new tokens each -> generated tok/s over wall time
Each figure is the median of --repeats runs after a warm-up; runs of different systems are
interleaved so that a burst of load on this shared machine hits all of them alike. Every
system lives in its own worker process, so torch's and Bessemer's thread pools never
compete for the same cores.
Also: build time and peak RSS of `build-engine` (a subprocess), engine sizes.

    python bench/decode.py --model DIR [--threads 2] [--repeats 3] [--out bench/results]
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


NEW_TOKENS = 128


def prompt_ids(tokenizer_encode, n: int, seed: int) -> list[int]:
    from bessemer.datasets import wikitext2_valid

    words = wikitext2_valid().read_text()[seed * 5000: seed * 5000 + 20000]
    ids = tokenizer_encode(words)
    return ids[:n]


def build(model: Path, out: Path, dtype: str) -> dict:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "bessemer.cli.build", str(model), "--output", str(out), "--dtype", dtype,
                    "--max-seq-len", "2048", "-q"], check=True)
    seconds = time.perf_counter() - t
    report = json.loads((out / "build_report.json").read_text())  # the build's own peak RSS
    size = (out / "rank0.engine").stat().st_size
    return {"build_s": round(seconds, 2), "build_peak_rss_mib": report["peak_rss_mib"],
            "engine_mib": round(size / 2**20, 1)}


class EngineSystem:
    def __init__(self, engine_dir: Path, threads: int):
        from bessemer.runtime.llm import LLM, SamplingParams

        # prefix caching off: every run must compute its prompt, as the baselines do
        self.llm = LLM(engine_dir, num_threads=threads, enable_prefix_caching=False)
        self.SamplingParams = SamplingParams

    def prefill(self, ids):
        t = time.perf_counter()
        self.llm.generate([ids], self.SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        return len(ids) / (time.perf_counter() - t)

    def decode(self, ids):
        out = self.llm.generate([ids], self.SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))[0]
        m = out.metrics
        return (len(out.token_ids) - 1) / (m["last_token_time"] - m["first_token_time"])

    def batch(self, prompts):
        t = time.perf_counter()
        outs = self.llm.generate(prompts, self.SamplingParams(max_tokens=NEW_TOKENS, temperature=0, ignore_eos=True))
        return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t)


class HFSystem:
    def __init__(self, model_dir: Path, threads: int):
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def _generate(self, input_ids, attention_mask, n):
        with self.torch.no_grad():
            return self.model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=n,
                                       min_new_tokens=n, do_sample=False, pad_token_id=0)

    def prefill(self, ids):
        x = self.torch.tensor([ids])
        t = time.perf_counter()
        self._generate(x, self.torch.ones_like(x), 1)
        return len(ids) / (time.perf_counter() - t)

    def decode(self, ids):
        # decode rate = tokens after the first / (time of 128 tokens - time of the first)
        x = self.torch.tensor([ids])
        t = time.perf_counter()
        self._generate(x, self.torch.ones_like(x), 1)
        t1 = time.perf_counter() - t
        t = time.perf_counter()
        self._generate(x, self.torch.ones_like(x), NEW_TOKENS)
        tn = time.perf_counter() - t
        return (NEW_TOKENS - 1) / (tn - t1)

    def batch(self, prompts):
        width = max(len(p) for p in prompts)  # left padding, as HF batched generation needs
        x = self.torch.tensor([[0] * (width - len(p)) + p for p in prompts])
        mask = self.torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        t = time.perf_counter()
        out = self._generate(x, mask, NEW_TOKENS)
        return (out.shape[1] - width) * len(prompts) / (time.perf_counter() - t)


def _worker(kind: str, path: str, threads: int, conn) -> None:
    """Runs one system in its own process: builds it, then answers (method, arg) requests."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    system = EngineSystem(Path(path), threads) if kind == "engine" else HFSystem(Path(path), threads)
    conn.send(("ready", None))
    while True:
        request = conn.recv()
        if request is None:
            return
        method, arg = request
        conn.send(("ok", getattr(system, method)(arg)))


class Remote:
    """A system in a worker process, called like a local one."""

    def __init__(self, kind: str, path: Path, threads: int):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(kind, str(path), threads, child), daemon=True)
        self.proc.start()
        assert self.conn.recv()[0] == "ready"

    def call(self, method: str, arg):
        self.conn.send((method, arg))
        status, value = self.conn.recv()
        return value

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--engines", type=Path, default=Path("engines/bench"))
    args = ap.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)

    builds = {}
    for dtype in ("float32", "bfloat16"):
        print(f"building {dtype} engine ...", file=sys.stderr)
        builds[dtype] = build(args.model, args.engines / f"smollm2-{dtype}", dtype)
    from bessemer.runtime.tokenizer import Tokenizer

    tokenizer = Tokenizer(args.engines / "smollm2-float32")
    systems = {"bessemer-fp32": Remote("engine", args.engines / "smollm2-float32", args.threads),
               "bessemer-bf16": Remote("engine", args.engines / "smollm2-bfloat16", args.threads),
               "hf-fp32": Remote("hf", args.model, args.threads)}
    encode = tokenizer.encode
    long_prompt = prompt_ids(encode, 512, 0)
    chat = tokenizer.encode_chat([{"role": "user", "content": "Tell me a long story about a steel mill."}])
    batch_prompts = [prompt_ids(encode, 32 + 8 * i, i + 1) for i in range(8)]
    workloads = {"prefill_tok_s": ("prefill", long_prompt), "decode_tok_s": ("decode", chat),
                 "batch8_tok_s": ("batch", batch_prompts)}

    results = {name: {w: [] for w in workloads} for name in systems}
    for name, system in systems.items():  # warm-up
        for method, arg in workloads.values():
            system.call(method, arg if method != "batch" else arg[:2])
    for rep in range(args.repeats):
        for w, (method, arg) in workloads.items():
            for name, system in systems.items():
                results[name][w].append(system.call(method, arg))
                print(f"[{rep + 1}/{args.repeats}] {name:14s} {w:14s} {results[name][w][-1]:9.1f}", file=sys.stderr)

    medians = {n: {w: round(statistics.median(v), 2) for w, v in r.items()} for n, r in results.items()}
    ratios = {n: {w: round(medians[n][w] / medians["hf-fp32"][w], 2) for w in workloads}
              for n in systems if n != "hf-fp32"}
    report = {"threads": args.threads, "repeats": args.repeats, "new_tokens": NEW_TOKENS,
              "prompt_tokens": {"prefill": len(long_prompt), "decode": len(chat),
                                "batch8": [len(p) for p in batch_prompts]},
              "medians": medians, "ratio_vs_hf_fp32": ratios, "runs": results, "builds": builds}
    for system in systems.values():
        system.close()
    (args.out / "decode.json").write_text(json.dumps(report, indent=2))
    print(f"\n{'system':15s} {'prefill tok/s':>14s} {'decode tok/s':>13s} {'batch8 tok/s':>13s}")
    for n in systems:
        m = medians[n]
        r = ratios.get(n)
        fmt = lambda w: f"{m[w]:.1f}" + (f" ({r[w]:.2f}x)" if r else "")
        print(f"{n:15s} {fmt('prefill_tok_s'):>14s} {fmt('decode_tok_s'):>13s} {fmt('batch8_tok_s'):>13s}")
    for dtype, b in builds.items():
        print(f"build {dtype}: {b['build_s']} s, peak RSS {b['build_peak_rss_mib']} MiB, engine {b['engine_mib']} MiB")
    print(f"wrote {args.out / 'decode.json'}")


if __name__ == "__main__":
    main()
