"""Micro-benchmark of the expert kernels alone at real widths: moe_w4a16@1 at Qwen3-30B-A3B's
(hidden 2048, 128 experts of 768, top-8, int4 codes in groups of 32 with bf16 scales, as
`--quant w4a16 --group-size 32` stores them) and moe_mxfp4@1 at gpt-oss-20b's (hidden 2880,
32 experts of 2880, top-4, biases, MXFP4 as shipped). One MoE layer's step time per ISA,
thread count and batch (1 token: batch-1 decode), and the GB/s of expert bytes the step reads
(each routed expert's codes and scales once, however many of the step's tokens it serves),
next to a plain read of memory with as many threads (bench/read_bandwidth.py).

The plan is one embedding and --layers MoE steps with distinct random weights (every layer's
experts together far beyond the last-level cache, so they come from DRAM); each token's router
logits come from its embedding row, and successive steps take other rows, so they route to
other experts. A first step of every row pages in the experts the rounds can reach (the
weights are memory-mapped: the first touch of a page is a fault, not a read). Cases are
interleaved round by round (load from elsewhere hits them alike); each case reports the
median and the best of its --repeats steps, and the best CPU time of the process per layer
(with one thread: the kernel's own cost, time descheduled left out; with two, OpenMP's
spin-waits count too). --engine-dir keeps the engines for later runs (an A/B of two builds
reads the same files); an interrupted first write leaves a broken file there: delete it.

    python bench/moe_kernel_speed.py [--kernels w4a16,mxfp4] [--isas avx512,avx2] [--threads 1,2]
                                     [--tokens 1,2,4,8] [--layers 2] [--repeats 15] [--engine-dir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bessemer import _C  # noqa: E402
from bessemer.format.container import TensorEntry, write_rank_file  # noqa: E402
from bessemer.format.layouts import encode, packed_nbytes  # noqa: E402
from bessemer.format.step import StepBatch  # noqa: E402

V = 64  # embedding rows (tokens)
NO_KV = {"num_layers": 0, "num_kv_heads": 1, "head_dim": 1, "dtype": "float32"}  # no attention in the plan


@dataclass(frozen=True)
class Shape:
    op: str
    H: int
    I: int
    E: int
    top_k: int
    attrs: dict  # routing / layout / activation attrs besides the widths


SHAPES = {
    # Qwen3-30B-A3B: softmax over all experts, top-8 renormalized; gate rows then up rows (layout 0)
    "w4a16": Shape("moe_w4a16", 2048, 768, 128, 8, {"softmax_after_topk": 0, "norm_topk_prob": 1, "layout": 0,
                                                     "activation": 0, "zero_point": 0}),
    # gpt-oss-20b: top-4 then softmax; gate/up interleaved (layout 1), clamped swiglu, biases
    "mxfp4": Shape("moe_mxfp4", 2880, 2880, 32, 4, {"softmax_after_topk": 1, "norm_topk_prob": 0, "layout": 1,
                                                     "activation": 1}),
}
W4_GROUP = 32
SEEDS = {"w4a16": 0, "mxfp4": 1}


def i32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def _random_bytes(shape, lo, hi, rng):
    seed = int(rng.integers(1 << 31))
    return lambda: np.random.default_rng(seed).integers(lo, hi, shape, dtype=np.uint8).tobytes()


def _random_bf16_scales(shape, rng):
    seed = int(rng.integers(1 << 31))

    def make():
        s = np.random.default_rng(seed).uniform(0.002, 0.004, shape).astype(np.float32)
        return encode(s, "bfloat16", "panel16")
    return make


def expert_entries(s: Shape, layer: int, rng) -> tuple[list, list[str], int]:
    """(entries, weight names, stored bytes of one expert) of one layer's experts."""
    entries, names, per_expert = [], [], 0
    for part, n, k in (("gu", 2 * s.I, s.H), ("d", s.H, s.I)):
        name = f"l{layer}.{part}"
        rows = s.E * n
        if s.op == "moe_w4a16":  # panel16_int4_k8 codes (any bytes are valid codes), bf16 panel16 scales
            parts = [(name, "int4", "panel16_int4_k8", (rows, k), _random_bytes(packed_nbytes((rows, k), "int4",
                                                                                             "panel16_int4_k8"),
                                                                                0, 256, rng)),
                     (name + ".scales", "bfloat16", "panel16", (rows, k // W4_GROUP),
                      _random_bf16_scales((rows, k // W4_GROUP), rng))]
        else:  # MXFP4: codes (rows, K/2) and E8M0 scales near 2^-7 (rows, K/32), row_major
            parts = [(name, "uint8", "row_major", (rows, k // 2), _random_bytes((rows, k // 2), 0, 256, rng)),
                     (name + ".scales", "uint8", "row_major", (rows, k // 32),
                      _random_bytes((rows, k // 32), 118, 122, rng))]
        for pname, dtype, layout, shape, make in parts:
            entries.append(TensorEntry(pname, dtype, layout, shape, make))
            names.append(pname)
            per_expert += packed_nbytes(shape, dtype, layout) // s.E
    if s.op == "moe_mxfp4":
        for part, n in (("gub", 2 * s.I), ("db", s.H)):
            b = (rng.standard_normal((s.E, n)) * 0.1).astype(np.float32)
            entries.append(TensorEntry(f"l{layer}.{part}", "float32", "row_major", b.shape,
                                       lambda b=b: encode(b, "float32", "row_major")))
            names.append(f"l{layer}.{part}")
            per_expert += b.nbytes // s.E
    return entries, names, per_expert


def make_engine(path: Path, s: Shape, layers: int, rng, reuse: bool) -> tuple[np.ndarray, int]:
    """Writes the engine (reuse: unless path holds it from an earlier run; the same rng seed
    makes the same engine); returns (the embedding table (V, H + E), stored bytes of one expert)."""
    width = s.H + s.E
    emb = rng.standard_normal((V, width)).astype(np.float32)
    if reuse and path.exists():
        return emb, expert_entries(s, 0, rng)[2]
    entries = [TensorEntry("emb", "float32", "row_major", emb.shape, lambda: encode(emb, "float32", "row_major"))]
    steps = [{"op": "embedding", "version": 1, "node": "", "ins": [], "outs": [[0, 0, width]], "weights": ["emb"],
              "attrs": {}}]
    attrs = dict(s.attrs, num_experts=s.E, top_k=s.top_k, expert_size=s.I)
    for layer in range(layers):
        ents, names, per_expert = expert_entries(s, layer, rng)
        entries += ents
        # every layer reads the embedding row (hidden state | router logits): the kernels'
        # cost does not depend on the values
        steps.append({"op": s.op, "version": 1, "node": "", "ins": [[0, 0, s.H], [0, s.H, s.E]],
                      "outs": [[1, 0, s.H]], "weights": names, "attrs": attrs})
    plan = {"buffers": [{"id": 0, "width": width, "rows": "tokens"}, {"id": 1, "width": s.H, "rows": "tokens"}],
            "steps": steps, "kv_cache": NO_KV, "logits": [1, 0, s.H], "vocab_size": s.H}
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, entries)
    return emb, per_expert


def routed_experts(emb: np.ndarray, s: Shape, tokens: np.ndarray) -> int:
    """Distinct experts the step's tokens route to (the top_k router logits of each)."""
    logits = emb[tokens, s.H:]
    return len({int(e) for row in logits for e in np.argsort(-row, kind="stable")[:s.top_k]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", default="w4a16,mxfp4")
    ap.add_argument("--isas", default="avx512,avx2")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", default="1,2,4,8")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--engine-dir", help="keep the engines here and reuse them on later runs (A/B of two builds)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from read_bandwidth import read_bandwidth

    threads = [int(t) for t in args.threads.split(",")]
    if args.engine_dir:
        Path(args.engine_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        engines = {}
        for kernel in args.kernels.split(","):
            s = SHAPES[kernel]
            path = Path(args.engine_dir or tmp) / f"{kernel}-{args.layers}l.engine"
            emb, per_expert = make_engine(path, s, args.layers, np.random.default_rng(SEEDS[kernel]),
                                          reuse=args.engine_dir is not None)
            engines[kernel] = (s, emb, per_expert, _C.EngineFile(str(path)))
        cases = [(k, isa, t, int(m)) for k in engines for isa in args.isas.split(",") for t in threads
                 for m in args.tokens.split(",")]
        executors = {(k, isa, t): _C.Executor(engines[k][3], t, 16, 64, isa) for k, isa, t, _ in cases}
        times = {c: [] for c in cases}
        gbps = {c: [] for c in cases}
        best_cpu = {c: float("inf") for c in cases}  # CPU seconds of the process: time descheduled left out
        every = np.arange(V)
        for ex in executors.values():  # every token at once: the experts the rounds can reach, paged in
            ex.step(StepBatch(i32(every), i32(every), i32([0, V]), i32([V]), i32(np.full((1, V // 16), -1)),
                              i32([V - 1])))
        for r in range(args.repeats):
            for case in cases:
                kernel, isa, t, m = case
                s, emb, per_expert, _ = engines[kernel]
                tokens = (np.arange(m) * 7 + r * 13) % V  # other experts from step to step
                batch = StepBatch(i32(tokens), i32(np.arange(m)), i32([0, m]), i32([m]), i32(np.full((1, 1), -1)),
                                  i32([m - 1]))
                start, cpu = time.perf_counter(), time.process_time()
                executors[(kernel, isa, t)].step(batch)
                wall, cpu = (time.perf_counter() - start) / args.layers, (time.process_time() - cpu) / args.layers
                times[case].append(wall)
                gbps[case].append(routed_experts(emb, s, tokens) * per_expert / wall / 1e9)
                best_cpu[case] = min(best_cpu[case], cpu)
        read = {t: read_bandwidth(t)["read_GBps"] for t in threads}
    for kernel, (s, _, per_expert, _) in engines.items():
        print(f"{s.op} H {s.H} I {s.I} E {s.E} top-{s.top_k}: {per_expert / 1e6:.2f} MB per expert; "
              f"{args.layers} layers, {args.repeats} rounds")
        for case in (c for c in cases if c[0] == kernel):
            _, isa, t, m = case
            ms = [v * 1e3 for v in times[case]]
            print(f"  {isa:6s} threads {t} tokens {m}: {statistics.median(ms):7.3f} ms/layer median "
                  f"(best {min(ms):7.3f}, CPU {best_cpu[case] * 1e3:7.3f})  {statistics.median(gbps[case]):5.1f} GB/s "
                  f"of experts median (best {max(gbps[case]):5.1f}; plain read {read[t]} GB/s)")


if __name__ == "__main__":
    main()
