"""Builds, on CPU, cuda engines at the GPU check's real shapes (135M, 1B, 8B) and build
options, with the layers cut to 2 (every layer has the same kernels: the engines need
exactly the kernels of the full models). It rehearses the lowering and the ahead-of-time
compilation of those shapes without a GPU, and fills a kernel cache (BESSEMER_KERNEL_CACHE,
default .cache/kernels) that the GPU run can be given: the same kernel specs, sources,
arch and Triton version give the same cubins. With --fake-driver LIB (the fake libcuda.so.1
of tests/cuda_executor), each engine is then loaded by LLM on that driver and serves a
batch: the C++ executor checks every real-shape cubin's parameters, launch block and shared
memory, uploads the weights and captures the decode graphs, as on the GPU (it computes nothing).

    python tests/gpu/prebuild_kernels.py [--work DIR] [--only 135m,1b,8b] [--fake-driver LIB]
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
from check import ENGINES  # noqa: E402


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bessemer-prebuild")
    ap.add_argument("--only", default="135m,1b,8b")
    ap.add_argument("--fake-driver", type=Path, help="the fake libcuda.so.1: load and step each engine on it")
    args = ap.parse_args()
    if args.fake_driver:
        os.environ["BESSEMER_LIBCUDA"] = str(args.fake_driver.resolve())
        os.environ.setdefault("BESSEMER_FAKE_CUDA_MEMORY_MIB", "143771")  # an H200's (host memory backs it)
    os.environ.setdefault("BESSEMER_KERNEL_CACHE", str(HERE.parents[1] / ".cache" / "kernels"))
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    report = {}
    for name in args.only.split(","):
        shape = dict(models.SHAPES[name], num_hidden_layers=2)
        ckpt, engine = args.work / f"hf-{name}", args.work / f"engine-{name}"
        t = time.perf_counter()
        model = models.make_checkpoint(shape, ckpt, "cpu")
        del model
        made = time.perf_counter() - t
        t = time.perf_counter()
        build_engine(ckpt, engine, BuildConfig(target="cuda", dtype="bfloat16", **ENGINES[name]),
                     progress=lambda m: print(f"  {name}: {m}", flush=True))
        kernels = json.loads((engine / "build_report.json").read_text())["kernels"]
        report[name] = {"checkpoint_s": round(made, 1), "build_s": round(time.perf_counter() - t, 1),
                        "engine_mib": round((engine / "rank0.engine").stat().st_size / 2**20, 1),
                        **{k: kernels[k] for k in ("distinct", "compiled", "from_cache", "seconds")}}
        if args.fake_driver:
            report[name]["fake_driver"] = serve_on_fake_driver(engine, models.SHAPES[name]["vocab_size"])
        print(json.dumps({name: report[name]}), flush=True)
        shutil.rmtree(ckpt)
        shutil.rmtree(engine)
    cache = Path(os.environ["BESSEMER_KERNEL_CACHE"])
    size = sum(f.stat().st_size for f in cache.glob("*"))
    print(json.dumps({"kernel_cache": str(cache), "entries": len(list(cache.glob("*.cubin"))),
                      "mib": round(size / 2**20, 2), "builds": report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
