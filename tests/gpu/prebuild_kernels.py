"""Builds, on CPU, cuda engines at the GPU check's real shapes (135M, 1B, 8B) and build
options, with the layers cut to 2 (every layer has the same kernels: the engines need
exactly the kernels of the full models). It rehearses the lowering and the ahead-of-time
compilation of those shapes without a GPU, and fills a kernel cache (BESSEMER_KERNEL_CACHE,
default .cache/kernels) that the GPU run can be given: the same kernel specs, sources,
arch and Triton version give the same cubins.

    python tests/gpu/prebuild_kernels.py [--work DIR] [--only 135m,1b,8b]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_models as models  # noqa: E402
from check import ENGINES  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bessemer-prebuild"))
    ap.add_argument("--only", default="135m,1b,8b")
    args = ap.parse_args()
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
