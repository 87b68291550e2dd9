"""Quantization modes on SmolLM2 in one run: accuracy, size, speed, build time.

For each mode: build the engine (timed; calibration statistics are cached after the first
calibrated mode), perplexity on WikiText-2 by the `bessemer eval` protocol, then decode tok/s
at batch 1 (128 new tokens, EOS ignored) and prefill tok/s (one 512-token prompt), medians
of --repeats with the modes interleaved.

With --kv-dtypes float,int8,fp8 every mode is also built with that KV cache (rows
"MODE+kv-int8"), and --long-context N adds decode tok/s after an N-token prompt (the regime
where the KV cache is read most) and the KV bytes per token.

    python bench/quant.py --model DIR [--modes fp32,w8a16,...] [--kv-dtypes float,int8,fp8]
        [--long-context 2048] [--max-tokens 8192] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.datasets import wikitext2_valid
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.evaluate import perplexity, read_dataset, windows
from bessemer.runtime.llm import LLM, SamplingParams

WIKITEXT = wikitext2_valid()
MODES = {  # name -> (dtype, quant config or None)
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "w8a16": ("float32", dict(mode="w8a16")),
    "w4a16-g64": ("float32", dict(mode="w4a16", group_size=64)),
    "w4a16-g128": ("float32", dict(mode="w4a16", group_size=128)),
    "w4a16-awq-g64": ("float32", dict(mode="w4a16-awq", group_size=64)),
    "w4a16-gptq-g64": ("float32", dict(mode="w4a16-gptq", group_size=64)),
    # SmoothQuant, int8 activations; the o_proj variants and the statistics backends
    "w8a8-sq": ("float32", dict(mode="w8a8-sq")),
    "w8a8-sq-native": ("float32", dict(mode="w8a8-sq", calib_backend="native")),
    "w8a8-sq-modelopt": ("float32", dict(mode="w8a8-sq", calib_backend="modelopt")),
    "w8a8-sq-o-kernel": ("float32", dict(mode="w8a8-sq", calib_backend="native", o_proj_smoothing="kernel")),
    "w8a8-sq-a0.8": ("float32", dict(mode="w8a8-sq", calib_backend="native", smoothquant_alpha=0.8)),
    "fp8": ("float32", dict(mode="fp8")),
}


def calib_text(folder: Path) -> Path:
    """The second half of WikiText-2 valid: the perplexity protocol scores its first tokens.
    (fp8 uses it; the AWQ/GPTQ rows of the previous table calibrated on the whole file.)"""
    text = WIKITEXT.read_text(encoding="utf-8")
    path = folder / "calib-second-half.txt"
    folder.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != text[len(text) // 2:]:
        path.write_text(text[len(text) // 2:], encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--dtype", default=None, help="Override the storage dtype of unquantized tensors.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--kv-dtypes", default="float", help="KV caches per mode: float (the mode's dtype), "
                    "float32, bfloat16, int8, fp8")
    ap.add_argument("--long-context", type=int, default=0, help="Also time decode after a prompt this long.")
    ap.add_argument("--engines", type=Path, default=Path("engines/quant"))
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    kv_dtypes = args.kv_dtypes.split(",")
    names = [m if kv == "float" else f"{m}+kv-{kv}" for m in args.modes.split(",") for kv in kv_dtypes]
    rows: dict[str, dict] = {}
    llms: dict[str, LLM] = {}
    calib = calib_text(args.engines)  # held out from the scored tokens
    for name in names:
        mode, _, kv = name.partition("+kv-")
        dtype, q = MODES[mode]
        # every calibrated mode (AWQ, GPTQ, SmoothQuant, fp8) sees the same held-out text
        quant = QuantConfig(**q, calib_data=str(calib), calib_samples=args.calib_samples) if q else None
        t = time.perf_counter()
        out = build_engine(args.model, args.engines / name, BuildConfig(
            dtype=args.dtype or dtype, quant=quant, kv_cache_dtype=kv or None,
            max_seq_len=max(2048, args.long_context + 256)))
        rows[name] = {"mode": name, "build_s": round(time.perf_counter() - t, 1),
                      "engine_mib": round((out / "rank0.engine").stat().st_size / 2**20, 1)}
        llms[name] = LLM(out, num_threads=args.threads, enable_prefix_caching=False)  # measure real prefill
        rows[name]["kv_bytes_per_token"] = llms[name].engine.kv_bytes_per_token()
        print(f"built {name}: {rows[name]}", file=sys.stderr)

    text = read_dataset(WIKITEXT)
    tok = llms[names[0]].tokenizer
    text_ids = tok.encode(text, add_special_tokens=False)  # the whole file, once
    wins = windows(text_ids, args.context_len, args.max_tokens)
    for name in names:
        rows[name]["ppl"] = round(perplexity(llms[name].score, wins).perplexity, 4)
        print(f"ppl {name}: {rows[name]['ppl']}", file=sys.stderr)

    chat = tok.encode_chat([{"role": "user", "content": "Tell me a long story about a steel mill."}])
    long_prompt = tok.encode(text[:20000], add_special_tokens=False)[:512]
    greedy = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    runs = {n: {"decode": [], "prefill": [], "decode_long": []} for n in names}
    ctx_prompt = text_ids[:args.long_context]
    for n in names:  # warm-up
        llms[n].generate([chat], SamplingParams(max_tokens=8, temperature=0))
    for rep in range(args.repeats):
        for n in names:
            o = llms[n].generate([chat], greedy)[0]
            runs[n]["decode"].append(127 / (o.metrics["last_token_time"] - o.metrics["first_token_time"]))
            t = time.perf_counter()
            llms[n].generate([long_prompt], SamplingParams(max_tokens=1, temperature=0))
            runs[n]["prefill"].append(len(long_prompt) / (time.perf_counter() - t))
            if args.long_context:
                o = llms[n].generate([ctx_prompt], greedy)[0]
                runs[n]["decode_long"].append(127 / (o.metrics["last_token_time"] - o.metrics["first_token_time"]))
        print(f"speed round {rep + 1}/{args.repeats} done", file=sys.stderr)
    base_ppl = rows.get("fp32", rows[names[0]])["ppl"]
    base = names[0] if "fp32" not in names else "fp32"
    for n in names:
        rows[n]["decode_tok_s"] = round(statistics.median(runs[n]["decode"]), 1)
        rows[n]["prefill_tok_s"] = round(statistics.median(runs[n]["prefill"]), 1)
        if args.long_context:
            rows[n][f"decode_tok_s_ctx{args.long_context}"] = round(statistics.median(runs[n]["decode_long"]), 1)
        rows[n]["ppl_delta_pct"] = round((rows[n]["ppl"] / base_ppl - 1) * 100, 2)
    for n in names:
        rows[n]["decode_vs_fp32"] = round(rows[n]["decode_tok_s"] / rows[base]["decode_tok_s"], 2)
        rows[n]["prefill_vs_fp32"] = round(rows[n]["prefill_tok_s"] / rows[base]["prefill_tok_s"], 2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quant.json").write_text(json.dumps({"rows": rows, "runs": runs, "scored_tokens": sum(len(w) - 1 for w in wins),
                                                      "context_len": args.context_len, "threads": args.threads}, indent=2))
    cols = ["mode", "ppl", "ppl_delta_pct", "engine_mib", "decode_tok_s", "decode_vs_fp32", "prefill_tok_s",
            "prefill_vs_fp32", "build_s", "kv_bytes_per_token"] + (
                [f"decode_tok_s_ctx{args.long_context}"] if args.long_context else [])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for n in names:
        print("| " + " | ".join(str(rows[n][c]) for c in cols) + " |")


if __name__ == "__main__":
    main()
