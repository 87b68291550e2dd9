"""The GPU check of the cuda target (run by tests/gpu/check.sh after the install): random
bf16 checkpoints at SmolLM2-135M, Llama-3.2-1B and Llama-3.1-8B shapes made on the GPU,
cuda engines built there, then correctness and speed, written to OUT/results.json after
every stage (a run cut short keeps what it measured) and summarized as a table.

Stages run in priority order under one deadline, each under a time limit of its own (LIMITS,
or --stage-limit NAME=S): a stage that cannot start with its minimum left is skipped, one
that runs past its limit is cut (SIGALRM; a long call into C returns first), a failing
stage is recorded (one line here, the traceback in the log); in each case the run goes on
and the stages that need it are skipped.

    python tests/gpu/check.py --out OUT --work DIR [--budget-s S] [--rehearse] [--stage-limit NAME=S ...]

--rehearse runs every stage on CPU at tiny shapes (rehearsal.py): the C++ executor's whole
path against the fake driver (BESSEMER_LIBCUDA), the 135m comparisons on logits the
engine's launch list computes through the Triton interpreter (TRITON_INTERPRET=1), the
graph-vs-eager comparison on the fake driver's launch records; speed figures are listed
as not measurable on CPU.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_measure as gm  # noqa: E402
import gpu_models as models  # noqa: E402
import rehearsal  # noqa: E402
from report import quant_summary_table, summary_table  # noqa: E402

ENGINES = {  # build options per engine (the 8B ones serve 128 concurrent requests); a name is
    # its checkpoint's shape, then what differs: "8b-w4a16" is the 8B checkpoint quantized
    "135m": dict(max_seq_len=2048, max_batch_size=16, max_num_tokens=2048),
    "1b": dict(max_seq_len=2048, max_batch_size=16, max_num_tokens=2048),
    "8b": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048),
    # --suite quant (issue 22): random weights are fine for speed (accuracy is measured on the
    # cpu target with the same codes), so no calibration: RTN int4 and nearest-rounded fp8
    "8b-w4a16": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                     quant=dict(mode="w4a16", group_size=128)),
    "8b-fp8": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                   quant=dict(mode="fp8", fp8_rounding="nearest")),
    "8b-fp8-kvfp8": dict(max_seq_len=4096, max_batch_size=128, max_num_tokens=2048,
                         quant=dict(mode="fp8", fp8_rounding="nearest"), kv_cache_dtype="fp8"),
}
KV_CACHE_GIB = {"135m": 4.0, "1b": 8.0, "8b": 24.0}  # leaves room for the HF models in the same process
REHEARSAL_KV_GIB = 0.05
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)  # --suite quant: where int4's decode advantage over bf16 ends
SUITES = ("bf16", "quant")


def shape_of(engine: str) -> str:
    return engine.split("-")[0]
# teacher-forced prompts (count, tokens) and greedy tokens per comparison; the rehearsal's
# interpreter runs ~0.5 s per step, hence its smaller sizes
SIZES = {False: dict(prompts=(5, 128), new_tokens=24, batch=(5, 37, 128, 77), prefix=(160, 96)),
         True: dict(prompts=(2, 16), new_tokens=3, batch=(5, 9, 16, 12), prefix=(40, 32))}
INTERPRETED = ("135m",)  # rehearsal: models whose comparisons run on interpreted logits
# seconds a stage may run on the H200 (its minimum to start is in run()); the first part of
# a name is enough: "correctness" covers correctness-135m and correctness-1b. decode-8b loads
# the 8B engine the later 8B stages share (sha256 of 15 GiB ~10 s, upload, 8 graphs).
LIMITS = {"environment": 30, "checkpoint": 90, "build": 200, "correctness": 60, "decode": 60, "prefill": 45,
          "throughput": 90, "hf-eager": 60, "hf-compiled": 180}


class StageCut(BaseException):
    """A stage ran past its time limit (a BaseException: no library's `except Exception`
    swallows it)."""


def _cut(_signum, _frame):
    raise StageCut()


class Check:
    def __init__(self, out: Path, work: Path, budget_s: float, rehearse: bool, limits: dict | None = None):
        self.out, self.rehearse = out, rehearse
        self.limits = dict(LIMITS, **(limits or {}))
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + budget_s
        self.device = "cpu" if rehearse else "cuda"
        self.shapes = models.TINY_SHAPES if rehearse else models.SHAPES
        self.work = work  # checkpoints and engines: tens of GB, never under OUT (which is sent back)
        self.sizes = SIZES[rehearse]
        self.results = {"rehearsal": rehearse, "stages": {}, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        if rehearse:
            self.results["not_measurable_on_cpu"] = rehearsal.NOT_MEASURABLE
        self.hf: dict = {}  # name -> bf16 HF model on the device
        self.served: dict = {}  # name -> LLM shared by the speed stages
        self.failed: set[str] = set()
        self.log = open(out / "check.py.log", "a")

    # ---- bookkeeping ----
    def say(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.t0, 1)
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=float))
        os.replace(tmp, self.out / "results.json")

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def stage(self, name: str, fn, min_s: float, needs: tuple = ()) -> None:
        missing = [n for n in needs if n in self.failed]
        if missing:
            self.results["stages"][name] = {"skipped": f"needs {', '.join(missing)}, which did not complete"}
            self.say(f"stage {name}: SKIPPED (needs {', '.join(missing)})")
            self.failed.add(name)
            return self.save()
        if self.left() < min_s:
            self.results["stages"][name] = {"skipped": f"{self.left():.0f}s left, the stage needs ~{min_s:.0f}s"}
            self.say(f"stage {name}: SKIPPED (only {self.left():.0f}s left of the budget, needs ~{min_s:.0f}s)")
            self.failed.add(name)
            return self.save()
        limit = min(self.limit(name), max(self.left(), 1.0))
        self.say(f"stage {name} ... (limit {limit:.0f}s)")
        t = time.perf_counter()
        previous = signal.signal(signal.SIGALRM, _cut)
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            try:
                result = fn()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
            result = dict(result or {}, seconds=round(time.perf_counter() - t, 2))
            self.say(f"stage {name}: done in {result['seconds']:.1f}s")
        except StageCut:
            self.failed.add(name)
            result = {"cut": f"ran past its {limit:.3g}s limit", "seconds": round(time.perf_counter() - t, 2)}
            self.say(f"stage {name}: CUT after {result['seconds']:.1f}s (limit {limit:.3g}s)")
            self.log.write(traceback.format_exc())
        except Exception as e:  # noqa: BLE001 - recorded, and the run goes on
            self.failed.add(name)
            result = {"error": f"{type(e).__name__}: {e}".splitlines()[0], "seconds": round(time.perf_counter() - t, 2)}
            self.say(f"stage {name}: FAILED: {result['error']}")
            self.log.write(traceback.format_exc())
        self.results["stages"][name] = result
        self.save()

    def limit(self, name: str) -> float:
        """The stage's time limit: its own entry, else its family's ("decode" for decode-8b)."""
        for key in (name, name.split("-")[0], "-".join(name.split("-")[:2])):
            if key in self.limits:
                return float(self.limits[key])
        return float("inf")

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def free(self, *objects) -> None:
        """Drops engines / models and returns their GPU memory."""
        for o in objects:
            close = getattr(o, "close", None)
            if close:
                close()
        del objects
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def llm(self, name: str, interpreted: bool = False, **options):
        """The engine through LLM on the GPU; in the rehearsal on the fake driver, and with
        `interpreted` its launch list computed by the Triton interpreter (rehearsal.py)."""
        from bessemer.runtime.llm import LLM

        kv = REHEARSAL_KV_GIB if self.rehearse else KV_CACHE_GIB[shape_of(name)]
        llm = LLM(self.work / f"engine-{name}", kv_cache_gib=kv, say=self.say, **options)
        if self.rehearse:
            (rehearsal.interpreted if interpreted else rehearsal.fake_computes_nothing)(llm)
        return llm

    def serving(self, name: str):
        """One LLM per engine for the speed stages (loaded once: the 8B upload is 16 GB),
        prefix caching off so that no stage's KV blocks meet another's."""
        if self.served.get(name) is None:
            self.served[name] = self.llm(name, enable_prefix_caching=False)
        return self.served[name]

    def release(self, name: str) -> None:
        if self.served.get(name) is not None:
            llm, self.served[name] = self.served[name], None
            self.free(llm)

    # ---- stages ----
    def environment(self) -> dict:
        import numpy
        import torch
        import transformers

        from bessemer.targets.cuda.device import device_report

        info = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
                "numpy": numpy.__version__, "work_disk_free_gib": round(shutil.disk_usage(self.work).free / 2**30, 1)}
        try:
            import triton

            info["triton"] = triton.__version__
        except ImportError:
            info["triton"] = None
        if self.device == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no GPU")
            info["torch_gpu"] = torch.cuda.get_device_name(0)
            smi = shutil.which("nvidia-smi")
            if smi:
                info["nvidia_smi"] = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout.strip()
        info["bessemer_device"] = device_report(0)
        info["header_conformance"] = self.conformance()
        return info

    def conformance(self) -> dict:
        """cuda_api.h against every official cuda.h this machine has (the CUDA 13 toolkit's,
        Triton's 12.8): a mismatch is recorded, not fatal (the executor asks the driver for
        the 12.4 ABI whatever the headers say)."""
        import importlib.util

        candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include", Path("/usr/local/cuda/include")]
        spec = importlib.util.find_spec("triton")
        if spec and spec.origin:
            candidates.append(Path(spec.origin).parent / "backends" / "nvidia" / "include")
        repo = HERE.parents[1]
        out = {}
        for inc in dict.fromkeys(candidates):
            header = inc / "cuda.h"
            if not header.exists():
                continue
            version = next((line.split()[-1] for line in header.read_text(errors="replace").splitlines()
                            if line.startswith("#define CUDA_VERSION")), "?")
            run = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", f"-I{repo / 'bessemer/targets/cuda/csrc'}",
                                  f"-I{inc}", str(repo / "tests/cuda_executor/conformance.cpp")],
                                 capture_output=True, text=True)
            out[str(header)] = {"cuda_version": version, "pass": run.returncode == 0,
                                "errors": [line for line in run.stderr.splitlines() if "static assert" in line][:5]}
        return out

    def checkpoint(self, name: str) -> dict:
        """A random bf16 checkpoint at the shape, made on the device and saved; the model
        stays on the device for the HF references and baselines."""
        path = self.work / f"hf-{name}"
        self.hf[name] = models.make_checkpoint(self.shapes[name], path, self.device)
        params = sum(p.numel() for p in self.hf[name].parameters())
        self.say(f"checkpoint {name}: {params / 1e6:.1f}M parameters")
        return {"params": params, "gib": round(sum(f.stat().st_size for f in path.glob("*.safetensors")) / 2**30, 2)}

    def build(self, name: str) -> dict:
        from bessemer.builder.build import build_engine
        from bessemer.builder.config import BuildConfig

        from bessemer.quantization.config import QuantConfig

        shutil.rmtree(self.work / f"engine-{name}", ignore_errors=True)  # a previous run's
        options = dict(ENGINES[name], **({"max_seq_len": 1024, "max_num_tokens": 512} if self.rehearse else {}))
        quant = options.pop("quant", None)
        config = BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig(**quant) if quant else None, **options)
        engine = build_engine(self.work / f"hf-{shape_of(name)}", self.work / f"engine-{name}", config,
                              progress=self.say)
        report = json.loads((engine / "build_report.json").read_text())
        return {"options": dict(options, **({"quant": quant} if quant else {})),
                "engine_gib": round(sum(f.stat().st_size for f in engine.iterdir()) / 2**30, 2),
                "bits_per_weight": report.get("bits_per_weight"),
                "kernels": {k: report["kernels"][k] for k in ("distinct", "compiled", "from_cache", "seconds")}}

    def correctness(self, name: str) -> dict:
        vocab, sizes = self.shapes[name]["vocab_size"], self.sizes
        ids = gm.prompts(*sizes["prompts"], vocab, seed=1)
        bf16 = self.hf[name]
        fp32 = copy.deepcopy(bf16).float()
        ref32, ref16 = models.hf_logits(fp32, ids, "float32"), models.hf_logits(bf16, ids, "bfloat16")
        self.free(fp32)
        computed = not self.rehearse or name in INTERPRETED
        llm = self.llm(name, interpreted=self.rehearse and computed)
        try:
            out = {"computed_by": "gpu" if not self.rehearse else
                   "triton interpreter (launch list of the engine)" if computed else "fake driver (nothing computed)"}
            out["logits"] = gm.logits_error(llm, ids, ref32, ref16)
            tie = 2 * out["logits"]["hf_bf16_max_abs_err"]
            out["batch_vs_alone"] = gm.batch_vs_alone(llm, vocab, tie, sizes["new_tokens"], sizes["batch"])
            out["prefix_cache"] = gm.prefix_cache(llm, vocab, tie, sizes["new_tokens"], *sizes["prefix"])
            if self.rehearse:  # graphs: the C++ executor on the fake driver, compared by its launches
                self.free(llm)
                llm = self.llm(name)
                out["graph_vs_eager"] = gm.graph_vs_eager(llm, vocab, recorder=rehearsal.fake_launch_log)
            else:
                out["graph_vs_eager"] = gm.graph_vs_eager(llm, vocab)  # last: it writes KV blocks of its own
        finally:
            self.free(llm)
        if name == "135m":
            out["no_torch_at_run_time"] = self.runtime_imports(name)
        return out

    def runtime_imports(self, name: str) -> dict:
        """A fresh process serving the engine through LLM imports neither torch nor Triton."""
        code = ("import sys\nfrom bessemer.runtime.llm import LLM, SamplingParams\n"
                f"llm = LLM({str(self.work / f'engine-{name}')!r}, kv_cache_gib=0.5)\n"
                "out = llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))\n"
                "print(len(out[0].token_ids), sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton')))")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        if run.returncode:
            raise RuntimeError(run.stderr.strip().splitlines()[-1])
        line = run.stdout.strip().splitlines()[-1]
        return {"output": line, "pass": line == "4 []"}

    def decode(self, name: str) -> dict:
        llm = self.serving(name)
        shape = self.shapes[shape_of(name)]
        out = gm.decode_speed(llm, shape["vocab_size"])
        header = llm.engine.header
        per_token = gm.weight_bytes_per_token(header, shape["hidden_size"], context=128 + 128)
        out.update(bytes_per_token=per_token["total"], weight_bytes_per_token=per_token["weights"],
                   hbm_fraction=per_token["total"] * out["generate_tok_s"] / gm.PEAK_HBM_BYTES_S,
                   hbm_fraction_executor=per_token["total"] / (out["executor_step_ms"] / 1e3) / gm.PEAK_HBM_BYTES_S,
                   executor=llm.executor.stats())
        self.results.setdefault("engine_decode_tok_s", {})[name] = out["generate_tok_s"]
        return out

    def prefill(self, name: str, tokens: int) -> dict:
        import torch

        llm = self.serving(name)
        tokens = min(tokens, llm.max_num_tokens)
        out = gm.prefill_speed(llm, self.shapes[shape_of(name)]["vocab_size"], tokens)
        shapes = gm.linear_shapes(llm.engine.header)
        rows = {"tokens": tokens, "selected": 1}
        flops = sum(2 * rows[r] * n * k for n, k, r in shapes)
        dev = self.device
        times = {}
        for n, k, r in dict.fromkeys(shapes):
            x = torch.randn(rows[r], k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
            for _ in range(3):
                torch.matmul(x, w.T)
            self.sync()
            t = time.perf_counter()
            for _ in range(10):
                torch.matmul(x, w.T)
            self.sync()
            times[(n, k, r)] = (time.perf_counter() - t) / 10
            del x, w
        torch_s = sum(times[s] for s in shapes)
        out.update(tokens=tokens, linear_tflop=flops / 1e12, engine_tflop_s=flops / out["step_s"] / 1e12,
                   torch_matmul_tflop_s=flops / torch_s / 1e12, ratio_to_torch_matmul=torch_s / out["step_s"])
        return out

    def throughput(self, name: str, prompt_len: int = 128) -> dict:
        requests, new = (128, 512) if not self.rehearse else (128, 64)
        prompt_len = prompt_len if not self.rehearse else min(prompt_len, 128)  # its engines hold 1024 positions
        llm = self.serving(name)
        out = gm.throughput(llm, self.shapes[shape_of(name)]["vocab_size"], requests, prompt_len, new)
        from bessemer.format.kv import section_bytes_per_token

        gib = KV_CACHE_GIB[shape_of(name)] if not self.rehearse else REHEARSAL_KV_GIB
        # the pool is capped at what max_batch_size full-length sequences can use; the budget's
        # own capacity is what a one-byte cache doubles
        per_token = section_bytes_per_token(llm.engine.header["plan"]["kv_cache"])
        out.update(prompt_len=prompt_len, kv_cache_tokens=llm.executor.num_kv_blocks * llm.block_size,
                   kv_cache_gib=gib, kv_bytes_per_token=per_token, kv_capacity_tokens=int(gib * 2**30 // per_token))
        return out

    def decode_batches(self, names: tuple) -> dict:
        """Decode steps of B sequences (the executor's step alone, graphs on) per engine and
        B in DECODE_BATCHES: tok/s, and each engine's ratio to the first (bf16)."""
        rows = {}
        for name in names:
            llm = self.serving(name)
            rows[name] = {b: gm.decode_step_tok_s(llm, b, context=256) for b in DECODE_BATCHES}
            self.release(name)
        base = names[0]
        return {"tok_s": rows, "ratio": {n: {b: rows[n][b] / rows[base][b] for b in DECODE_BATCHES} for n in names[1:]}}

    def hf_baseline(self, name: str, compiled: bool) -> dict:
        model = self.hf[name]
        prompt = gm.prompts(1, 128, self.shapes[name]["vocab_size"], seed=21)[0]
        if compiled:
            model = models.compile_forward(model, "eager" if self.rehearse else "inductor")
        out = models.hf_decode_rate(model, prompt, 256 if not self.rehearse else 16, self.sync, compiled=compiled)
        engine = self.results.get("engine_decode_tok_s", {}).get(name)
        out.update(shape=name, engine_decode_tok_s=engine,
                   engine_speedup=engine / out["decode_tok_s"] if engine else None)
        return out

    def run_quant(self) -> int:
        """--suite quant (issue 22): the 8B shape as int4 (g128), fp8 and fp8 with an fp8 KV
        cache, against the bf16 engine of the same checkpoint in the same run."""
        s = self.stage
        s("environment", self.environment, 5)
        s("checkpoint-8b", lambda: self.checkpoint("8b"), 30, needs=("environment",))
        for name, build_s in (("8b-w4a16", 60), ("8b-fp8", 60)):
            s(f"build-{name}", lambda n=name: self.build(n), build_s, needs=("checkpoint-8b",))
        s("decode-8b-w4a16", lambda: self.decode("8b-w4a16"), 30, needs=("build-8b-w4a16",))
        s("decode-8b-fp8", lambda: self.decode("8b-fp8"), 30, needs=("build-8b-fp8",))
        s("prefill-8b-fp8", lambda: self.prefill("8b-fp8", 2048), 25, needs=("build-8b-fp8",))
        s("throughput-8b-fp8", lambda: self.throughput("8b-fp8", prompt_len=1024), 60, needs=("build-8b-fp8",))
        self.release("8b-fp8")
        s("build-8b-fp8-kvfp8", lambda: self.build("8b-fp8-kvfp8"), 60, needs=("checkpoint-8b",))
        s("throughput-8b-fp8-kvfp8", lambda: self.throughput("8b-fp8-kvfp8", prompt_len=1024), 60,
          needs=("build-8b-fp8-kvfp8",))
        self.release("8b-fp8-kvfp8")
        s("build-8b", lambda: self.build("8b"), 60, needs=("checkpoint-8b",))
        s("decode-batches-8b", lambda: self.decode_batches(("8b", "8b-w4a16")), 40,
          needs=("build-8b", "build-8b-w4a16"))
        self.results["summary"] = quant_summary_table(self.results)
        self.save()
        print(self.results["summary"])
        self.log.write(self.results["summary"] + "\n")
        return 1 if self.failed else 0

    def run(self) -> int:
        s = self.stage
        s("environment", self.environment, 5)
        # per model, the small ones first: a slow 8B checkpoint or build costs only the 8B stages
        for name, ckpt_s, build_s in (("135m", 5, 10), ("1b", 10, 20)):
            s(f"checkpoint-{name}", lambda n=name: self.checkpoint(n), ckpt_s, needs=("environment",))
            s(f"build-{name}", lambda n=name: self.build(n), build_s, needs=(f"checkpoint-{name}",))
        for name in ("135m", "1b"):
            s(f"correctness-{name}", lambda n=name: self.correctness(n), 25, needs=(f"build-{name}",))
        s("decode-135m", lambda: self.decode("135m"), 15, needs=("build-135m",))
        self.release("135m")
        s("checkpoint-8b", lambda: self.checkpoint("8b"), 30, needs=("environment",))
        s("build-8b", lambda: self.build("8b"), 60, needs=("checkpoint-8b",))
        s("decode-8b", lambda: self.decode("8b"), 30, needs=("build-8b",))
        s("prefill-8b", lambda: self.prefill("8b", 2048), 25, needs=("build-8b",))
        s("throughput-8b", lambda: self.throughput("8b"), 60, needs=("build-8b",))
        self.release("8b")
        s("hf-eager-8b", lambda: self.hf_baseline("8b", compiled=False), 40, needs=("decode-8b",))
        s("decode-1b", lambda: self.decode("1b"), 15, needs=("build-1b",))
        self.release("1b")
        # torch.compile takes minutes on the 8B model: that shape if the time allows, else 1B
        big = self.left() > 200 and "decode-8b" not in self.failed
        name = "8b" if big else "1b"
        s(f"hf-compiled-{name}", lambda: self.hf_baseline(name, compiled=True), 150 if big else 80,
          needs=(f"decode-{name}",))
        self.results["summary"] = summary_table(self.results)
        self.save()
        print(self.results["summary"])
        self.log.write(self.results["summary"] + "\n")
        return 1 if self.failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="results.json and the log")
    ap.add_argument("--work", type=Path, required=True, help="checkpoints and engines (~35 GiB for the real shapes)")
    ap.add_argument("--budget-s", type=float, default=420.0, help="time for every stage together")
    ap.add_argument("--rehearse", action="store_true", help="CPU, tiny shapes, fake driver")
    ap.add_argument("--suite", choices=SUITES, default="bf16",
                    help="bf16: the bf16 engines (correctness, speed, HF baselines); quant: int4 / fp8 / fp8-KV "
                         "engines of the 8B shape against its bf16 engine")
    ap.add_argument("--stage-limit", action="append", default=[], metavar="NAME=S",
                    help="a stage's (or family's) time limit in seconds, e.g. hf-compiled=90")
    args = ap.parse_args()
    limits = {}
    for item in args.stage_limit:
        name, _, seconds = item.partition("=")
        try:
            limits[name] = float(seconds)
        except ValueError:
            ap.error(f"--stage-limit {item!r}: give NAME=SECONDS, e.g. hf-compiled=90")
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    check = Check(args.out, args.work, args.budget_s, args.rehearse, limits)
    check.results["suite"] = args.suite
    return check.run_quant() if args.suite == "quant" else check.run()


if __name__ == "__main__":
    sys.exit(main())
