"""Builds, on CPU, the cuda engines of the GPU check's suites (bf16: 135M, 1B, 8B; quant:
the 8B shape as w4a16, bf16, fp8, fp8 + fp8 KV and w4k) at their real shapes and build options,
with the layers cut to 2 (every layer has the same kernels: the engines need exactly the
kernels of the full models). It rehearses the lowering and the ahead-of-time compilation of
those shapes without a GPU, and fills a kernel cache (BESSEMER_KERNEL_CACHE, default
.cache/kernels) that the GPU run can be given: the same kernel specs, sources, arch and
Triton version give the same cubins. It writes MANIFEST in the cache: per suite, the cache
keys its engines looked up (seen through Python's audit hook on the cache's files), which
check.sh counts against the cubins it finds. With --fake-driver LIB (the fake libcuda.so.1 of
tests/cuda_executor), each engine is then loaded by LLM on that driver and serves a batch:
the C++ executor checks every real-shape cubin's parameters, launch block and shared memory,
uploads the weights and captures the decode graphs, as on the GPU (it computes nothing).

    python tests/gpu/prebuild_kernels.py [--work DIR] [--suite bf16|quant|all] [--only 8b-fp8,...] [--fake-driver LIB]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_models as models  # noqa: E402
import rehearsal  # noqa: E402


def serve_on_fake_driver(engine: Path, vocab: int) -> dict:
    import numpy as np

    from bessemer.runtime.llm import LLM, SamplingParams

    t = time.perf_counter()
    llm = LLM(engine, kv_cache_gib=0.5)
    loaded = time.perf_counter() - t
    rehearsal.fake_computes_nothing(llm)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, n).tolist() for n in (130, 7, 64)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    stats = llm.executor.stats()
    return {"load_s": round(loaded, 1), "graph_buckets": llm.executor.graph_buckets,
            "kv_blocks": llm.num_kv_blocks, "tokens": [len(o.token_ids) for o in outs],
            **{k: v for k, v in stats.items() if isinstance(v, int)}}


MANIFEST = "prebuilt.json"  # {suite: [cache key, ...]} in the kernel cache


class CacheLookups:
    """The kernel cache keys looked up while it is open: every lookup opens KEY.json first
    (compile.py _read_cache), found or not, and Python's audit hook sees the open."""

    def __init__(self, cache: Path):
        self.cache, self.keys, self.active = str(cache.resolve()), set(), False
        sys.addaudithook(self._audit)  # hooks cannot be removed: `active` bounds what it records

    def _audit(self, event: str, args) -> None:
        if self.active and event == "open" and isinstance(args[0], (str, Path)):
            path = Path(args[0])
            if str(path.parent.resolve()) == self.cache and path.suffix == ".json" and path.stem != "prebuilt":
                self.keys.add(path.stem)

    def __enter__(self):
        self.keys, self.active = set(), True
        return self

    def __exit__(self, *exc):
        self.active = False


def write_manifest(cache: Path, keys_by_suite: dict[str, set]) -> dict:
    """Merges these suites' keys into the cache's manifest (a run for one suite keeps the other's)."""
    path = cache / MANIFEST
    manifest = json.loads(path.read_text()) if path.exists() else {}
    manifest.update({suite: sorted(keys) for suite, keys in keys_by_suite.items()})
    path.write_text(json.dumps(manifest, indent=1))
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bessemer-prebuild")
    ap.add_argument("--suite", choices=("bf16", "quant", "all"), default="all")
    ap.add_argument("--only", default="", help="some engines of the suite(s), e.g. 8b-fp8 (no manifest written)")
    ap.add_argument("--fake-driver", type=Path, help="the fake libcuda.so.1: load and step each engine on it")
    args = ap.parse_args()
    if args.fake_driver:
        os.environ["BESSEMER_LIBCUDA"] = str(args.fake_driver.resolve())
        os.environ.setdefault("BESSEMER_FAKE_CUDA_MEMORY_MIB", "143771")  # an H200's (host memory backs it)
    os.environ.setdefault("BESSEMER_KERNEL_CACHE", str(HERE.parents[1] / ".cache" / "kernels"))
    from bessemer.builder.build import build_engine

    cache = Path(os.environ["BESSEMER_KERNEL_CACHE"])
    cache.mkdir(parents=True, exist_ok=True)
    suites = ("bf16", "quant") if args.suite == "all" else (args.suite,)
    only = set(filter(None, args.only.split(",")))
    lookups = CacheLookups(cache)
    keys: dict[str, set] = {suite: set() for suite in suites}
    report, checkpoints = {}, []
    for name in dict.fromkeys(e for suite in suites for e in models.SUITE_ENGINES[suite]):
        if only and name not in only:
            continue
        shape_name = name.split("-")[0]
        shape = dict(models.SHAPES[shape_name], num_hidden_layers=2)
        ckpt, engine = args.work / f"hf-{shape_name}", args.work / f"engine-{name}"
        t = time.perf_counter()
        if not (ckpt / "config.json").exists():  # the quant suite's engines share the 8B checkpoint
            models.make_checkpoint(shape, ckpt, "cpu")  # the model it returns is not needed here
            checkpoints.append(ckpt)
        made = time.perf_counter() - t
        t = time.perf_counter()
        with lookups:
            build_engine(ckpt, engine, models.build_config(name), progress=lambda m: print(f"  {name}: {m}", flush=True))
        for suite in suites:
            if name in models.SUITE_ENGINES[suite]:
                keys[suite] |= lookups.keys
        kernels = json.loads((engine / "build_report.json").read_text())["kernels"]
        report[name] = {"checkpoint_s": round(made, 1), "build_s": round(time.perf_counter() - t, 1),
                        "engine_mib": round((engine / "rank0.engine").stat().st_size / 2**20, 1),
                        "looked_up": len(lookups.keys),
                        **{k: kernels[k] for k in ("distinct", "compiled", "from_cache", "seconds")}}
        if args.fake_driver:
            report[name]["fake_driver"] = serve_on_fake_driver(engine, models.SHAPES[shape_name]["vocab_size"])
        print(json.dumps({name: report[name]}), flush=True)
        shutil.rmtree(engine)
    for ckpt in checkpoints:
        shutil.rmtree(ckpt)
    manifest = write_manifest(cache, keys) if not only else {}
    size = sum(f.stat().st_size for f in cache.glob("*"))
    print(json.dumps({"kernel_cache": str(cache), "entries": len(list(cache.glob("*.cubin"))),
                      "manifest": {suite: len(v) for suite, v in manifest.items()},
                      "mib": round(size / 2**20, 2), "builds": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
