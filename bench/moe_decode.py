"""Batch-1 decode of a mixture-of-experts engine per ISA, against its memory-bandwidth ceiling
(issue 34: the expert kernels at real widths).

    python bench/moe_decode.py ENGINE_DIR [--isas avx2,avx512] [--threads 2] [--repeats 3]
                               [--prompt-len 16] [--new-tokens 32]

For each repeat, each ISA in turn (interleaved, so that load from elsewhere hits them alike)
generates --new-tokens greedy tokens after a --prompt-len prompt with the kernel profiler on;
a second, one-token run gives the prefill's share, so the per-token figures are decode only:
decode tok/s (first to last token), and ms per token in the expert kernels and elsewhere.
Medians over the repeats.

Ceilings (tok/s if each token cost exactly one read of its weight bytes at the measured copy
bandwidth, compare_setup.copy_bandwidth, (read + write) / s):
  experts   the routed experts' bytes per token: top_k / num_experts of each expert tensor
            (codes, scales, biases), every MoE layer;
  token     those plus every other weight read once per token (the input embedding is a
            gather of one row and is left out unless tied to the head).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def weight_bytes(engine: Path) -> dict:
    """{"experts": routed expert bytes per token, "other": every other weight's bytes (embedding
    gather left out)} from rank0's tensor table and plan."""
    from bessemer.format.container import read_rank_header

    header = read_rank_header(engine / "rank0.engine")[2]
    sizes = {t["name"]: t["nbytes"] for t in header["tensors"]}
    experts, expert_names = 0.0, set()
    for step in header["plan"]["steps"]:
        if step["op"].startswith("moe"):
            share = step["attrs"]["top_k"] / step["attrs"]["num_experts"]
            experts += share * sum(sizes[w] for w in step["weights"])
            expert_names.update(step["weights"])
    steps = header["plan"]["steps"]
    gathered = {w for s in steps if s["op"] == "embedding" for w in s["weights"]} - \
        {w for s in steps if s["op"] != "embedding" for w in s["weights"]}  # one row per token
    other = sum(n for name, n in sizes.items() if name not in expert_names and name not in gathered)
    return {"experts": int(experts), "other": int(other)}


def decode_run(llm, prompt: list[int], new_tokens: int) -> dict:
    """One profiled generation: decode tok/s, and seconds per op summed over the run."""
    from bessemer.runtime.llm import SamplingParams

    llm.executor.profiling = True  # clears the counters
    out = llm.generate([prompt], SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))[0]
    stats = {op: s for op, (_, s) in llm.executor.profile_stats().items()}
    llm.executor.profiling = False
    m = out.metrics
    span = m["last_token_time"] - m["first_token_time"]
    return {"tok_s": (len(out.token_ids) - 1) / span if span > 0 else 0.0, "ops": stats,
            "tokens": list(out.token_ids)}


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", type=Path)
    ap.add_argument("--isas", default="avx2,avx512")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()

    import compare_setup
    from bessemer.runtime.llm import LLM

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    isas = args.isas.split(",")
    prompt = list(range(100, 100 + args.prompt_len))
    llms = {isa: LLM(args.engine, num_threads=args.threads, isa=isa, kv_cache_gib=0.25,
                     enable_prefix_caching=False) for isa in isas}
    load_start = os.getloadavg()
    bw = compare_setup.copy_bandwidth(args.threads)
    runs: dict[str, list[dict]] = {isa: [] for isa in isas}
    tokens: dict[str, list[int]] = {}
    for isa in isas:  # warm-up: pages of the engine in memory, thread pools started
        tokens[isa] = decode_run(llms[isa], prompt, 4)["tokens"]
    for _ in range(args.repeats):
        for isa in isas:
            full = decode_run(llms[isa], prompt, args.new_tokens)
            first = decode_run(llms[isa], prompt, 1)  # the prefill alone
            n = args.new_tokens - 1
            moe = sum(s for op, s in full["ops"].items() if op.startswith("moe")) - \
                sum(s for op, s in first["ops"].items() if op.startswith("moe"))
            total = sum(full["ops"].values()) - sum(first["ops"].values())
            runs[isa].append({"tok_s": full["tok_s"], "moe_ms": 1e3 * moe / n, "other_kernels_ms": 1e3 * (total - moe) / n})
    for llm in llms.values():
        llm.close()
    sizes = weight_bytes(args.engine)
    copy = bw["copy_GBps"] * 1e9
    result = {"engine": str(args.engine), "threads": args.threads, "prompt_len": args.prompt_len,
              "new_tokens": args.new_tokens, "repeats": args.repeats, "load_avg_start": load_start,
              "load_avg_end": os.getloadavg(), "copy_bandwidth": bw, "weight_bytes_per_token": sizes,
              "ceiling_tok_s": {"experts": copy / sizes["experts"], "token": copy / (sizes["experts"] + sizes["other"])},
              "same_greedy_tokens": len({tuple(t) for t in tokens.values()}) == 1, "isas": {}}
    print(f"copy bandwidth {bw['copy_GBps']} GB/s ({args.threads} threads); routed expert bytes/token "
          f"{sizes['experts'] / 1e6:.1f} MB, other weights {sizes['other'] / 1e6:.1f} MB; load {load_start} -> "
          f"{result['load_avg_end']}")
    for isa in isas:
        med = {k: statistics.median(r[k] for r in runs[isa]) for k in runs[isa][0]}
        # the expert kernel alone against the experts' ceiling: its bytes / its time
        moe_gbps = sizes["experts"] / (med["moe_ms"] / 1e3) / 1e9
        tok_pct = 100 * med["tok_s"] / result["ceiling_tok_s"]["token"]
        result["isas"][isa] = dict(med, runs=runs[isa], moe_read_GBps=moe_gbps,
                                   moe_pct_of_copy_bw=100 * moe_gbps * 1e9 / copy, tok_s_pct_of_ceiling=tok_pct)
        print(f"{isa:7s} decode {med['tok_s']:.2f} tok/s ({tok_pct:.0f}% of the {result['ceiling_tok_s']['token']:.2f} "
              f"tok/s ceiling); experts {med['moe_ms']:.1f} ms/token = {moe_gbps:.1f} GB/s "
              f"({100 * moe_gbps * 1e9 / copy:.0f}% of copy bandwidth); other kernels {med['other_kernels_ms']:.1f} ms")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
