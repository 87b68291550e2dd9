"""Where the time goes: per-kernel time of an engine at prefill and at decode, and the
time spent outside the kernels (Python scheduling, sampling, detokenization).

    python bench/profile_engine.py ENGINE_DIR [--threads 2] [--prompt-len 512] [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import time

from bessemer.runtime.llm import LLM, SamplingParams


def profiled(llm: LLM, prompt: list[int], max_tokens: int) -> dict:
    llm.executor.profiling = True  # clears the counters
    t = time.perf_counter()
    out = llm.generate([prompt], SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))[0]
    wall = time.perf_counter() - t
    stats = llm.executor.profile_stats()
    llm.executor.profiling = False
    kernels = sum(s for _, s in stats.values())
    return {"wall_s": wall, "tokens": len(out.token_ids), "kernel_s": kernels, "outside_kernels_s": wall - kernels,
            "ops": {op: {"calls": c, "s": s, "share": s / wall} for op, (c, s) in sorted(stats.items(), key=lambda x: -x[1][1])}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    llm = LLM(args.engine, num_threads=args.threads, enable_prefix_caching=False)
    prompt = [(i * 7919) % 1000 + 100 for i in range(args.prompt_len)]
    llm.generate([prompt[:16]], SamplingParams(max_tokens=4, temperature=0))  # warm-up
    prefill = profiled(llm, prompt, 1)
    prefill["tokens"] = len(prompt)  # prompt tokens processed
    both = profiled(llm, prompt, args.new_tokens)
    decode = {"wall_s": both["wall_s"] - prefill["wall_s"], "tokens": args.new_tokens - 1,
              "outside_kernels_s": both["outside_kernels_s"] - prefill["outside_kernels_s"],
              "ops": {op: {"s": v["s"] - prefill["ops"].get(op, {"s": 0})["s"]} for op, v in both["ops"].items()}}
    for op in decode["ops"].values():
        op["share"] = op["s"] / decode["wall_s"]
    result = {"engine": args.engine, "threads": args.threads, "prefill": prefill, "decode": decode}
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for phase in ("prefill", "decode"):
        r = result[phase]
        per = r["wall_s"] / max(r["tokens"], 1) * 1000
        print(f"{phase}: {r['wall_s']:.3f} s for {r['tokens']} tokens ({per:.2f} ms/token, "
              f"{r['tokens'] / r['wall_s']:.1f} tok/s)")
        for op, v in r["ops"].items():
            print(f"  {op:14s} {v['s'] * 1000:9.1f} ms  {v['share'] * 100:5.1f}%")
        print(f"  {'outside':14s} {r['outside_kernels_s'] * 1000:9.1f} ms  {r['outside_kernels_s'] / r['wall_s'] * 100:5.1f}%")


if __name__ == "__main__":
    main()
