"""Micro-benchmark of attention@1 (bessemer._C) at decode: one sequence's KV cache filled to
--context tokens, then decode steps of --batch rows (each its own sequence at that context)
timed alone. The plan is one embedding then one attention step; the executor's per-op
profile gives the attention time alone (the embedding and the step's Python excluded).

Reports the median and the minimum over --repeats steps, in microseconds per step, for each
(context, batch) pair, so that two trees can be compared in one interleaved run:

    python bench/attention_speed.py [--heads 9 --kv-heads 3 --head-dim 64] [--kv-dtype bfloat16]
                                    [--context 512,2048] [--batch 1,4] [--threads 2] [--isa auto]

(run it under each tree's PYTHONPATH; SmolLM2-135M's shape is the default).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

# the bessemer of PYTHONPATH (or the installed one): the same script measures any tree
from bessemer import _C
from bessemer.format.container import TensorEntry, write_rank_file
from bessemer.format.layouts import encode
from bessemer.format.step import StepBatch

BLOCK = 16  # KV cache block size (tokens)
VOCAB = 61


def i32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def engine(path: Path, H: int, Hkv: int, D: int, kv_dtype: str) -> Path:
    """One embedding (q|k|v rows of random values) then attention@1 over its output."""
    W = (H + 2 * Hkv) * D
    table = np.random.default_rng(0).standard_normal((VOCAB, W)).astype(np.float32)
    attrs = {"layer": 0, "num_heads": H, "num_kv_heads": Hkv, "head_dim": D, "scale": float(D ** -0.5),
             "sliding_window": 0}

    def step(op, ins, outs, weights):
        return {"op": op, "version": 1, "node": "", "ins": ins, "outs": outs, "weights": weights,
                "attrs": attrs if op == "attention" else {}}

    kv = {"num_layers": 1, "num_kv_heads": Hkv, "head_dim": D, "dtype": kv_dtype}
    if kv_dtype in ("int8", "float8_e4m3"):
        kv["scales"] = "dynamic_per_token_head_float32"
    plan = {"buffers": [{"id": 0, "width": W, "rows": "tokens"}, {"id": 1, "width": H * D, "rows": "tokens"}],
            "steps": [step("embedding", [], [[0, 0, W]], ["emb"]),
                      step("attention", [[0, 0, H * D], [0, H * D, Hkv * D], [0, (H + Hkv) * D, Hkv * D]],
                           [[1, 0, H * D]], [])],
            "kv_cache": kv, "logits": [1, 0, H * D], "vocab_size": H * D}
    entry = TensorEntry("emb", "float32", "row_major", table.shape, lambda: encode(table, "float32", "row_major"))
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, [entry])
    return path


def decode_times(ex, context: int, batch: int, repeats: int) -> list[float]:
    """Seconds of attention per decode step of `batch` sequences at `context` keys."""
    nb = (context + 1 + BLOCK - 1) // BLOCK
    tables = i32(np.arange(batch * nb).reshape(batch, nb))
    rng = np.random.default_rng(1)
    for s in range(batch):  # fill each sequence's cache (prefill, one sequence per step)
        toks = rng.integers(0, VOCAB, context)
        ex.step(StepBatch(i32(toks), i32(np.arange(context)), i32([0, context]), i32([context]), tables[s: s + 1],
                          i32([context - 1])))
    dec = StepBatch(i32(rng.integers(0, VOCAB, batch)), i32(np.full(batch, context)), i32(np.arange(batch + 1)),
                    i32(np.full(batch, context + 1)), tables, i32(np.arange(batch)))
    times = []
    for _ in range(repeats + 2):
        ex.profiling = True  # clears the counters
        ex.step(dec)
        times.append(ex.profile_stats()["attention"][1])
    ex.profiling = False
    return times[2:]  # the first steps warm the caches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--kv-dtype", default="bfloat16", choices=["float32", "bfloat16", "int8", "float8_e4m3"])
    ap.add_argument("--context", default="512,2048", help="comma-separated key counts")
    ap.add_argument("--batch", default="1,4", help="comma-separated decode batch sizes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", default="auto", choices=["auto", "avx2", "avx512"])
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    contexts = [int(c) for c in args.context.split(",")]
    batches = [int(b) for b in args.batch.split(",")]
    num_blocks = max(batches) * ((max(contexts) + 1 + BLOCK - 1) // BLOCK)
    with tempfile.TemporaryDirectory() as tmp:
        path = engine(Path(tmp) / "attn.engine", args.heads, args.kv_heads, args.head_dim, args.kv_dtype)
        ex = _C.Executor(_C.EngineFile(str(path)), args.threads, BLOCK, num_blocks, args.isa)
        for c in contexts:
            for b in batches:
                t = decode_times(ex, c, b, args.repeats)
                print(f"context {c:6d} batch {b:3d}: median {statistics.median(t) * 1e6:8.1f} us  "
                      f"min {min(t) * 1e6:8.1f} us")


if __name__ == "__main__":
    main()
