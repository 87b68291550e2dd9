"""Batch invariance of the linear kernels themselves: a row's outputs are bit-identical as a
GEMV (M = 1), a small batch and a GEMM of 40 rows, on both ISAs, at K > 1024 (K blocks of
about 512: a later block resumes the partial sums the previous one left in y, linear_driver.h).
fp32/bf16 GEMVs, and int4 ones on bf16 activations (w4a16@2/@3 on a CPU with the bf16 kernel),
read K in one block where their GEMMs use several, so for them this checks that the K blocking
never changes a row's sum; the other quantized kernels keep the same blocks.

Each case is one single-op rank file as in test_quant_kernels.py / test_fp8_kernels.py; the
oracle is the same row inside the 40-row batch, tolerance zero. The batch itself is checked
against the float64 reference of the dequantized weights (so a kernel that returned the same
wrong numbers for every M fails too).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from test_fp8_kernels import fp8_entries, fp8_plan  # noqa: E402
from test_kernels import ISAS, assert_close, bf16_round, emb_step, make_plan, run_flat, step  # noqa: E402
from test_quant_kernels import entry, executor, f32_entry, quant_plan, w4_entries, w8_entries, write  # noqa: E402
from test_w8a8_kernel import w8a8_entries, w8a8_plan  # noqa: E402

from bessemer.format.layouts import encode  # noqa: E402
from bessemer.quantization import fp8  # noqa: E402
from bessemer.quantization import primitives as prim  # noqa: E402
from bessemer.quantization.primitives import round_to_bf16  # noqa: E402

V = 48  # embedding rows
SHAPES = [(576, 1536), (1536, 2112)]  # (N, K): SmolLM2's down_proj, a wider K of 5 blocks
BATCH = 40
SIZES = (1, 2, 7, 9)  # GEMV (M <= MR) and GEMM row counts of every MR (6 and 8)


def linear_case(kind, W, x):
    """(rank-file entries without the embedding, plan, float64 reference y [rows of x, N],
    (rtol, atol)) of a linear of kind `kind` with weights W [N, K], for activations x."""
    N, K = W.shape
    if kind in ("float32", "bfloat16"):
        lin = step("linear", [[0, 3, K]], [[1, 2, N]], ["w"])
        plan = make_plan([(K + 3, "tokens"), (N + 5, "tokens")], [emb_step([0, 3, K]), lin], [1, 2, N], N)
        ents = [entry("w", kind, "panel16", W.shape, encode(W, kind, "panel16"))]
        return ents, plan, x @ (bf16_round(W) if kind == "bfloat16" else W).astype(np.float64).T, \
            (tol.BF16_LINEAR_RTOL, tol.BF16_LINEAR_ATOL) if kind == "bfloat16" else \
            (tol.FP32_LINEAR_RTOL, tol.FP32_LINEAR_ATOL)
    if kind == "w8a16":
        ents, Wd = w8_entries(W)
        return ents, quant_plan("w8", N, K, False), x @ Wd.astype(np.float64).T, (tol.W8_LINEAR_RTOL,
                                                                                  tol.W8_LINEAR_ATOL)
    if kind.startswith("w4a16"):  # @1: fp32 params, x as is; @2: k8 codes, bf16 params, x rounded to bf16
        version = int(kind[-1])
        layout, params = ("panel16_int4", "float32") if version == 1 else ("panel16_int4_k8", "bfloat16")
        ents, Wd = w4_entries(W, 32, True, layout, params, version)
        xr = x if version == 1 else round_to_bf16(x.astype(np.float32)).astype(np.float64)
        rt = (tol.W4_LINEAR_RTOL, tol.W4_LINEAR_ATOL) if version == 1 else (tol.W4_BF16_RTOL, tol.W4_BF16_ATOL)
        return ents, quant_plan("w4", N, K, False, 32, version=version), xr @ Wd.astype(np.float64).T, rt
    if kind == "w8a8":  # dynamic per-token int8 activations, smoothing multiplier, bias
        q, ws = prim.quantize_int8_per_channel(W)
        smooth = np.linspace(0.5, 2.0, K, dtype=np.float32)
        bias = np.linspace(-1.0, 1.0, N, dtype=np.float32)
        ref, _ = prim.linear_w8a8_ref(x.astype(np.float32), q, ws, smooth, bias)
        return w8a8_entries(q, ws, smooth, bias), w8a8_plan(N, K, True, True), ref, \
            (tol.W8A8_LINEAR_RTOL, tol.W8A8_LINEAR_ATOL)
    assert kind == "fp8", kind  # @2: dynamic per-token activation scales
    codes, scale = fp8.quantize_fp8_per_channel(W)
    ref = fp8.linear_fp8_reference(x.astype(np.float32), codes, scale, None, None)
    return fp8_entries(codes, scale, None), fp8_plan(N, K, False, version=2), ref, \
        (tol.FP8_LINEAR_RTOL, tol.FP8_LINEAR_ATOL)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind", ["float32", "bfloat16", "w8a16", "w4a16@1", "w4a16@2", "w4a16@3", "fp8", "w8a8"])
def test_a_row_is_bit_identical_as_gemv_and_inside_a_gemm(tmp_path, kind, isa):
    for N, K in SHAPES:
        rng = np.random.default_rng(N + K)
        table = rng.standard_normal((V, K)).astype(np.float32)
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        ents, plan, ref_of, rt = linear_case(kind, W, table.astype(np.float64))
        ex = executor(write(tmp_path / f"{N}x{K}.engine", plan, [f32_entry("emb", table)] + ents), isa, 2)
        tokens = rng.integers(0, V, BATCH)
        batch = run_flat(ex, tokens)
        ref = ref_of[tokens]
        if kind in ("fp8", "w8a8"):  # per-row scales: compare each row relative to its own size
            rows = np.abs(ref).max(axis=1, keepdims=True) + 1e-30
            assert_close(batch / rows, ref / rows, *rt, f"{kind} {N}x{K}")
        else:
            assert_close(batch, ref, *rt, f"{kind} {N}x{K}")
        for m in SIZES:
            for start in (0, BATCH - m):
                np.testing.assert_array_equal(run_flat(ex, tokens[start:start + m]), batch[start:start + m],
                                              err_msg=f"{kind} {isa} {N}x{K}: rows {start}..{start + m - 1}")
        one = executor(tmp_path / f"{N}x{K}.engine", isa, 1)  # 1 thread: a GEMV over every panel group
        np.testing.assert_array_equal(run_flat(one, tokens[5:6]), batch[5:6], err_msg=f"{kind} {isa} 1 thread")
