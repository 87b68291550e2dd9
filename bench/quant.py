"""Quantization modes on SmolLM2 in one table: bits per weight, perplexity on three held-out
texts, and (with --repeats > 0) size, speed and build time; beside them llama.cpp's own GGUF
types made from the same checkpoint and scored by llama.cpp on the same token windows.

Texts (--texts): wikitext2 (WikiText-2 valid: its first --max-tokens tokens are scored, the
calibrated modes calibrate on its second half), hamlet (Shakespeare) and python-code (CPython
3.11.7's dataclasses.py: source code), these two in bessemer/datasets and never used for
calibration. All are cut into windows of --context-len tokens by the
protocol of `bessemer eval` (runtime/evaluate.py); every system scores the same token ids.

Bits per weight (quantization/bits.py): every stored byte of the matrices (codes, scales,
offsets) over their weights; "decoder" is the decoder layers' matrices, "all" adds the
lm_head (the tied embedding table of SmolLM2). For GGUF files the same buckets are counted
from the file (compare_setup.gguf_bits).

llama.cpp rows (--gguf q8_0,q4_0,...): the anchors' venv and GGUF files of
bench/compare_setup.py (llama-cpp-python compiled from its sdist: 20+ minutes the first time);
bench/gguf_perplexity.py scores them. --gguf "" skips them.

For each Bessemer mode, with --repeats > 0: decode tok/s at batch 1 (128 new tokens, EOS
ignored) and prefill tok/s (one 512-token prompt), medians of --repeats with the modes
interleaved. With --kv-dtypes float,int8,fp8 every mode is also built with that KV cache
(rows "MODE+kv-int8"), and --long-context N adds decode tok/s after an N-token prompt.

    python bench/quant.py --model DIR [--modes fp32,w4a16-g32,...] [--gguf q4_0,q4_k_m]
        [--texts wikitext2,hamlet,python-code] [--repeats 0] [--max-tokens 8192] [--out bench/results]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_setup as setup  # noqa: E402

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.datasets import wikitext2_valid
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.evaluate import perplexity, read_dataset, windows
from bessemer.runtime.llm import LLM, SamplingParams

WIKITEXT = wikitext2_valid()
DEFAULT_MODES = ("fp32,w8a16,w4a16-g32,w4a16-g64,w4a16-g32-asym,w4a16-gptq-g32,w4a16-gptq-g64,"
                 "w4a16-gptq-g32-asym,w8a8-sq,fp8")
DEFAULT_GGUF = "f32,q8_0,q4_0,q4_1,q4_k_s,q4_k_m,iq4_nl"
MODES = {  # name -> (dtype, quant config or None)
    "fp32": ("float32", None),
    "bf16": ("bfloat16", None),
    "w8a16": ("float32", dict(mode="w8a16")),
    # 4-bit: symmetric (scales only: 4 + 16 / G bits per weight) unless "-asym" (+ offsets)
    "w4a16-g32": ("float32", dict(mode="w4a16", group_size=32)),
    "w4a16-g64": ("float32", dict(mode="w4a16", group_size=64)),
    "w4a16-g128": ("float32", dict(mode="w4a16", group_size=128)),
    "w4a16-g32-asym": ("float32", dict(mode="w4a16", group_size=32, zero_point=True)),
    "w4a8-g32": ("float32", dict(mode="w4a8", group_size=32)),
    "w4a8-g64": ("float32", dict(mode="w4a8", group_size=64)),
    "w4a16-awq-g32": ("float32", dict(mode="w4a16-awq", group_size=32)),
    "w4a16-awq-g64": ("float32", dict(mode="w4a16-awq", group_size=64)),
    "w4a16-gptq-g32": ("float32", dict(mode="w4a16-gptq", group_size=32)),
    "w4a16-gptq-g64": ("float32", dict(mode="w4a16-gptq", group_size=64)),
    "w4a16-gptq-g32-asym": ("float32", dict(mode="w4a16-gptq", group_size=32, zero_point=True)),
    # SmoothQuant, int8 activations; the o_proj variants and the statistics backends
    "w8a8-sq": ("float32", dict(mode="w8a8-sq")),
    "w8a8-sq-native": ("float32", dict(mode="w8a8-sq", calib_backend="native")),
    "w8a8-sq-modelopt": ("float32", dict(mode="w8a8-sq", calib_backend="modelopt")),
    "w8a8-sq-o-kernel": ("float32", dict(mode="w8a8-sq", calib_backend="native", o_proj_smoothing="kernel")),
    "w8a8-sq-a0.8": ("float32", dict(mode="w8a8-sq", calib_backend="native", smoothquant_alpha=0.8)),
    "fp8": ("float32", dict(mode="fp8")),
    "fp8-static": ("float32", dict(mode="fp8", fp8_activations="static")),
    "fp8-dynamic": ("float32", dict(mode="fp8", fp8_activations="dynamic")),
    "fp8-static-nearest": ("float32", dict(mode="fp8", fp8_activations="static", fp8_rounding="nearest")),
    "fp8-dynamic-nearest": ("float32", dict(mode="fp8", fp8_activations="dynamic", fp8_rounding="nearest")),
    # lm_head (SmolLM2: the tied embedding table) left in the build dtype instead of int8
    "fp8-lm-fp32": ("float32", dict(mode="fp8", lm_head="none")),
    # the MLP's down_proj (the input with the largest activation outliers) left unquantized
    "fp8-keep-down": ("float32", dict(mode="fp8", exclude_modules=("model.embed_tokens", "*.mlp.down_proj"))),
    # SmoothQuant's migration of activation outliers into the weights before E4M3 (folded inputs)
    "fp8-smooth-a0.5": ("float32", dict(mode="fp8", fp8_smoothing_alpha=0.5)),
    # each token's activation scale refined by a power of two per group of G input columns
    "fp8-g128": ("float32", dict(mode="fp8", fp8_act_group=128)),
    "fp8-g64": ("float32", dict(mode="fp8", fp8_act_group=64)),
    "fp8-g32": ("float32", dict(mode="fp8", fp8_act_group=32)),
    "fp8-g32-nearest": ("float32", dict(mode="fp8", fp8_act_group=32, fp8_rounding="nearest")),
    "fp8-g128-nearest": ("float32", dict(mode="fp8", fp8_act_group=128, fp8_rounding="nearest")),
    "fp8-g32-smooth-a0.5": ("float32", dict(mode="fp8", fp8_act_group=32, fp8_smoothing_alpha=0.5)),
    "w8a16-lm-fp32": ("float32", dict(mode="w8a16", lm_head="none")),
    # lm_head (the tied table) in symmetric int4 g32 too: every matrix at 4.5 bits per weight
    "w4a16-gptq-g32-lm4": ("float32", dict(mode="w4a16-gptq", group_size=32, lm_head="int4")),
    # mixed precision within a budget over all matrices (quantization/mixed_precision.py)
    "w4a16-gptq-mp4.85": ("float32", dict(mode="w4a16-gptq", group_size=32, bits_per_weight=4.85)),
    "w4a16-gptq-mp4.75": ("float32", dict(mode="w4a16-gptq", group_size=32, bits_per_weight=4.75)),
    "w4a16-mp4.85": ("float32", dict(mode="w4a16", group_size=32, bits_per_weight=4.85)),
    # two-level 4-bit (k-quant class: 8-bit scale and minimum per 32 under fp16 ones per
    # super-block of up to 256; quantization/superblock.py), lm_head int8 or int4
    "w4k": ("float32", dict(mode="w4k")),
    "w4k-gptq": ("float32", dict(mode="w4k-gptq")),
    "w4k-gptq-lm4": ("float32", dict(mode="w4k-gptq", lm_head="int4")),
    "w4k-gptq-mp4.85": ("float32", dict(mode="w4k-gptq", bits_per_weight=4.85)),
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


def score_gguf(model: Path, types: list[str], wins: dict[str, list[list[int]]], threads: int) -> dict[str, dict]:
    """llama.cpp rows: bits per weight and perplexity of each GGUF type on the same windows."""
    from bessemer.artifacts.inputs_hash import checkpoint_hash

    setup.ensure_venv(need_llama=True, need_ort=False)
    files = setup.gguf_files(model, checkpoint_hash(model), types)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        wpath = Path(tmp) / "windows.json"
        wpath.write_text(json.dumps(wins))
        for t in types:
            bits, hist = setup.gguf_bits(files[t])
            res = subprocess.run([str(setup.venv_python()), str(Path(__file__).with_name("gguf_perplexity.py")),
                                  str(files[t]), str(wpath), str(threads)], capture_output=True, text=True)
            if res.returncode != 0:
                raise SystemExit(f"error: llama.cpp could not score {t}: {res.stderr.strip().splitlines()[-1:]}")
            ppl = json.loads(res.stdout.strip().splitlines()[-1])
            rows[f"llama.cpp {t.upper()}"] = {"mode": f"llama.cpp {t.upper()}", "bits": bits, "ggml_types": hist,
                                              "ppl": {k: round(v["perplexity"], 4) for k, v in ppl.items()},
                                              "scored": {k: v["scored_tokens"] for k, v in ppl.items()}}
            print(f"ppl llama.cpp {t}: {rows[f'llama.cpp {t.upper()}']['ppl']} ({hist})", file=sys.stderr)
    return rows


def measure_speed(llms: dict, names: list[str], rows: dict, text: str, text_ids: list[int], args) -> dict:
    tok = llms[names[0]].tokenizer
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
    base = names[0] if "fp32" not in names else "fp32"
    for n in names:
        rows[n]["decode_tok_s"] = round(statistics.median(runs[n]["decode"]), 1)
        rows[n]["prefill_tok_s"] = round(statistics.median(runs[n]["prefill"]), 1)
        if args.long_context:
            rows[n][f"decode_tok_s_ctx{args.long_context}"] = round(statistics.median(runs[n]["decode_long"]), 1)
    for n in names:
        rows[n]["decode_vs_fp32"] = round(rows[n]["decode_tok_s"] / rows[base]["decode_tok_s"], 2)
        rows[n]["prefill_vs_fp32"] = round(rows[n]["prefill_tok_s"] / rows[base]["prefill_tok_s"], 2)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--modes", default=DEFAULT_MODES, help=f"Bessemer modes: {', '.join(MODES)}")
    ap.add_argument("--gguf", default=DEFAULT_GGUF, help=f"llama.cpp types ({', '.join(setup.GGUF_TYPES)}); '' for none")
    ap.add_argument("--texts", default="wikitext2,hamlet,python-code", help="Built-in texts or files to score.")
    ap.add_argument("--dtype", default=None, help="Override the storage dtype of unquantized tensors.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=0, help="Speed rounds (0: accuracy and size only).")
    ap.add_argument("--max-tokens", type=int, default=8192, help="Tokens scored per text.")
    ap.add_argument("--context-len", type=int, default=1024)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-seq-len", type=int, default=512)
    ap.add_argument("--kv-dtypes", default="float", help="KV caches per mode: float (the mode's dtype), "
                    "float32, bfloat16, int8, fp8")
    ap.add_argument("--long-context", type=int, default=0, help="Also time decode after a prompt this long.")
    ap.add_argument("--engines", type=Path, default=Path("engines/quant"))
    ap.add_argument("--reuse", action="store_true", help="Keep engines already built under --engines (same "
                    "mode names) instead of rebuilding them; their build_s is then absent.")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    kv_dtypes = args.kv_dtypes.split(",")
    names = [m if kv == "float" else f"{m}+kv-{kv}" for m in args.modes.split(",") if m for kv in kv_dtypes]
    texts = [t for t in args.texts.split(",") if t]
    rows: dict[str, dict] = {}
    llms: dict[str, LLM] = {}
    calib = calib_text(args.engines)  # held out from the scored tokens
    for name in names:
        mode, _, kv = name.partition("+kv-")
        dtype, q = MODES[mode]
        # every calibrated mode (AWQ, GPTQ, SmoothQuant, fp8) sees the same held-out text
        quant = QuantConfig(**q, calib_data=str(calib), calib_samples=args.calib_samples,
                            calib_seq_len=args.calib_seq_len) if q else None
        t = time.perf_counter()
        out = args.engines / name
        reused = args.reuse and (out / "config.json").exists()
        if not reused:
            build_engine(args.model, out, BuildConfig(dtype=args.dtype or dtype, quant=quant, kv_cache_dtype=kv or None,
                                                      max_seq_len=max(2048, args.long_context + 256)))
        report = json.loads((out / "build_report.json").read_text())
        rows[name] = {"mode": name, "build_s": None if reused else round(time.perf_counter() - t, 1),
                      "bits": report["bits_per_weight"],
                      "engine_mib": round((out / "rank0.engine").stat().st_size / 2**20, 1)}
        llms[name] = LLM(out, num_threads=args.threads, enable_prefix_caching=False)  # measure real prefill
        rows[name]["kv_bytes_per_token"] = llms[name].engine.kv_bytes_per_token()
        print(f"built {name}: {rows[name]}", file=sys.stderr)

    tok = llms[names[0]].tokenizer
    wins = {t: windows(tok.encode(read_dataset(t), add_special_tokens=False), args.context_len, args.max_tokens)
            for t in texts}
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        rows[name]["ppl"] = {t: round(perplexity(llms[name].score, w).perplexity, 4) for t, w in wins.items()}
        print(f"ppl {name}: {rows[name]['ppl']}", file=sys.stderr)
        (args.out / "quant.partial.json").write_text(json.dumps(rows, indent=1))  # survives a later failure
    gguf = [t for t in args.gguf.split(",") if t]
    rows.update(score_gguf(args.model, gguf, wins, args.threads) if gguf else {})

    runs = {}
    if args.repeats:
        text = read_dataset(WIKITEXT)
        runs = measure_speed(llms, names, rows, text, tok.encode(text, add_special_tokens=False), args)
    base = rows.get("fp32", rows[names[0]])["ppl"]
    for r in rows.values():
        r["ppl_delta_pct"] = {t: round((r["ppl"][t] / base[t] - 1) * 100, 2) for t in texts}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quant.json").write_text(json.dumps({
        "rows": rows, "runs": runs, "texts": texts, "context_len": args.context_len, "threads": args.threads,
        "scored_tokens": {t: sum(len(w) - 1 for w in ws) for t, ws in wins.items()},
        "calibration": f"{calib.name}: second half of WikiText-2 valid, {args.calib_samples} x {args.calib_seq_len} "
                       "tokens"}, indent=2))
    print(format_table(rows, texts, args))


def format_table(rows: dict, texts: list[str], args) -> str:
    cols = ["mode", "bpw decoder", "bpw all"] + [f"ppl {t}" for t in texts] + [f"vs fp32 {t}" for t in texts]
    speed = ["engine_mib", "decode_tok_s", "decode_vs_fp32", "prefill_tok_s", "prefill_vs_fp32", "build_s",
             "kv_bytes_per_token"] + ([f"decode_tok_s_ctx{args.long_context}"] if args.long_context else [])
    if args.repeats:
        cols += speed
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows.values():
        cells = [r["mode"], f"{r['bits']['decoder']['bpw']:.2f}", f"{r['bits']['all']['bpw']:.2f}"]
        cells += [f"{r['ppl'][t]:.4f}" for t in texts] + [f"{r['ppl_delta_pct'][t]:+.2f}%" for t in texts]
        if args.repeats:
            cells += [str(r.get(c, "")) for c in speed]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
