"""Speculative decoding and constrained decoding on SmolLM2, batch 1, in one run.

Workloads (greedy, 2 threads, prefix caching off so every run computes its prompt, the minimum KV
pool: one 2048-token sequence):
  ngram     input-grounded chat prompts whose answers copy from the prompt: "repeat this
            passage", "correct the typos in this passage", "continue this list of
            numbers / the same sentence pattern"; target without drafts vs prompt
            lookup (k = 4, n-grams up to 4). Text must be identical.
  draft     target (--target-dtype, fp32 by default) vs a w4a16 build of the same model as
            draft engine, k = 2..6, on the same prompts plus two open-ended ones.
  json      a chat prompt asking for a person as JSON: unconstrained vs constrained by a
            JSON schema (per-token decode time; the texts differ by design).
Decode tok/s = (tokens - 1) / (last token time - first token time). Every figure is the
median over --repeats rounds; within a round the configurations are interleaved, so a
burst of load on this shared machine hits all of them alike. The load average is
printed with the results.

    python bench/speculative.py --model DIR [--threads 2] [--repeats 3] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PASSAGE = ("The harbour town woke slowly. Fishermen carried their nets down to the water, the baker opened his "
           "shutters, and the church bell rang seven times. By eight o'clock the market square was full of carts, "
           "and the smell of fresh bread drifted over the stalls where farmers sold apples, cheese and eggs.")
TYPOS = ("The harbor town woke slowely. Fishermen caried their nets down to the water, the baker opend his "
         "shutters, and the chruch bell rang seven times. By eight oclock the market square was ful of carts.")
GROUNDED = [
    f"Repeat the following passage exactly, word for word.\n\n{PASSAGE}",
    f"Correct the spelling mistakes in this passage and write out the whole corrected passage.\n\n{TYPOS}",
    "Continue this list up to 60, in the same format: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
    f"Here is a passage:\n{PASSAGE}\nRewrite the passage in the past perfect tense, keeping every detail.",
]
OPEN = ["Write a short story about a robot who learns to paint.", "Explain how a steam engine works."]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "city", "hobbies"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"},
                         "city": {"type": "string", "maxLength": 20},
                         "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}}}


def build(model: Path, out: Path, *flags: str) -> Path:
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "bessemer.cli.build", str(model), "--output", str(out),
                        "--max-seq-len", "2048", "-q", *flags], check=True)
    return out


def decode_rate(out) -> float:
    m, n = out.metrics, len(out.token_ids)
    span = (m["last_token_time"] or 0) - (m["first_token_time"] or 0)
    return (n - 1) / span if n > 1 and span > 0 else float("nan")


def run(llm, ids, params):
    before = llm.llm_engine.stats()
    out = llm.generate([ids], params)[0]
    after = llm.llm_engine.stats()
    return out, after.num_draft_tokens - before.num_draft_tokens, after.num_accepted_tokens - before.num_accepted_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--engines", type=Path, default=Path("bench/results/engines"))
    ap.add_argument("--target-dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-k", default="2,3,4,5,6")
    ap.add_argument("--skip", default="", help="comma list of workloads to skip: ngram,draft,json")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from bessemer.runtime.llm import LLM, SamplingParams

    skip = set(filter(None, args.skip.split(",")))
    target = build(args.model, args.engines / f"smollm2-{args.target_dtype}", "--dtype", args.target_dtype)
    llms = {"plain": LLM(target, num_threads=args.threads, enable_prefix_caching=False, kv_cache_gib=0)}
    tok = llms["plain"].tokenizer
    if "ngram" not in skip:
        llms["ngram k4"] = LLM(target, num_threads=args.threads, enable_prefix_caching=False, kv_cache_gib=0,
                               speculative={"method": "ngram", "num_tokens": 4})
    if "draft" not in skip:
        draft = build(args.model, args.engines / "smollm2-w4a16", "--dtype", "bfloat16", "--quant", "w4a16")
        for k in map(int, args.draft_k.split(",")):
            llms[f"draft k{k}"] = LLM(target, num_threads=args.threads, enable_prefix_caching=False, kv_cache_gib=0,
                                      speculative={"method": "draft", "draft_engine": str(draft), "num_tokens": k})
    greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    prompts = {"grounded": [tok.encode_chat([{"role": "user", "content": p}]) for p in GROUNDED],
               "open": [tok.encode_chat([{"role": "user", "content": p}]) for p in OPEN]}
    rates: dict = {}
    texts: dict = {}
    loads = []
    for r in range(args.repeats):
        loads.append(os.getloadavg()[0])
        for name, llm in llms.items():
            for kind, ids_list in prompts.items():
                if kind == "open" and name.startswith("ngram"):
                    continue
                for i, ids in enumerate(ids_list):
                    out, drafted, accepted = run(llm, ids, greedy)
                    entry = rates.setdefault((name, kind), {"rates": [], "drafted": 0, "accepted": 0, "tokens": 0})
                    entry["rates"].append(decode_rate(out))
                    if r == 0:
                        entry["drafted"] += drafted
                        entry["accepted"] += accepted
                        entry["tokens"] += len(out.token_ids)
                    texts.setdefault((name, kind, i), out.text)
        print(f"round {r + 1}/{args.repeats} done (load {loads[-1]:.1f})", file=sys.stderr)
    rows = []
    base = {kind: statistics.median(rates[("plain", kind)]["rates"]) for kind in prompts}
    for (name, kind), e in rates.items():
        same = all(texts[(name, kind, i)] == texts[("plain", kind, i)] for i in range(len(prompts[kind])))
        rate = statistics.median(e["rates"])
        rows.append({"config": name, "prompts": kind, "decode_tok_s": round(rate, 1),
                     "speedup": round(rate / base[kind], 2), "acceptance": round(e["accepted"] / e["drafted"], 3)
                     if e["drafted"] else None, "accepted_share_of_tokens": round(e["accepted"] / max(1, e["tokens"]), 3),
                     "identical_text": same})
    if "json" not in skip:
        rows += json_overhead(llms["plain"], tok, SamplingParams, args)
    result = {"threads": args.threads, "repeats": args.repeats, "target": args.target_dtype,
              "load_avg_per_round": [round(x, 1) for x in loads], "rows": rows}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "speculative.json").write_text(json.dumps(result, indent=1))


def json_overhead(llm, tok, SamplingParams, args) -> list[dict]:
    """ms per decode step, unconstrained vs JSON-schema constrained (same prompt, greedy)."""
    ids = tok.encode_chat([{"role": "user", "content": "Describe a fictional person as JSON with a name, age, "
                                                       "city and a list of hobbies."}])
    free = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=64, temperature=0, json_schema=PERSON)
    llm.generate([ids], constrained)  # warm-up: the vocabulary's matcher tables are built once
    ms = {"free": [], "json": []}
    for _ in range(args.repeats * 2):
        for name, params in (("free", free), ("json", constrained)):
            out = llm.generate([ids], params)[0]
            ms[name].append(1000 / decode_rate(out))
    a, b = statistics.median(ms["free"]), statistics.median(ms["json"])
    return [{"config": "json-schema constrained", "prompts": "json", "ms_per_token_free": round(a, 3),
             "ms_per_token_json": round(b, 3), "overhead": round(b / a - 1, 4)}]


if __name__ == "__main__":
    main()
