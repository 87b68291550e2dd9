"""Micro-benchmark of moe_mxfp4@1 alone at gpt-oss-20b's widths (hidden 2880, 32 experts of
2880, top-4, biases): one MoE layer's step time per ISA and thread count, for 1 token (batch-1
decode: 4 routed experts) and a few larger batches, and the GB/s of routed expert bytes
that time streams, next to the copy bandwidth.

The plan is one embedding and L moe_mxfp4 steps with distinct random weights (so that the
experts come from DRAM, not from cache); each token's router logits come from the embedding
row, so successive tokens route to different experts. Figures are the best of --repeats
timed steps per case (load from elsewhere only slows a step down); the cases are interleaved.
Also the best CPU time of the process per layer: with one thread, the kernel's own cost on a
loaded machine (time spent descheduled left out; with more, it includes OpenMP's spin-waits).

    python bench/moe_kernel_speed.py [--isas avx2,avx512] [--threads 1,2] [--tokens 1,4,16]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bessemer import _C  # noqa: E402
from bessemer.format.container import TensorEntry, write_rank_file  # noqa: E402
from bessemer.format.layouts import encode  # noqa: E402
from bessemer.format.step import StepBatch  # noqa: E402

H, I, E, TOP_K, V = 2880, 2880, 32, 4, 64
NO_KV = {"num_layers": 0, "num_kv_heads": 1, "head_dim": 1, "dtype": "float32"}  # no attention in the plan


def i32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def make_engine(path: Path, layers: int, rng) -> int:
    """Writes the engine; returns the routed expert bytes of one token and layer."""
    entries, steps = [], [{"op": "embedding", "version": 1, "node": "", "ins": [], "outs": [[0, 0, H + E]],
                           "weights": ["emb"], "attrs": {}}]
    emb = rng.standard_normal((V, H + E)).astype(np.float32)
    entries.append(TensorEntry("emb", "float32", "row_major", emb.shape, lambda: encode(emb, "float32", "row_major")))
    per_expert = 0
    attrs = {"num_experts": E, "top_k": TOP_K, "expert_size": I, "softmax_after_topk": 1, "norm_topk_prob": 0,
             "layout": 1, "activation": 1}
    for layer in range(layers):
        names = []
        for part, n, k in (("gu", 2 * I, H), ("d", H, I)):
            name = f"l{layer}.{part}"
            for suffix, shape in (("", (E * n, k // 2)), (".scales", (E * n, k // 32))):
                seed = int(rng.integers(1 << 31))
                lo, hi = (0, 256) if not suffix else (118, 122)
                entries.append(TensorEntry(name + suffix, "uint8", "row_major", shape,
                                           lambda s=shape, seed=seed, lo=lo, hi=hi: np.random.default_rng(seed).integers(
                                               lo, hi, s, dtype=np.uint8).tobytes()))
                names.append(name + suffix)
                if layer == 0:
                    per_expert += int(np.prod(shape)) // E
        for part, n in (("gub", 2 * I), ("db", H)):
            b = (rng.standard_normal((E, n)) * 0.1).astype(np.float32)
            entries.append(TensorEntry(f"l{layer}.{part}", "float32", "row_major", b.shape,
                                       lambda b=b: encode(b, "float32", "row_major")))
            names.append(f"l{layer}.{part}")
            if layer == 0:
                per_expert += b.nbytes // E
        # layers alternate between two buffers so that each reads the previous one's output
        src, dst = layer % 2, 1 - layer % 2
        steps.append({"op": "moe_mxfp4", "version": 1, "node": "", "ins": [[src, 0, H], [0, H, E]],
                      "outs": [[dst, 0, H]], "weights": names, "attrs": attrs})
    plan = {"buffers": [{"id": i, "width": H + E, "rows": "tokens"} for i in range(2)], "steps": steps,
            "kv_cache": NO_KV, "logits": [layers % 2, 0, H], "vocab_size": H}
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, entries)
    return TOP_K * per_expert


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--isas", default="avx2,avx512")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", default="1,4,16")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import compare_setup

    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "moe.engine"
        routed = make_engine(path, args.layers, rng)
        f = _C.EngineFile(str(path))
        cases = [(isa, int(t), int(m)) for isa in args.isas.split(",") for t in args.threads.split(",")
                 for m in args.tokens.split(",")]
        executors = {(isa, t): _C.Executor(f, t, 16, 64, isa) for isa, t, _ in cases}
        best = {c: float("inf") for c in cases}
        best_cpu = {c: float("inf") for c in cases}  # CPU seconds of the process: time descheduled left out
        for r in range(args.repeats):
            for case in cases:
                isa, t, m = case
                tokens = (np.arange(m) * 7 + r * 13) % V  # different experts from step to step
                batch = StepBatch(i32(tokens), i32(np.arange(m)), i32([0, m]), i32([m]), i32(np.full((1, 1), -1)),
                                  i32([m - 1]))
                s, cpu = time.perf_counter(), time.process_time()
                executors[(isa, t)].step(batch)
                best[case] = min(best[case], (time.perf_counter() - s) / args.layers)
                best_cpu[case] = min(best_cpu[case], (time.process_time() - cpu) / args.layers)
        bw = {t: compare_setup.copy_bandwidth(t)["copy_GBps"] for t in {c[1] for c in cases}}
    print(f"moe_mxfp4 at gpt-oss-20b widths, {args.layers} layers, best of {args.repeats}; routed expert bytes "
          f"per token and layer {routed / 1e6:.1f} MB")
    for isa, t, m in cases:
        ms = best[(isa, t, m)] * 1e3
        line = f"{isa:7s} threads {t} tokens {m:3d}: {ms:7.2f} ms/layer (CPU {best_cpu[(isa, t, m)] * 1e3:7.2f} ms)"
        if m == 1:
            line += f"  {routed / best[(isa, t, m)] / 1e9:5.2f} GB/s of routed experts (copy bandwidth {bw[t]} GB/s)"
        print(line)


if __name__ == "__main__":
    main()
