"""A mixture-of-experts checkpoint at real widths, Bessemer beside llama.cpp in the same run
(issue 34's targets): batch-1 decode tok/s, sizes on disk, peak memory of building and running.

    python bench/moe_compare.py --shape qwen3-30b-a3b-4l [--threads 2] [--repeats 5]
                                [--prompt-len 16] [--new-tokens 32] [--out FILE.json]
    python bench/moe_compare.py --shape gpt-oss-20b-4l
    python bench/moe_compare.py --model DIR --bessemer "--quant w4a16 --group-size 32" --gguf q4_0

Recipes per shape (RECIPES; --bessemer / --gguf replace them):
  qwen3-30b-a3b-4l  Bessemer --quant w4a16 --group-size 32 (experts too) --embedding int4
                    --lm-head int4 --dtype bfloat16 (the untied table in 4 bits, as Q4_0 files
                    store token_embd; the lm_head in 4 bits too, where Q4_0 files store output
                    in Q6_K: smaller than theirs, and less exact — with the default int8 head
                    the 4-layer engine is 1.01x the GGUF);
                    llama.cpp Q4_0 (convert_hf_to_gguf --outtype bf16, llama_model_quantize Q4_0).
                    Targets: decode >= 1.2x llama.cpp's, engine no larger than the GGUF.
  gpt-oss-20b[-4l]  Bessemer --dtype bfloat16 (MXFP4 experts kept byte for byte, the rest bf16);
                    llama.cpp: the converter's own output at --outtype bf16 (it copies the MXFP4
                    experts as they are and writes the rest bf16), not requantized.
                    Targets: engine <= 1.1x the checkpoint, build and run peak memory < 20 GiB.
The checkpoint (bench/make_moe_checkpoint.py), GGUF files and engines are made once and cached
by compare_setup (the bench cache root, $BESSEMER_BENCH_CACHE); each artifact's making cost
(wall seconds, peak RSS of the converting / quantizing / building process) is kept beside it
from its first making, so a cached artifact reports the cost it had then.

Measuring: each system in its own worker process (compare_worker.py) with --threads threads,
the same prompt token ids, greedy, EOS ignored. A warm-up run each, then --repeats rounds
alternating the two (so that load from elsewhere hits both alike); decode tok/s = (new - 1) /
(last token time - first token time); medians. Run peak memory is each worker's peak RSS at
the end (weights are memory-mapped by both, so it counts the pages of them it touched).
The load average before and after is recorded: on a shared machine compare ratios, not rates.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_setup as setup  # noqa: E402
import make_moe_checkpoint  # noqa: E402
from compare import Worker  # noqa: E402

GIB = 2**30
# shape -> (Bessemer build-engine arguments, llama.cpp GGUF type; None: the converter's output as is)
RECIPES = {
    "qwen3-30b-a3b-4l": (["--quant", "w4a16", "--group-size", "32", "--embedding", "int4", "--lm-head", "int4",
                          "--dtype", "bfloat16"],
                         "q4_0"),
    "gpt-oss-20b-4l": (["--dtype", "bfloat16"], None),
    "gpt-oss-20b": (["--dtype", "bfloat16"], None),
}
CONVERT_OUTTYPE = "bf16"  # the checkpoints are bf16: the converted file holds their values exactly


def dir_bytes(path: Path, pattern: str) -> int:
    return sum(f.stat().st_size for f in path.glob(pattern))


def read_cost(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def prepare(model: Path, bessemer_args: list[str], gguf_type: str | None, max_seq_len: int) -> dict:
    """Builds (or finds cached) both artifacts; their paths, sizes and making costs."""
    from bessemer.artifacts.inputs_hash import checkpoint_hash

    setup.ensure_venv(need_llama=True, need_ort=False)
    ckpt = checkpoint_hash(model)
    files = setup.gguf_files(model, ckpt, [gguf_type] if gguf_type else [], outtype=CONVERT_OUTTYPE)
    gguf = files[gguf_type or CONVERT_OUTTYPE]
    convert = read_cost(files[CONVERT_OUTTYPE].with_suffix(".json"))
    quantize = read_cost(gguf.with_suffix(".json")) if gguf_type else {}
    args = [*bessemer_args, "--max-seq-len", str(max_seq_len)]
    engine = setup.bessemer_engine(model, ckpt, "moe-" + model.name, args)
    return {
        "checkpoint": {"path": str(model), "bytes": dir_bytes(model, "*.safetensors")},
        "bessemer": {"path": str(engine), "recipe": "build-engine " + " ".join(args),
                     "bytes": dir_bytes(engine, "rank*.engine"), "build": read_cost(setup.build_cost_file(engine))},
        "llamacpp": {"path": str(gguf), "bytes": gguf.stat().st_size,
                     "recipe": f"convert_hf_to_gguf --outtype {CONVERT_OUTTYPE}" +
                               (f", llama_model_quantize {gguf_type.upper()}" if gguf_type else " (as converted)"),
                     "convert": convert, "quantize": quantize,
                     "tensor_types": histogram(setup.gguf_tensors(gguf)[1].values())},
    }


def histogram(values) -> dict:
    out: dict = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def measure(systems: dict, prompt: list[int], threads: int, repeats: int, new_tokens: int) -> dict:
    """{system: {"tok_s": [per repeat], "peak_rss_bytes", "tokens"}}, the systems alternated."""
    log_dir = setup.cache_root() / "logs/workers"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"decode": [prompt]}, f)
    workers: dict[str, Worker] = {}
    res: dict[str, dict] = {name: {"tok_s": []} for name in systems}
    try:
        for name, info in systems.items():
            setup.say(f"starting {name}")
            workers[name] = w = Worker(f"moe-{name}", name, info["path"], threads, Path(f.name), log_dir)
            if w.error:
                raise SystemExit(f"error: {name} did not start: {w.error} (log: {w.log})")
        for name, w in workers.items():  # warm-up: the weights' pages in memory, thread pools started
            res[name]["tokens"] = one_run(w, 4)["tokens"]
        for r in range(repeats):
            for name, w in workers.items():
                m = one_run(w, new_tokens)
                res[name]["tok_s"].append((new_tokens - 1) / m["decode_s"])
                res[name]["peak_rss_bytes"] = m["peak_rss_bytes"]
                setup.say(f"  round {r + 1}: {name} {res[name]['tok_s'][-1]:.2f} tok/s (load {os.getloadavg()[0]:.2f})")
    finally:
        for w in workers.values():
            w.close()
        os.unlink(f.name)
    return res


def one_run(worker: Worker, new: int) -> dict:
    time.sleep(0.2)  # let the other system's spinning threads go to sleep
    m = worker.run("decode", new)
    if "error" in m:
        raise SystemExit(f"error: {worker.name}: {m['error']} (log: {worker.log})")
    return m


def verdict(shape: str, info: dict, res: dict) -> dict:
    """The issue's targets for this shape, each {"value", "target", "met"}."""
    speed = res["bessemer"]["tok_s_median"] / res["llamacpp"]["tok_s_median"]
    build_peak = info["bessemer"]["build"].get("peak_rss_bytes", float("nan"))
    if shape.startswith("qwen3"):
        ratio = info["bessemer"]["bytes"] / info["llamacpp"]["bytes"]
        return {"decode_vs_llamacpp": {"value": round(speed, 3), "target": ">= 1.2", "met": speed >= 1.2},
                "engine_vs_gguf_bytes": {"value": round(ratio, 3), "target": "<= 1.0", "met": ratio <= 1.0}}
    size = info["bessemer"]["bytes"] / info["checkpoint"]["bytes"]
    run_peak = res["bessemer"]["peak_rss_bytes"]
    return {"decode_vs_llamacpp": {"value": round(speed, 3), "target": "reported"},
            "engine_vs_checkpoint_bytes": {"value": round(size, 3), "target": "<= 1.1", "met": size <= 1.1},
            "build_peak_GiB": {"value": round(build_peak / GIB, 2), "target": "< 20", "met": build_peak < 20 * GIB},
            "run_peak_GiB": {"value": round(run_peak / GIB, 2), "target": "< 20", "met": run_peak < 20 * GIB}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--shape", choices=sorted(RECIPES), help="a checkpoint of bench/make_moe_checkpoint.py")
    which.add_argument("--model", type=Path, help="an HF MoE checkpoint directory (give --bessemer and --gguf)")
    ap.add_argument("--bessemer", help="build-engine arguments, quoted [default: the shape's recipe]")
    ap.add_argument("--gguf", help="llama.cpp file type (compare_setup.GGUF_TYPES), or 'converted' for the "
                                   "converter's output")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = ap.parse_args()
    if args.repeats < 1 or args.threads < 1 or args.new_tokens < 2:
        raise SystemExit("error: --repeats and --threads must be at least 1 and --new-tokens at least 2")
    if args.model and not (args.bessemer and args.gguf):
        raise SystemExit("error: --model needs --bessemer and --gguf (there is no default recipe for it)")
    if args.gguf and args.gguf != "converted" and args.gguf not in setup.GGUF_TYPES:
        raise SystemExit(f"error: --gguf {args.gguf} is not one of {', '.join(setup.GGUF_TYPES)} or 'converted'")
    model = args.model or make_moe_checkpoint.make(args.shape)
    default_args, default_type = RECIPES.get(args.shape, ([], None))
    bessemer_args = shlex.split(args.bessemer) if args.bessemer else default_args
    gguf_type = (None if args.gguf == "converted" else args.gguf) if args.gguf else default_type

    load_start = os.getloadavg()
    info = prepare(model, bessemer_args, gguf_type, max_seq_len=max(256, args.prompt_len + args.new_tokens))
    prompt = list(range(100, 100 + args.prompt_len))
    res = measure({"bessemer": info["bessemer"], "llamacpp": info["llamacpp"]}, prompt, args.threads,
                  args.repeats, args.new_tokens)
    for r in res.values():
        r["tok_s_median"] = statistics.median(r["tok_s"])
    out = {"model": str(model), "threads": args.threads, "repeats": args.repeats, "prompt_len": args.prompt_len,
           "new_tokens": args.new_tokens, "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
           "artifacts": info, "decode": res,
           "targets": verdict(args.shape, info, res) if args.shape else {}}  # the targets are per shape
    ck = info["checkpoint"]["bytes"]
    for name in ("bessemer", "llamacpp"):
        a, r = info[name], res[name]
        making = a.get("build") or {k: v for k, v in a.items() if k in ("convert", "quantize") and v}
        print(f"{name:9s} {r['tok_s_median']:7.2f} tok/s (runs {', '.join(f'{x:.2f}' for x in r['tok_s'])}); "
              f"{a['bytes'] / GIB:.2f} GiB on disk ({a['bytes'] / ck:.2f}x checkpoint); run peak RSS "
              f"{r['peak_rss_bytes'] / GIB:.2f} GiB; making: {json.dumps(making)}")
    print(f"checkpoint {ck / GIB:.2f} GiB; load {load_start} -> {out['load_avg_end']}")
    print("targets: " + json.dumps(out["targets"]))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
