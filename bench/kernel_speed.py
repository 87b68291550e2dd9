"""Micro-benchmark of linear@1 (bessemer._C) against torch.nn.functional.linear, and of the
quantized linears (linear_w8a16@1, linear_w4a16@1 as "int4", linear_w4a16@2 (bf16 activations) as
"int4@2" as the builder stores asymmetric codes (panel16_int4_k8 codes, bf16 scales/offsets) and
"int4@2p" with panel16_int4 codes and fp32 scales/offsets, linear_w4a16@3 as "int4@3" (symmetric:
panel16_int4_k8 codes and bf16 scales, no offsets, as the builder stores them),
linear_w8a8@1 as "w8a8", linear_w4a8@1 as "w4a8" (int4@3's weights, int8 activations per row
and group), linear_w4k@1 as "w4k" (two-level 4-bit, --quant w4k: uint8 sub-block scale and
minimum per 32 columns under fp16 ones per super-block)) against linear@1 with fp32 weights.

GEMV (M=1): GB/s of weights streamed (the weights of consecutive calls are distinct, so
they come from DRAM, not from cache), next to the copy bandwidth of numpy. For the
quantized kernels also the "fp32-equivalent" GB/s (N*K*4 bytes / time) and the speed-up
over fp32.
GEMM (M=512, 2048): GFLOP/s.

Each measurement runs an engine whose plan is one embedding followed by R linear steps
with distinct weight tensors; the time of a plan without the linear steps is subtracted.

    python bench/kernel_speed.py [--quick] [--isa auto|avx2|avx512] [--section all|linear|quant]
                                 [--kinds int4@3/32,w4a8/32] [--gemm-shapes smollm2|llama-1b] [--no-gemv]
A 4-bit kind may name its group size after a slash (int4@3/32); W4_GROUP otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bessemer import _C  # noqa: E402
from bessemer.targets.cpu.kernel_table import QUANT_KERNELS  # noqa: E402
from bessemer.format.container import TensorEntry, rewrite_header, write_rank_file  # noqa: E402
from bessemer.format.step import StepBatch  # noqa: E402
from bessemer.format.layouts import encode, pack_int4_codes, pack_panel16, pack_vnni16, packed_nbytes  # noqa: E402
from bessemer.quantization.formats import Int4Group, Int4SuperBlock, WeightCalibration  # noqa: E402
from bessemer.quantization.superblock import super_block_size  # noqa: E402
from bessemer.quantization.primitives import (  # noqa: E402
    int4_group_params,
    quantize_int4,
    quantize_int8_per_channel,
)
from bessemer.quantization.scale_search import int4_symmetric_scales, symmetric_codes  # noqa: E402

W4_GROUP = 64  # SmolLM2 K (576, 1536) are multiples of 64


def i32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def timeit(fn, min_time=0.4, min_iters=3):
    fn()
    n, t0 = 0, time.perf_counter()
    best = float("inf")
    while n < min_iters or time.perf_counter() - t0 < min_time:
        s = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - s)
        n += 1
    return best


def copy_bandwidth(nbytes=512 << 20):
    a = np.ones(nbytes // 4, np.float32)
    b = np.empty_like(a)
    t = timeit(lambda: np.copyto(b, a), min_time=1.0)
    return 2 * nbytes / t / 1e9  # read + write


def split_kind(kind: str) -> tuple[str, int]:
    """"w4a8/32" -> ("w4a8", 32); a kind without a group: W4_GROUP."""
    base, _, group = kind.partition("/")
    return base, int(group) if group else W4_GROUP


def int4_form(K, dtype):
    """(codes layout, scales/offsets dtype): int4@2 (asymmetric) and int4@3 (symmetric) as the
    builder stores them (the cpu lowering's choice for Int4Group), else panel16_int4 + fp32."""
    if dtype in ("int4@2", "int4@3"):
        fmt = Int4Group(W4_GROUP, zero_point=dtype == "int4@2")
        return QUANT_KERNELS[("linear", Int4Group)](fmt, (16, K)).layouts["codes"], fmt.param_dtype
    return "panel16_int4", "float32"


def weight_entries(name, w, dtype):
    """TensorEntries and weight names of one linear step; dtype float32/bfloat16/int8/int4."""
    N, K = w.shape
    dtype, group = split_kind(dtype)
    if dtype == "int8":
        q, sc = quantize_int8_per_channel(w)
        return [TensorEntry(name, "int8", "panel16", (N, K), lambda: pack_panel16(q)),
                TensorEntry(name + ".s", "float32", "row_major", (N,), lambda: sc)], [name, name + ".s"]
    if dtype == "w8a8":  # int8 x int8 (linear_w8a8@1)
        q, sc = quantize_int8_per_channel(w)
        ws = q.astype(np.int32).sum(axis=1, dtype=np.int32)
        return [TensorEntry(name, "int8", "vnni16", (N, K), lambda: pack_vnni16(q)),
                TensorEntry(name + ".s", "float32", "row_major", (N,), lambda: sc),
                TensorEntry(name + ".ws", "int32", "row_major", (N,), lambda: ws)], [name, name + ".s", name + ".ws"]
    if dtype == "w4k":  # two-level: the format's own parts in the layouts the cpu lowering picks
        fmt = Int4SuperBlock(super_block_size(K))
        q = fmt.quantize(w, WeightCalibration())
        layouts = QUANT_KERNELS[("linear", Int4SuperBlock)](fmt, (N, K)).layouts
        parts = fmt.parts((N, K))
        return [TensorEntry(name + p.suffix, p.dtype, layouts[p.role], p.shape,
                            lambda p=p: fmt.pack(p.role, q[p.role], layouts[p.role])) for p in parts], \
            [name + p.suffix for p in parts]
    if dtype in ("int4@3", "w4a8"):  # symmetric: codes and scales only (w4a8: the same parts)
        sc = int4_symmetric_scales(w, group)
        codes = symmetric_codes(w, sc, group)
        layout, pdt = int4_form(K, "int4@3")
        return [TensorEntry(name, "int4", layout, (N, K), lambda: pack_int4_codes(codes, layout)),
                TensorEntry(name + ".s", pdt, "panel16", sc.shape, lambda: encode(sc, pdt, "panel16"))], \
            [name, name + ".s"]
    if dtype.startswith("int4"):  # int4@2: the builder's codes layout (panel16_int4_k8); int4@2p: panel16_int4
        sc, off = int4_group_params(w, group, zero_point=True)
        codes = quantize_int4(w, sc, off, group)
        layout, pdt = int4_form(K, dtype)
        return [TensorEntry(name, "int4", layout, (N, K), lambda: pack_int4_codes(codes, layout)),
                TensorEntry(name + ".s", pdt, "panel16", sc.shape, lambda: encode(sc, pdt, "panel16")),
                TensorEntry(name + ".o", pdt, "panel16", off.shape, lambda: encode(off, pdt, "panel16"))], \
            [name, name + ".s", name + ".o"]
    return [TensorEntry(name, dtype, "panel16", (N, K), lambda: encode(w, dtype, "panel16"))], [name]


def weight_nbytes(N, K, dtype):
    dtype, group = split_kind(dtype)
    if dtype == "w4k":
        fmt = Int4SuperBlock(super_block_size(K))
        layouts = QUANT_KERNELS[("linear", Int4SuperBlock)](fmt, (N, K)).layouts
        return sum(packed_nbytes(p.shape, p.dtype, layouts[p.role]) for p in fmt.parts((N, K)))
    if dtype.startswith("int4"):
        layout, pdt = int4_form(K, dtype)
        params = 1 if dtype == "int4@3" else 2  # scales (and offsets)
        return packed_nbytes((N, K), "int4", layout) + params * packed_nbytes((N, K // group), pdt, "panel16")
    if dtype == "w4a8":
        layout, pdt = int4_form(K, "int4@3")
        params = 1
        return packed_nbytes((N, K), "int4", layout) + params * packed_nbytes((N, K // group), pdt, "panel16")
    if dtype == "int8":
        return packed_nbytes((N, K), "int8", "panel16") + 4 * N
    if dtype == "w8a8":
        return packed_nbytes((N, K), "int8", "vnni16") + 8 * N
    return packed_nbytes((N, K), dtype, "panel16")


def make_engine(dirpath: Path, M, N, K, dtype, R, rng):
    table = rng.standard_normal((64, K)).astype(np.float32)
    weights = [(rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32) for _ in range(min(R, 2))]
    op = {"int8": "linear_w8a16", "int4": "linear_w4a16", "int4@2": "linear_w4a16", "int4@2p": "linear_w4a16",
          "int4@3": "linear_w4a16", "w8a8": "linear_w8a8", "w4a8": "linear_w4a8", "w4k": "linear_w4k"}.get(
        split_kind(dtype)[0], "linear")
    base, group = split_kind(dtype)
    version = 3 if base == "int4@3" else 2 if base.startswith("int4@2") else 1
    attrs = {"group_size": group} if base.startswith("int4") or base == "w4a8" else {}
    if base == "w4k":
        attrs = {"super_block": super_block_size(K)}
    steps = [{"op": "embedding", "version": 1, "ins": [], "outs": [[0, 0, K]], "weights": ["emb"], "attrs": {}}]
    entries = [TensorEntry("emb", "float32", "row_major", table.shape, lambda: encode(table, "float32", "row_major"))]
    for r in range(R):
        ents, names = weight_entries(f"w{r}", weights[r % len(weights)], dtype)
        entries += ents
        steps.append({"op": op, "version": version, "ins": [[0, 0, K]], "outs": [[1, 0, N]], "weights": names,
                      "attrs": attrs})
    plan = {"buffers": [{"id": 0, "width": K, "rows": "tokens"}, {"id": 1, "width": N, "rows": "tokens"}],
            "steps": steps, "kv_cache": {"num_layers": 0, "num_kv_heads": 1, "head_dim": 1, "dtype": "float32"},
            "logits": [0, 0, K], "vocab_size": K}
    path = dirpath / f"lin_{M}_{N}_{K}_{dtype.replace('/', 'g')}_{R}.engine"
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, entries)
    return path, weights


def run_engine(path, M, threads, isa, with_linear=True):
    if not with_linear:  # the same file with only the embedding step
        path = rewrite_header(path, path.with_suffix(".base"),
                              lambda h: h["plan"].update(steps=h["plan"]["steps"][:1]))
    ex = _C.Executor(_C.EngineFile(str(path)), threads, 16, 1, isa)
    tok = i32(np.arange(M) % 64)
    batch = StepBatch.of(tok, np.zeros(M, np.int32), [0, M], [M], np.full((1, (M + 15) // 16), -1), [0])
    for _ in range(2):
        ex.step(batch)
    return ex, timeit(lambda: ex.step(batch))


def bench_bessemer(tmp, M, N, K, dtype, threads, isa, R, rng):
    path, weights = make_engine(tmp, M, N, K, dtype, R, rng)
    ex, t_all = run_engine(path, M, threads, isa)
    _, t_base = run_engine(path, M, threads, isa, with_linear=False)
    path.unlink()
    path.with_suffix(".base").unlink()
    return ex.isa, max(t_all - t_base, 1e-9) / R, weights


def bench_linear(tmp, M, N, K, dtype, threads, isa, R, rng):
    isa, t, weights = bench_bessemer(tmp, M, N, K, dtype, threads, isa, R, rng)
    # torch with the same number of distinct weight matrices cycling (same cache behaviour).
    torch.set_num_threads(threads)
    tw = [torch.from_numpy(np.ascontiguousarray(weights[r % len(weights)])).clone() for r in range(R)]
    if dtype == "bfloat16":
        tw = [w.to(torch.bfloat16) for w in tw]
    x = torch.randn(M, K, dtype=tw[0].dtype)

    def torch_run():
        for w in tw:
            torch.nn.functional.linear(x, w)

    with torch.no_grad():
        tt = timeit(torch_run) / R
    return isa, t, tt


SMOLLM2_SHAPES = [(1536, 576), (576, 1536), (49152, 576), (960, 576)]  # (N, K)
# a Llama-3.2-1B layer's linears (N, K): q+k+v, o, gate+up, down
LLAMA_1B_SHAPES = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)]


def bench_quant(tmp, args, rng):
    """fp32 vs int8 vs int4 (g64; @1 fp32 and @2 bf16 activations) weights: GEMV on SmolLM2 shapes, then GEMM."""
    kinds = args.kinds.split(",") if args.kinds else ["float32", "int8", "int4", "int4@2p", "int4@2", "int4@3", "w8a8",
                                                     "w4a8"]
    print("\nQuantized GEMV M=1 (weights from DRAM); f32-eq GB/s = N*K*4 bytes / time")
    gemv_shapes = (SMOLLM2_SHAPES if args.gemm_shapes == "smollm2" else LLAMA_1B_SHAPES) if args.gemv else []
    print(f"{'N':>6} {'K':>5} {'weights':>8} {'thr':>3} {'isa':>6} {'us':>8} {'GB/s':>6} {'f32-eq GB/s':>11} {'speed-up':>8}")
    for N, K in gemv_shapes:
        for threads in (1, 2):
            t32 = None
            for dtype in kinds:
                nbytes = weight_nbytes(N, K, dtype)
                R = max(2, int(np.ceil(160e6 / nbytes)))
                isa, t, _ = bench_bessemer(tmp, 1, N, K, dtype, threads, args.isa, R, rng)
                t32 = t if t32 is None else t32  # the first kind is the baseline
                print(f"{N:6d} {K:5d} {dtype:>8} {threads:3d} {isa:>6} {t * 1e6:8.1f} {nbytes / t / 1e9:6.1f}"
                      f" {N * K * 4 / t / 1e9:11.1f} {t32 / t:7.2f}x")
    print("\nQuantized GEMM")
    print(f"{'M':>5} {'N':>6} {'K':>5} {'weights':>8} {'thr':>3} {'isa':>6} {'GF/s':>7} {'ms':>8} {'t/t_f32':>8}")
    if args.gemm_shapes == "llama-1b":
        shapes = [(512, n, k) for n, k in LLAMA_1B_SHAPES]
    else:
        shapes = [(512, 1536, 576)] if args.quick else [(512, 1536, 576), (512, 576, 1536), (2048, 1536, 576)]
    for M, N, K in shapes:
        for threads in (1, 2):
            t32 = None
            for dtype in kinds:
                isa, t, _ = bench_bessemer(tmp, M, N, K, dtype, threads, args.isa, 2, rng)
                t32 = t if t32 is None else t32  # the first kind is the baseline
                fl = 2 * M * N * K
                print(f"{M:5d} {N:6d} {K:5d} {dtype:>8} {threads:3d} {isa:>6} {fl / t / 1e9:7.1f} {t * 1e3:8.2f}"
                      f" {t / t32:7.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default="auto")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--section", default="all", choices=["all", "linear", "quant"])
    ap.add_argument("--kinds", help="quantized kinds to compare, the first the baseline [default: all, fp32 first]")
    ap.add_argument("--gemm-shapes", default="smollm2", choices=["smollm2", "llama-1b"])
    ap.add_argument("--gemv", action=argparse.BooleanOptionalAction, default=True, help="run the GEMV table")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    bw = copy_bandwidth()
    print(f"numpy copy bandwidth (read+write): {bw:.1f} GB/s")
    print(f"cpu: {_C.cpu_features()}")
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as d:
        tmp = Path(d)
        if args.section in ("all", "quant"):
            bench_quant(tmp, args, rng)
        if args.section == "quant":
            return
        print("\nGEMV M=1 (weights from DRAM)")
        print(f"{'N':>6} {'K':>5} {'dtype':>9} {'thr':>3} {'isa':>6} {'bessemer GB/s':>14} {'us':>8} {'torch GB/s':>11} {'us':>8}")
        for N, K in [(1536, 576), (49152, 576)]:
            for dtype in ["float32", "bfloat16"]:
                esz = 4 if dtype == "float32" else 2
                nbytes = N * K * esz
                R = max(2, int(np.ceil(160e6 / nbytes)))
                for threads in (1, 2):
                    isa, t, tt = bench_linear(tmp, 1, N, K, dtype, threads, args.isa, R, rng)
                    print(f"{N:6d} {K:5d} {dtype:>9} {threads:3d} {isa:>6} {nbytes / t / 1e9:14.1f} {t * 1e6:8.1f}"
                          f" {nbytes / tt / 1e9:11.1f} {tt * 1e6:8.1f}")
        print("\nGEMM M=512")
        print(f"{'N':>6} {'K':>5} {'dtype':>9} {'thr':>3} {'isa':>6} {'bessemer GF/s':>14} {'ms':>8} {'torch GF/s':>11} {'ms':>8}")
        shapes = [(1536, 576)] if args.quick else [(1536, 576), (4096, 1024), (49152, 576)]
        for N, K in shapes:
            for dtype in ["float32", "bfloat16"]:
                for threads in (1, 2):
                    M = 512
                    R = 2 if N * K > 10e6 else 4
                    isa, t, tt = bench_linear(tmp, M, N, K, dtype, threads, args.isa, R, rng)
                    fl = 2 * M * N * K
                    print(f"{N:6d} {K:5d} {dtype:>9} {threads:3d} {isa:>6} {fl / t / 1e9:14.1f} {t * 1e3:8.2f}"
                          f" {fl / tt / 1e9:11.1f} {tt * 1e3:8.2f}")


if __name__ == "__main__":
    main()
