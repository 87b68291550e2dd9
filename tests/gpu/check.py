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

Every engine's correctness stage runs before its speed stages, and a speed stage needs it:
when the engine's logits (or any comparison) do not hold, its speeds are skipped ("needs
correctness-X"), never reported. bf16 engines are compared with HF fp32 (error <= 2x HF
bf16's, tests/tolerances.py BF16_ERROR_RATIO); quantized ones with HF running the engine's own
codes and scales (quant_reference.py), within CUDA_BF16_ERROR_RATIO of that reference's bf16
error, as the cuda interpreter tests hold them. The first correctness stage of a run runs with
BESSEMER_CUDA_SYNC=1 (a synchronize after every launch: a fault names its node and kernel).
Percentages are of the peaks of the device found (gpu_peaks.py), named beside them.

--rehearse runs every stage on CPU at tiny shapes (rehearsal.py): the C++ executor's whole
path against the fake driver (BESSEMER_LIBCUDA), the comparisons of 135m, 8b (head_dim 128)
and every quantized engine on logits the engine's launch list computes through the Triton
interpreter (TRITON_INTERPRET=1), the graph-vs-eager comparison on the fake driver's launch
records; speed figures are listed as not measurable on CPU.
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
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: tolerances, hf_kv_quant
sys.path.insert(0, str(HERE))

import gpu_disk  # noqa: E402
import gpu_measure as gm  # noqa: E402
import gpu_models as models  # noqa: E402
import gpu_peaks  # noqa: E402
import quant_reference  # noqa: E402
import rehearsal  # noqa: E402
from report import quant_summary_table, summary_table  # noqa: E402
from tolerances import BF16_ERROR_RATIO, CUDA_BF16_ERROR_RATIO  # noqa: E402

ENGINES = models.ENGINES
KV_CACHE_GIB = {"135m": 4.0, "1b": 8.0, "8b": 24.0}  # leaves room for the HF models in the same process
REHEARSAL_KV_GIB = 0.05
DECODE_BATCHES = (1, 2, 4, 8, 16, 32)  # --suite quant: where int4's decode advantage over bf16 ends
SUITES = ("bf16", "quant")


def shape_of(engine: str) -> str:
    return engine.split("-")[0]
# teacher-forced prompts (count, tokens) and greedy tokens per comparison; the rehearsal's
# interpreter runs ~0.5 s per step, hence its smaller sizes
# decode_tokens: how many of each prompt's tokens the logits comparisons run through decode
# steps (None: half), for bf16 and for quantized engines. An interpreted decode step runs each
# program of a split-K GEMM in Python (~10 s for an int4 engine on 2 busy cores): the
# rehearsal decodes one token of the bf16 engines, none of the quantized ones (their decode
# plans run under the interpreter in tests/cuda_interpreter/test_quantized.py and test_fp8.py)
SIZES = {False: dict(prompts=(5, 128), new_tokens=24, batch=(5, 37, 128, 77), prefix=(160, 96),
                     decode_tokens=(None, None)),
         True: dict(prompts=(2, 16), new_tokens=3, batch=(5, 9, 16, 12), prefix=(40, 32), decode_tokens=(1, 0))}
# rehearsal: engines whose comparisons run on interpreted logits (1b's run on the fake driver:
# its launches are compared, its numbers mean nothing)
INTERPRETED = ("135m", "8b", "8b-w4a16", "8b-fp8", "8b-fp8-kvfp8", "8b-w4k")
SYNC_VARIABLE = "BESSEMER_CUDA_SYNC"  # the executor's eager, synchronize-after-every-launch mode
# seconds a build needs at least on the GPU machine (kernels prebuilt): a build the time left
# cannot hold is skipped, not started and cut (the rehearsal's tiny builds take a second).
# The 8B quantized builds quantize ~7e9 weights on the machine's cores (the native int4 scale
# search over all of them, the rest on one thread per core ahead of the writer): int4 RTN ~4 ns
# a weight of 2-core time (1B: 26 s on 2 cores), E4M3 ~16 ns of one core's.
# w4k: w4a16's build plus the sub-block search, which spreads over the cores (SmolLM2 on 2
# cores: 7.0 CPU-s against w4a16's 4.7; at 8B ~140 CPU-s more, ~10 s over 16 cores).
BUILD_S = {"135m": 10, "1b": 20, "8b": 60, "8b-w4a16": 120, "8b-fp8": 90, "8b-fp8-kvfp8": 90, "8b-w4k": 130}
QUANT_BUILDS = ("8b-w4a16", "8b-fp8", "8b-fp8-kvfp8", "8b-w4k")
# seconds a stage may run on the H200 (its minimum to start is in run()); the first part of
# a name is enough: "correctness" covers correctness-135m and correctness-1b. decode-8b loads
# the 8B engine the later 8B stages share (sha256 of 15 GiB ~10 s, upload, 8 graphs). The
# quantized builds may take twice their estimate above (extrapolated from 2 cores to 16).
LIMITS = {"environment": 30, "checkpoint": 90, "build": 200, "correctness": 60, "decode": 60, "prefill": 45,
          "throughput": 90, "hf-eager": 60, "hf-compiled": 180,
          **{f"build-{name}": 2 * BUILD_S[name] for name in QUANT_BUILDS}}


class StageCut(BaseException):
    """A stage ran past its time limit (a BaseException: no library's `except Exception`
    swallows it)."""


def _cut(_signum, _frame):
    raise StageCut()


class Check:
    def __init__(self, out: Path, work: Path, budget_s: float, rehearse: bool, limits: dict | None = None,
                 engines: tuple = models.SUITE_ENGINES["quant"]):
        self.out, self.rehearse, self.engines = out, rehearse, engines
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
        self.synced_once = False  # the run's first correctness stage runs with SYNC_VARIABLE=1
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

    def stage(self, name: str, fn, min_s: float, needs: tuple = (), disk_gib: float = 0.0) -> None:
        missing = [n for n in needs if n in self.failed]
        if missing:
            self.results["stages"][name] = {"skipped": f"needs {', '.join(missing)}, which did not complete"}
            self.say(f"stage {name}: SKIPPED (needs {', '.join(missing)})")
            self.failed.add(name)
            return self.save()
        if disk_gib and self.disk_free_gib() < disk_gib:
            why = f"{self.disk_free_gib():.1f} GiB free under {self.work}, the stage writes ~{disk_gib:.1f} GiB"
            self.results["stages"][name] = {"skipped": why}
            self.say(f"stage {name}: SKIPPED ({why}; free space or set WORK)")
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
            if result.get("pass") is False:  # a comparison that does not hold: nothing of the engine is timed
                self.failed.add(name)
                self.say(f"stage {name}: FAILED in {result['seconds']:.1f}s: a comparison does not hold "
                         f"({', '.join(result.get('failed_checks', [])) or 'see results.json'})")
            else:
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
        info["peaks"] = self.results["peaks"] = self.device_peaks(info)
        self.say(f"peaks: {info['peaks']['label']}, dense bf16 {info['peaks']['bf16_flop_s'] / 1e12:.0f} TFLOP/s, "
                 f"fp8 {info['peaks']['fp8_flop_s'] / 1e12:.0f} ({info['peaks']['source']})")
        return info

    def device_peaks(self, info: dict) -> dict:
        """The device's peak HBM bandwidth and tensor-core rates (gpu_peaks.py): its datasheet
        figures by name, else computed from its SMs, bus width and clocks."""
        device = info["bessemer_device"]["devices"][0]
        name = info.get("torch_gpu") or device["name"]
        clocks = rehearsal.FAKE_DRIVER_CLOCKS if self.rehearse else gpu_peaks.driver_clocks()
        return gpu_peaks.device_peaks(name, dict(clocks, sm_count=device["multiprocessors"],
                                                 bus_width_bits=device["memory_bus_bits"]))

    @property
    def peaks(self) -> dict:
        if "peaks" not in self.results:
            raise RuntimeError("no device peaks: the environment stage did not complete")
        return self.results["peaks"]

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

        shutil.rmtree(self.work / f"engine-{name}", ignore_errors=True)  # a previous run's
        smaller = models.REHEARSAL_BUILD if self.rehearse else {}
        config = models.build_config(name, **smaller)
        engine = build_engine(self.work / f"hf-{shape_of(name)}", self.work / f"engine-{name}", config,
                              progress=self.say)
        report = json.loads((engine / "build_report.json").read_text())
        return {"options": dict(ENGINES[name], **smaller),
                "engine_gib": round(sum(f.stat().st_size for f in engine.iterdir()) / 2**30, 2),
                "bits_per_weight": report.get("bits_per_weight"),
                "kernels": {k: report["kernels"][k] for k in ("distinct", "compiled", "from_cache", "seconds")}}

    def correctness(self, name: str) -> dict:
        """The engine's logits against its HF reference before anything of it is timed: the
        bf16 engines of 135m and 1b also batch == alone, prefix hit == miss and graph ==
        eager; 8b (head_dim 128) and the quantized engines their teacher-forced logits on a
        few prompts (the engine the speed stages share: loaded once). "pass" is False when a
        comparison does not hold (the stage then counts as failed); a comparison on numbers
        nothing computed (the rehearsal's fake driver) is not judged (pass None)."""
        out = self.bf16_comparisons(name) if name in ("135m", "1b") else self.logits_only(name)
        out["failed_checks"] = [k for k, v in out.items() if isinstance(v, dict) and v.get("pass") is False]
        out["pass"] = not out["failed_checks"]
        return out

    @contextmanager
    def sync_if_first(self):
        """SYNC_VARIABLE=1 for the LLM opened inside, the first time only: the executor reads
        it at load and step, so the engine is opened, run and closed within the block."""
        if self.synced_once:
            yield False
            return
        self.synced_once = True
        previous = os.environ.get(SYNC_VARIABLE)
        os.environ[SYNC_VARIABLE] = "1"
        self.say(f"{SYNC_VARIABLE}=1 for this stage: a synchronize after every launch")
        try:
            yield True
        finally:
            if previous is None:
                os.environ.pop(SYNC_VARIABLE, None)
            else:
                os.environ[SYNC_VARIABLE] = previous

    def computed(self, name: str) -> str | None:
        """What computes the engine's numbers: None on the rehearsal's fake driver."""
        if not self.rehearse:
            return "gpu"
        return "triton interpreter (launch list of the engine)" if name in INTERPRETED else None

    def references(self, name: str, ids: list[list[int]]) -> tuple[list, list, str]:
        """HF logits (fp32, bf16) of the reference the engine is held to: the checkpoint's
        model for a bf16 engine; for a quantized one the same model with the engine's codes,
        scales and rounding applied (quant_reference.py), in fp32 and in bf16."""
        import torch

        base = self.hf[shape_of(name)]
        if not (ENGINES[name].get("quant") or ENGINES[name].get("kv_cache_dtype")):
            fp32 = copy.deepcopy(base).float()
            ref32, ref16 = models.hf_logits(fp32, ids, "float32"), models.hf_logits(base, ids, "bfloat16")
            self.free(fp32)
            return ref32, ref16, "HF fp32 (HF bf16's error is the bound's unit)"
        fake, notes = quant_reference.fake_quantized_hf(base, self.work / f"engine-{name}")
        ref32 = models.hf_logits(fake, ids, "float32")
        ref16 = models.hf_logits(fake.to(torch.bfloat16), ids, "bfloat16")
        self.free(fake)
        return ref32, ref16, f"HF fp32 with the engine's codes and scales {notes}"

    def bf16_comparisons(self, name: str) -> dict:
        vocab, sizes = self.shapes[name]["vocab_size"], self.sizes
        ids = gm.prompts(*sizes["prompts"], vocab, seed=1)
        ref32, ref16, reference = self.references(name, ids)
        computed = self.computed(name)
        out = {"computed_by": computed or "fake driver (nothing computed)", "reference": reference}
        with self.sync_if_first() as synced:
            llm = self.llm(name, interpreted=bool(self.rehearse and computed))
            try:
                out["cuda_sync"] = synced
                out["logits"] = gm.logits_error(llm, ids, ref32, ref16, ratio=BF16_ERROR_RATIO,
                                                decode_tokens=sizes["decode_tokens"][0])
                tie = BF16_ERROR_RATIO * out["logits"]["hf_bf16_max_abs_err"]
                out["batch_vs_alone"] = gm.batch_vs_alone(llm, vocab, tie, sizes["new_tokens"], sizes["batch"])
                out["prefix_cache"] = gm.prefix_cache(llm, vocab, tie, sizes["new_tokens"], *sizes["prefix"])
            finally:
                self.free(llm)
        if not computed:  # the fake driver's "logits" are whatever its memory holds
            for check in ("logits", "batch_vs_alone", "prefix_cache"):
                out[check]["pass"] = None
        # graphs on an engine opened outside the sync mode (which launches eagerly by design)
        llm = self.llm(name)
        try:
            recorder = rehearsal.fake_launch_log if self.rehearse else None  # the rehearsal compares launches
            out["graph_vs_eager"] = gm.graph_vs_eager(llm, vocab, recorder=recorder)  # last: KV blocks of its own
        finally:
            self.free(llm)
        if name == "135m":
            out["no_torch_at_run_time"] = self.runtime_imports(name)
        return out

    def logits_only(self, name: str) -> dict:
        """Teacher-forced logits of a few prompts (all at once, then with their last tokens
        through decode steps: half of them on the GPU) against the engine's reference; fp8
        engines in mean error too
        (an E4M3 activation code that one rounding moves is an fp8-sized error at one
        element: test_fp8.py's plan test bounds both)."""
        vocab = self.shapes[shape_of(name)]["vocab_size"]
        ids = gm.prompts(*self.sizes["prompts"], vocab, seed=1)
        ref32, ref16, reference = self.references(name, ids)
        quantized = bool(ENGINES[name].get("quant") or ENGINES[name].get("kv_cache_dtype"))
        computed = self.computed(name)
        out = {"computed_by": computed or "fake driver (nothing computed)", "reference": reference}
        with self.sync_if_first() as synced:
            dedicated = self.rehearse or synced  # else the engine the speed stages share
            llm = self.llm(name, interpreted=bool(self.rehearse and computed)) if dedicated else self.serving(name)
            try:
                out["cuda_sync"] = synced
                out["logits"] = gm.logits_error(llm, ids, ref32, ref16,
                                                ratio=CUDA_BF16_ERROR_RATIO if quantized else BF16_ERROR_RATIO,
                                                bound_mean="fp8" in name,
                                                decode_tokens=self.sizes["decode_tokens"][quantized])
            finally:
                if dedicated:
                    self.free(llm)
        if not computed:
            out["logits"]["pass"] = None
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
        peak = self.peaks["hbm_bytes_s"]
        out.update(bytes_per_token=per_token["total"], weight_bytes_per_token=per_token["weights"],
                   hbm_fraction=per_token["total"] * out["generate_tok_s"] / peak,
                   hbm_fraction_executor=per_token["total"] / (out["executor_step_ms"] / 1e3) / peak,
                   hbm_fraction_of=self.peaks["label"], executor=llm.executor.stats())
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
        kind = "fp8" if (ENGINES[name].get("quant") or {}).get("mode") == "fp8" else "bf16"
        peak = self.peaks[f"{kind}_flop_s"]
        out.update(tokens=tokens, linear_tflop=flops / 1e12, engine_tflop_s=flops / out["step_s"] / 1e12,
                   torch_matmul_tflop_s=flops / torch_s / 1e12, ratio_to_torch_matmul=torch_s / out["step_s"],
                   engine_peak_fraction=flops / out["step_s"] / peak,
                   engine_peak_fraction_of=f"{self.peaks['device']} dense {kind} {peak / 1e12:.0f} TFLOP/s")
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

    def decode_batches(self, name: str) -> dict:
        """Decode steps of B sequences (the executor's step alone, graphs on) for B in
        DECODE_BATCHES: tok/s; the bf16 engine's stage (measured last, as its baseline) adds
        the ratio of every engine measured before it."""
        llm = self.serving(name)
        out = {"tok_s": {b: gm.decode_step_tok_s(llm, b, context=256) for b in DECODE_BATCHES}}
        if name == "8b":
            out["ratio"] = {other: {b: node["tok_s"][b] / out["tok_s"][b] for b in DECODE_BATCHES}
                            for other, node in ((stage.removeprefix("decode-batches-"), n)
                                                for stage, n in self.results["stages"].items()
                                                if stage.startswith("decode-batches-8b-") and "tok_s" in n)}
        return out

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

    # ---- disk: a stage that writes checkpoints or engines starts only when they fit ----
    def disk_free_gib(self) -> float:
        return shutil.disk_usage(self.work).free / 2**30

    def remove(self, what: str) -> None:
        """Deletes a checkpoint or engine of WORK (hf-NAME, engine-NAME) once its stages are done."""
        path = self.work / what
        if path.exists():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**30
            shutil.rmtree(path)
            self.say(f"deleted {path} ({size:.1f} GiB); {self.disk_free_gib():.1f} GiB free")
            self.results.setdefault("deleted", []).append(what)

    # ---- the runs ----
    def engine_stages(self, name: str, speed: list) -> None:
        """build-NAME, correctness-NAME, then the engine's speed stages [(stage, fn, min_s)],
        each needing the build and the correctness; the engine deleted after them."""
        s = self.stage
        if name not in self.engines:
            return
        need_gib = gpu_disk.engine_gib(self.shapes[shape_of(name)], ENGINES[name])
        s(f"build-{name}", lambda: self.build(name), 5 if self.rehearse else BUILD_S[name],
          needs=(f"checkpoint-{shape_of(name)}",), disk_gib=need_gib)
        s(f"correctness-{name}", lambda: self.correctness(name), 20, needs=(f"build-{name}",))
        for stage, fn, min_s in speed:
            s(stage, fn, min_s, needs=(f"build-{name}", f"correctness-{name}"))
        self.release(name)
        self.remove(f"engine-{name}")

    def run_quant(self) -> int:
        """--suite quant (issue 22): the 8B shape as int4 (g128), bf16 (the baseline of the
        batch sweep), fp8 and fp8 with an fp8 KV cache (the slowest builds last), then two-level
        int4 (w4k, issue 39), one engine on disk at a time: each built, compared with its
        reference, timed, and deleted; the checkpoint last. --engines runs some of them (a
        lease too short for all five)."""
        s = self.stage
        s("environment", self.environment, 5)
        s("checkpoint-8b", lambda: self.checkpoint("8b"), 30, needs=("environment",),
          disk_gib=gpu_disk.checkpoint_gib(self.shapes["8b"]))
        self.engine_stages("8b-w4a16", [("decode-8b-w4a16", lambda: self.decode("8b-w4a16"), 20),
                                        ("decode-batches-8b-w4a16", lambda: self.decode_batches("8b-w4a16"), 15)])
        self.engine_stages("8b", [("decode-batches-8b", lambda: self.decode_batches("8b"), 15)])
        self.engine_stages("8b-fp8", [("decode-8b-fp8", lambda: self.decode("8b-fp8"), 20),
                                      ("prefill-8b-fp8", lambda: self.prefill("8b-fp8", 2048), 15),
                                      ("throughput-8b-fp8", lambda: self.throughput("8b-fp8", prompt_len=1024), 40)])
        self.engine_stages("8b-fp8-kvfp8", [("throughput-8b-fp8-kvfp8",
                                             lambda: self.throughput("8b-fp8-kvfp8", prompt_len=1024), 40)])
        # issue 39: w4k's batch-1 decode beside w4a16's (report.py: the ratio); last, the
        # first to go when the budget is short
        self.engine_stages("8b-w4k", [("decode-8b-w4k", lambda: self.decode("8b-w4k"), 20)])
        self.remove("hf-8b")
        return self.finish(quant_summary_table)

    def run(self) -> int:
        s = self.stage
        s("environment", self.environment, 5)
        # per model, the small ones first: a slow 8B checkpoint or build costs only the 8B stages
        for name, ckpt_s, build_s in (("135m", 5, 10), ("1b", 10, 20)):
            s(f"checkpoint-{name}", lambda n=name: self.checkpoint(n), ckpt_s, needs=("environment",),
              disk_gib=gpu_disk.checkpoint_gib(self.shapes[name]))
            s(f"build-{name}", lambda n=name: self.build(n), build_s, needs=(f"checkpoint-{name}",),
              disk_gib=gpu_disk.engine_gib(self.shapes[name], ENGINES[name]))
        for name in ("135m", "1b"):  # 135m first: the run's one correctness stage in the sync mode
            s(f"correctness-{name}", lambda n=name: self.correctness(n), 25, needs=(f"build-{name}",))
        s("decode-135m", lambda: self.decode("135m"), 15, needs=("build-135m", "correctness-135m"))
        self.release("135m")
        s("checkpoint-8b", lambda: self.checkpoint("8b"), 30, needs=("environment",),
          disk_gib=gpu_disk.checkpoint_gib(self.shapes["8b"]))
        s("build-8b", lambda: self.build("8b"), 60, needs=("checkpoint-8b",),
          disk_gib=gpu_disk.engine_gib(self.shapes["8b"], ENGINES["8b"]))
        s("correctness-8b", lambda: self.correctness("8b"), 20, needs=("build-8b",))
        speed_8b = ("build-8b", "correctness-8b")
        s("decode-8b", lambda: self.decode("8b"), 20, needs=speed_8b)
        s("prefill-8b", lambda: self.prefill("8b", 2048), 15, needs=speed_8b)
        s("throughput-8b", lambda: self.throughput("8b"), 40, needs=speed_8b)
        self.release("8b")
        s("hf-eager-8b", lambda: self.hf_baseline("8b", compiled=False), 40, needs=("decode-8b",))
        s("decode-1b", lambda: self.decode("1b"), 15, needs=("build-1b", "correctness-1b"))
        self.release("1b")
        # torch.compile takes minutes on the 8B model: that shape if the time allows, else 1B
        big = self.left() > 200 and "decode-8b" not in self.failed
        name = "8b" if big else "1b"
        s(f"hf-compiled-{name}", lambda: self.hf_baseline(name, compiled=True), 150 if big else 80,
          needs=(f"decode-{name}",))
        return self.finish(summary_table)

    def finish(self, table) -> int:
        self.results["summary"] = table(self.results)
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
    ap.add_argument("--engines", default=",".join(models.SUITE_ENGINES["quant"]),
                    help="--suite quant: the engines to build and check, in the suite's order (default: all five)")
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
    engines = tuple(e for e in args.engines.split(",") if e)
    unknown = [e for e in engines if e not in models.SUITE_ENGINES["quant"]]
    if unknown:
        ap.error(f"--engines {unknown[0]!r}: the quant suite's engines are {', '.join(models.SUITE_ENGINES['quant'])}")
    check = Check(args.out, args.work, args.budget_s, args.rehearse, limits, engines)
    check.results["suite"] = args.suite
    return check.run_quant() if args.suite == "quant" else check.run()


if __name__ == "__main__":
    sys.exit(main())
