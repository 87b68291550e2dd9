"""Bessemer side by side with llama.cpp, onnxruntime-genai and HF transformers on SmolLM2.

    python bench/compare.py [--model DIR | --shape 1b|3b|8b] [--systems PATTERNS] [--workloads W,..]
                            [--repeats 3] [--quick] [--threads 2] [--out bench/results]

Every system gets the same prompts as the same token ids (tokenized once with the
checkpoint's tokenizer), greedy decoding with EOS ignored and exactly the same number of new
tokens, and `--threads` threads. Each system runs in its own worker process
(compare_worker.py). Workload by workload: a short warm-up run on every system, then
--repeats rounds round-robin over the systems, so a burst of load from elsewhere hits all of
them alike. A run slower than its cell's best by more than --spread-tol, or whose process got
less CPU per wall second than the best-served run or under --min-util of its cores (we lost
a core), is repeated (at most --max-retries rounds; the faster of the two is kept); each
figure is the median of its cell's runs. The first 16 greedy tokens of each system are
compared with HF fp32's (a prompt fed wrongly shows at once). The anchors, GGUF/ONNX models and Bessemer
engines are installed/built once and cached (compare_setup.py).

Systems (--systems takes names or fnmatch patterns, comma-separated; default all):
  bessemer-fp32 bessemer-bf16 bessemer-w8a16 bessemer-w4a16-g32 bessemer-w4a16-g64 bessemer-w4a16-g128
  bessemer-w8a8-sq bessemer-fp8 bessemer-fp8-g32 bessemer-w4a16-mp4.85 (calibrated on a short slice of WikiText-2)
  bessemer-w4a8-g32 bessemer-w4k
  llamacpp-f32 llamacpp-q8_0 llamacpp-q4_0 ortgenai-int4 ortgenai-fp32 hf-fp32
Workloads: prefill decode batch long (see compare_core.WORKLOADS), run in the order given.
llama.cpp's batch: its C API's llama_batch with 16 sequence ids (the high-level `Llama`
class decodes one sequence); ORT-genai's: GeneratorParams batch_size with a (16, 64) prompt.
Output: a table on stdout, bench/results/compare.json (tok/s per system x workload, every
run, the issue's target ratios, weight bytes per token and the copy-bandwidth ceiling).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this tree's bessemer, not whatever is installed
    sys.path.insert(0, str(REPO))

import compare_core as core  # noqa: E402
import compare_setup as setup  # noqa: E402
import make_shape_checkpoint  # noqa: E402
from make_shape_checkpoint import SHAPES  # noqa: E402

MAX_SEQ_LEN = 2304  # the long workload: 2048 + 128, rounded up to KV blocks
KV_CACHE_GIB = "0.25"  # plenty for 16 x 128 or 1 x 2176 tokens; keeps 6 engines' RSS small
# name -> (kind, recipe). Quantized engines keep what they don't quantize (the tied
# embedding / lm_head table) in --quant-dtype.
SYSTEMS = {
    "bessemer-fp32": ("bessemer", ["--dtype", "float32"]),
    "bessemer-bf16": ("bessemer", ["--dtype", "bfloat16"]),
    "bessemer-w8a16": ("bessemer", ["--quant", "w8a16"]),
    "bessemer-w4a16-g32": ("bessemer", ["--quant", "w4a16", "--group-size", "32"]),
    "bessemer-w4a16-g64": ("bessemer", ["--quant", "w4a16", "--group-size", "64"]),
    "bessemer-w4a16-g128": ("bessemer", ["--quant", "w4a16", "--group-size", "128"]),
    "bessemer-w8a8-sq": ("bessemer", ["--quant", "w8a8-sq"]),
    "bessemer-w4a8-g32": ("bessemer", ["--quant", "w4a8", "--group-size", "32"]),
    # mixed precision within 4.85 bits per weight, lm_head included (int4 table)
    "bessemer-w4a16-mp4.85": ("bessemer", ["--quant", "w4a16-gptq", "--group-size", "32", "--bits-per-weight", "4.85"]),
    # two-level 4-bit: asymmetric groups of 32 with 8-bit sub-scales under fp16 super-block scales
    "bessemer-w4k": ("bessemer", ["--quant", "w4k"]),
    "bessemer-fp8": ("bessemer", ["--quant", "fp8"]),
    # fp8 with each token's activation scale refined by a power of two per 32 input columns
    "bessemer-fp8-g32": ("bessemer", ["--quant", "fp8", "--fp8-act-group", "32"]),
    "llamacpp-f32": ("llamacpp", "f32"),
    "llamacpp-q8_0": ("llamacpp", "q8_0"),
    "llamacpp-q4_0": ("llamacpp", "q4_0"),
    "ortgenai-int4": ("ortgenai", "int4"),
    "ortgenai-fp32": ("ortgenai", "fp32"),
    "hf-fp32": ("hf", None),
}


def select(patterns: str | None, universe) -> list[str]:
    if not patterns:
        return list(universe)
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    out = []  # in the order the patterns were given: workloads run in that order
    for p in pats:
        out += [s for s in universe if fnmatch.fnmatch(s, p) and s not in out]
    unknown = [p for p in pats if not any(fnmatch.fnmatch(s, p) for s in universe)]
    if unknown:
        raise SystemExit(f"error: {', '.join(unknown)} match no system or workload; choose from {', '.join(universe)}")
    return out


def calibration_text() -> Path:
    """WikiText-2 (valid), which ships in the bessemer package."""
    from bessemer.datasets import wikitext2_valid

    return wikitext2_valid()


def tokenized_prompts(model: Path, workloads: dict) -> dict[str, list[list[int]]]:
    from bessemer.runtime.tokenizer import Tokenizer

    tok = Tokenizer(model)
    text = calibration_text().read_text()[:60000]
    return core.make_prompts(tok.encode(text, add_special_tokens=False), tok.encode_chat(core.CHAT), workloads)


def baseline_name(name: str, tree: Path) -> str:
    return f"{name}@{tree.name[:7]}"


def prepare(name: str, model: Path, ckpt: str, quant_dtype: str, tree: Path | None = None) -> dict | None:
    """Builds (or finds cached) the artifact of one system (a Bessemer one by the baseline `tree`
    if given); None if it cannot exist yet."""
    kind, recipe = SYSTEMS[name]
    if kind == "bessemer":
        args = list(recipe)
        if "--quant" in args:
            mode = args[args.index("--quant") + 1]
            modes = setup.bessemer_modes()
            if mode not in modes:
                setup.say(f"skipped {name}: the builder has no --quant {mode} yet")
                return None
            args += ["--dtype", quant_dtype]
            if modes[mode]:  # calibrated (SmoothQuant...): a short calibration, this is about speed
                args += ["--calib-data", str(calibration_text()), "--calib-samples", "16"]
        args += ["--max-seq-len", str(MAX_SEQ_LEN)]
        path = setup.bessemer_engine(model, ckpt, name, args, tree)
        # the same recipe stores the same weights: the bytes are read with this tree's loader
        tensors, types = setup.engine_tensors(setup.bessemer_engine(model, ckpt, name, args) if tree else path)
        embed, head = "model.embed_tokens.weight", "lm_head.weight"
        info = {"recipe": "build-engine " + " ".join(args), **({"tree": str(tree)} if tree else {})}
    elif kind == "llamacpp":
        path = setup.gguf_files(model, ckpt, [recipe])[recipe]
        tensors, types = setup.gguf_tensors(path)
        embed, head = "token_embd.weight", "output.weight"
        hist = {}
        for t in types.values():
            hist[t] = hist.get(t, 0) + 1
        info = {"recipe": f"convert_hf_to_gguf --outtype f32, llama_model_quantize {recipe.upper()}",
                "tensor_types": hist, "token_embd_type": types.get(embed), "output_type": types.get(head, "(tied: token_embd)")}
    elif kind == "ortgenai":
        path = setup.onnx_model(model, ckpt, recipe)
        tensors, types = setup.onnx_tensors(path)
        embed, head = "model.embed_tokens.weight", "lm_head.MatMul.weight"
        info = {"recipe": f"onnxruntime_genai.models.builder -p {recipe} -e cpu (defaults)"}
    else:
        path = model
        tensors, types = setup.safetensors_tensors(model)
        embed, head = "model.embed_tokens.weight", "lm_head.weight"
        info = {"recipe": "AutoModelForCausalLM float32"}
    info.update(kind=kind, path=str(path), weight_bytes_per_token=core.weight_bytes_per_token(tensors, embed, head))
    return info


class Worker:
    """A system in its own process (compare_worker.py), stderr in a log file."""

    def __init__(self, name: str, kind: str, path: str, threads: int, prompts_file: Path, log_dir: Path,
                 tree: str | None = None):
        py = str(setup.venv_python()) if kind in ("llamacpp", "ortgenai") else sys.executable
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
               "PYTHONPATH": f"{tree or REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               "BENCH_KV_CACHE_GIB": KV_CACHE_GIB}
        self.name, self.threads = name, threads
        self.log = log_dir / f"{name}.log"
        self.proc = subprocess.Popen([py, str(Path(__file__).parent / "compare_worker.py"), kind, path, str(threads),
                                      str(prompts_file)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "w"), text=True, env=env)
        reply = self._read()
        self.error = reply.get("error")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-5:])
            return {"error": f"worker exited ({tail})"}
        return json.loads(line)

    def run(self, workload: str, new: int) -> dict:
        self.proc.stdin.write(json.dumps({"workload": workload, "new": new}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()


def measure(worker: Worker, w: core.Workload, prompts, new: int | None = None) -> tuple[core.Run | None, dict]:
    time.sleep(0.2)  # let the previous system's spinning threads go to sleep
    new = new or w.new_tokens
    load = os.getloadavg()[0]
    m = worker.run(w.name, new)
    if "error" in m:
        return None, m
    want = [new] * len(prompts)
    if m["generated"] != want:
        return None, {"error": f"generated {m['generated']} tokens, expected {want}"}
    tok_s = core.rate(w.metric, m, len(prompts[0])) if new > 1 or w.metric == "prefill" else 0.0
    return core.Run(tok_s, m["cpu_s"] / (m["wall_s"] * worker.threads), load), m


WARMUP_NEW_TOKENS = 4  # a warm-up touches every code path and page; it need not be long


def run_all(workers: dict[str, Worker], workloads: dict, prompts: dict, repeats: int, tols: dict,
            max_retries: int, deadline: float) -> dict:
    """Workload by workload (so that a --time-budget cut leaves whole workloads): a warm-up
    run on every system, `repeats` rounds over the systems, then the disturbed runs again."""
    cells = {(s, w): [] for s in workers for w in workloads}
    tokens = {}  # (system, workload) -> the first sequence's first new token ids
    repeated = {k: 0 for k in cells}
    failed, skipped = {}, []

    def one(s, w, new=None):
        run, m = measure(workers[s], workloads[w], prompts[w], new)
        if run is None:
            failed[(s, w)] = m["error"]
            setup.say(f"  {s} {w}: {m['error']}")
        elif new is None:
            tokens[(s, w)] = m.get("tokens", [])
        return run

    for w in workloads:
        if time.time() > deadline:
            skipped.append(w)
            setup.say(f"skipped workload {w}: past --time-budget")
            continue
        for s in workers:
            t = time.perf_counter()
            if one(s, w, min(workloads[w].new_tokens, WARMUP_NEW_TOKENS)):
                setup.say(f"[warm-up] {s:20s} {w:8s} ({time.perf_counter() - t:.1f} s)")
        for rep in range(repeats):
            for s in workers:
                if (s, w) in failed:
                    continue
                run = one(s, w)
                if run:
                    cells[(s, w)].append(run)
                    setup.say(f"[{rep + 1}/{repeats}] {s:20s} {w:8s} {run.tok_s:9.1f} tok/s  cpu {run.util:.2f}  load {run.load:.1f}")
        for round_ in range(max_retries):
            todo = [(s, i) for s in workers for i in core.disturbed(cells[(s, w)], **tols)]
            if not todo or time.time() > deadline:
                break
            setup.say(f"repeating {len(todo)} disturbed {w} run(s), round {round_ + 1}/{max_retries}")
            for s, i in todo:
                run = one(s, w)
                if run:
                    old = cells[(s, w)][i]
                    # load only slows a run: a repeat that is slower still was disturbed too
                    cells[(s, w)][i] = max(old, run, key=lambda r: r.tok_s)
                    repeated[(s, w)] += 1
                    setup.say(f"  {s:20s} {w:8s} {old.tok_s:9.1f}, again {run.tok_s:9.1f} tok/s")
    still = {k: len(core.disturbed(runs, **tols)) for k, runs in cells.items()}
    return {"cells": cells, "repeated": repeated, "still_disturbed": still, "failed": failed, "tokens": tokens,
            "skipped_workloads": skipped}


def fmt_rate(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def vs_baseline(systems: dict, workloads: dict, medians: dict, tokens: dict) -> dict:
    """this tree's rate / the baseline's, per workload, and whether both produced the same tokens."""
    out = {}
    for b in [s for s in systems if "@" in s]:
        s = b.split("@")[0]
        if s not in systems:
            continue
        out[s] = {w: {"ratio": round(medians[s][w] / medians[b][w], 3) if medians[s][w] and medians[b][w] else None,
                      "same_tokens": tokens.get((s, w)) == tokens.get((b, w))} for w in workloads}
    return out


def report(args, systems: dict, workloads: dict, prompts: dict, res: dict, bw: dict, t0: float) -> dict:
    cells, repeated = res["cells"], res["repeated"]
    medians = {s: {w: (round(core.median([r.tok_s for r in cells[(s, w)]]), 2) if cells[(s, w)] else None)
                   for w in workloads} for s in systems}
    bw_bytes = bw["copy_GBps"] * 1e9
    ceiling = {}
    for s, info in systems.items():
        c = core.ceiling(bw_bytes, info["weight_bytes_per_token"])
        dec = medians[s].get("decode")
        ceiling[s] = {"weight_MiB_per_token": round(info["weight_bytes_per_token"] / 2**20, 1),
                      "ceiling_tok_s": round(c, 1), "decode_pct_of_ceiling": round(100 * dec / c, 1) if dec else None}
    out = {
        "machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "python": platform.python_version(),
                    "load_avg_end": os.getloadavg(), "copy_bandwidth": bw,
                    "note": "a shared 2-core machine: other work ran at the same time; compare ratios within this run"},
        "protocol": {"repeats": args.repeats, "warmup": f"1 run ({WARMUP_NEW_TOKENS} new tokens)", "spread_tol": args.spread_tol, "util_tol": args.util_tol,
                     "min_util": args.min_util, "max_retries": args.max_retries, "quick": args.quick, "seconds": round(time.time() - t0),
                     "workloads": {w: {"doc": x.doc, "prompts": len(prompts[w]), "prompt_tokens": len(prompts[w][0]),
                                       "new_tokens": x.new_tokens} for w, x in workloads.items()}},
        "systems": systems,
        "tok_s": medians,
        "runs": {s: {w: [{"tok_s": round(r.tok_s, 2), "cpu_util": round(r.util, 3), "load": round(r.load, 2)}
                         for r in cells[(s, w)]] for w in workloads} for s in systems},
        "spread": {s: {w: (round(core.spread([r.tok_s for r in cells[(s, w)]]), 3) if cells[(s, w)] else None)
                       for w in workloads} for s in systems},
        "repeated_runs": {s: {w: repeated[(s, w)] for w in workloads} for s in systems},
        "still_disturbed_runs": {s: {w: res["still_disturbed"][(s, w)] for w in workloads} for s in systems},
        "failed": {f"{s}/{w}": e for (s, w), e in res["failed"].items()},
        "skipped_workloads": res["skipped_workloads"],
        "targets": core.target_ratios(medians),
        "greedy_agreement_with_hf_fp32": {
            s: {w: core.agreement(res["tokens"].get((s, w), []), res["tokens"][("hf-fp32", w)])
                for w in workloads if ("hf-fp32", w) in res["tokens"]} for s in systems},
        "bandwidth_ceiling": ceiling,
        "vs_baseline": vs_baseline(systems, workloads, medians, res["tokens"]),
    }
    widths = [len(w) + 8 for w in workloads]
    print(f"\n{'system':28s}" + "".join(f"{w + ' tok/s':>{n}s}" for w, n in zip(workloads, widths))
          + f"{'MiB/tok':>9s}{'ceiling':>9s}{'% ceil':>8s}")
    for s in systems:
        c = ceiling[s]
        pct = c["decode_pct_of_ceiling"]
        print(f"{s:28s}" + "".join(f"{fmt_rate(medians[s][w]):>{n}s}" for w, n in zip(workloads, widths))
              + f"{c['weight_MiB_per_token']:>9.1f}{c['ceiling_tok_s']:>9.1f}{'-' if pct is None else f'{pct:.0f}%':>8s}")
    print(f"\ncopy bandwidth ({args.threads} threads): {bw['copy_GBps']} GB/s; ceiling = bandwidth / weight bytes per token")
    print(f"repeated (disturbed) runs: {sum(repeated.values())}; still disturbed after the retries: "
          f"{sum(res['still_disturbed'].values())}; failed cells: {len(res['failed'])}")
    agree = out["greedy_agreement_with_hf_fp32"]
    if any(agree.values()):
        print("leading greedy tokens equal to HF fp32's (of 16, decode workload): "
              + ", ".join(f"{s} {a.get('decode', '-')}" for s, a in agree.items() if s != "hf-fp32"))
    if out["vs_baseline"]:
        print("\nthis tree / baseline (same run, medians; tokens: greedy output identical to the baseline's):")
        for s, row in out["vs_baseline"].items():
            print(f"  {s:26s}" + "".join(f"  {w} {r['ratio']:.3f}x" if r["ratio"] else f"  {w} -" for w, r in row.items())
                  + "  tokens " + ("identical" if all(r["same_tokens"] for r in row.values()) else "DIFFER"))
    print("\ntargets (same run, medians):")
    for t in out["targets"]:
        r = "n/a (system or workload not measured)" if t["ratio"] is None else f"{t['ratio']:.2f}x (goal {t['goal']}x) {'met' if t['met'] else 'MISSED'}"
        print(f"  {t['target']:40s} {r}" + (f"  [{t['numerator']} / {t['denominator']}]" if t["ratio"] else ""))
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def default_model() -> Path:
    from bessemer.fixtures.smollm2 import ensure_smollm2

    return Path(ensure_smollm2(progress=lambda m: print(m, file=sys.stderr)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, help="HF checkpoint directory [default: the cached SmolLM2]")
    which.add_argument("--shape", choices=sorted(SHAPES),
                       help="a random-weight checkpoint at a real model's widths (bench/make_shape_checkpoint.py, "
                            "made once and cached; SmolLM2's tokenizer), with its GGUF/ONNX anchors")
    ap.add_argument("--systems", help="comma-separated names or patterns, e.g. 'bessemer-w4a16*,llamacpp-q4_0'")
    ap.add_argument("--workloads", help=f"comma-separated subset of {','.join(core.WORKLOADS)}")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="small shapes (seconds per run) for a fast comparison")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quant-dtype", default="bfloat16", choices=["float32", "bfloat16"],
                    help="dtype of what quantized Bessemer engines leave unquantized (the tied embedding/lm_head)")
    ap.add_argument("--spread-tol", type=float, default=0.10, help="a run this much slower than its cell's best is repeated")
    ap.add_argument("--util-tol", type=float, default=0.20, help="a run with this much less CPU/wall than the best is repeated")
    ap.add_argument("--min-util", type=float, default=0.4,
                    help="a run whose process got less than this share of its threads' cores is repeated")
    ap.add_argument("--max-retries", type=int, default=2, help="rounds of repeating disturbed runs")
    ap.add_argument("--time-budget", type=float, default=float("inf"),
                    help="minutes; no new workload starts after this (the ones done are reported)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also measure each selected Bessemer system as built and run by commit REV "
                         "(exported and built once under the cache), interleaved in the same rounds")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results")
    args = ap.parse_args()
    if args.repeats < 1 or args.threads < 1:
        raise SystemExit("error: --repeats and --threads must be at least 1")
    t0 = time.time()
    model = args.model or (make_shape_checkpoint.make(args.shape) if args.shape else default_model())
    if not (model / "config.json").exists():
        raise SystemExit(f"error: {model} is not a HF checkpoint (no config.json); run `python -m bessemer.fixtures.smollm2`")
    names = select(args.systems, SYSTEMS)
    all_workloads = core.quick_workloads() if args.quick else core.WORKLOADS
    workloads = {w: all_workloads[w] for w in select(args.workloads, all_workloads)}
    kinds = {SYSTEMS[n][0] for n in names}
    if kinds & {"llamacpp", "ortgenai"}:
        setup.ensure_venv("llamacpp" in kinds, "ortgenai" in kinds)
    from bessemer.artifacts.inputs_hash import checkpoint_hash

    ckpt = checkpoint_hash(model)
    systems = {}
    for n in names:
        try:
            info = prepare(n, model, ckpt, args.quant_dtype)
        except SystemExit as e:  # one system that cannot be built does not stop the others
            setup.say(f"skipped {n}: {e}")
            continue
        if info:
            systems[n] = info
    tree = setup.baseline_tree(args.baseline) if args.baseline else None
    for n in [n for n in names if tree and SYSTEMS[n][0] == "bessemer" and n in systems]:
        try:
            info = prepare(n, model, ckpt, args.quant_dtype, tree)
        except SystemExit as e:
            setup.say(f"skipped {baseline_name(n, tree)}: {e}")
            continue
        if info:
            systems[baseline_name(n, tree)] = info
    prompts = tokenized_prompts(model, workloads)
    setup.say(f"measuring copy bandwidth ({args.threads} threads)")
    bw = setup.copy_bandwidth(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    log_dir = setup.cache_root() / "logs/workers"
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prompts, f)
    workers = {}
    try:
        for n, info in list(systems.items()):
            setup.say(f"starting {n}")
            wk = Worker(n, info["kind"], info["path"], args.threads, Path(f.name), log_dir, info.get("tree"))
            if wk.error:
                setup.say(f"skipped {n}: {wk.error} (log: {wk.log})")
                wk.close()
                del systems[n]
                continue
            workers[n] = wk
        tols = {"spread_tol": args.spread_tol, "util_tol": args.util_tol, "min_util": args.min_util}
        res = run_all(workers, workloads, prompts, args.repeats, tols, args.max_retries, t0 + args.time_budget * 60)
    finally:
        for wk in workers.values():
            wk.close()
        os.unlink(f.name)
    setup.say("measuring copy bandwidth again (the better of before and after counts)")
    bw_end = setup.copy_bandwidth(args.threads)
    bw = {**max(bw, bw_end, key=lambda b: b["copy_GBps"]), "before_GBps": bw["copy_GBps"], "after_GBps": bw_end["copy_GBps"]}
    out = report(args, systems, workloads, prompts, res, bw, t0)
    path = args.out / ("compare_quick.json" if args.quick else "compare.json")
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
