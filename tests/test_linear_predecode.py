"""Weights decoded once per row block (PanelPredecode, linear_driver.h): on AVX2 a row block
of several 6-row chunks reads each int4 / int8 / E4M3 weight panel from a per-thread fp32
buffer decoded once, where a GEMV and a lone chunk widen the codes in registers. The two
paths must give the same bits (the same values in the same FMA order), so every row of a
call of M rows is compared as raw bits with the same row computed alone (M = 1: the GEMV
path). M covers GEMV (1, 6), one row block of 2 and 3 chunks (7, 13), several row blocks
with a lone-chunk tail and, at 2 threads, rows split over threads (64, 130); the shapes
have K blocks of whole groups, a partial last panel, and a K block wider than the buffer
(group 1280: the registers path in a GEMM too). Each call is also checked against the
float64 reference of the dequantized weights, so that a kernel returning the same wrong
numbers for every M fails too.
linear_w4a16@2/@3 in groups of 32, 64 or 128 also read each group's activation sum from the
prepared block (made once per block, not per panel group and chunk): @2 on x gives the bits
of @1 (which sums in the microkernel) on x rounded to bf16.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from invariance import bits  # noqa: E402
from test_batch_invariance_kernels import linear_case  # noqa: E402
from test_kernels import assert_close, run_flat  # noqa: E402
from test_quant_kernels import executor, f32_entry, quant_plan, w4_entries, write  # noqa: E402

from bessemer.quantization.primitives import round_to_bf16  # noqa: E402

V = 40  # embedding rows: the activation rows of every call are drawn from them
SIZES = (1, 6, 7, 13, 64, 130)
# (N, K): one K block of 18 groups; 3 K blocks of 512 and a partial last panel (N % 16 = 8)
SHAPES = [(48, 576), (40, 1536)]
KINDS = ["w4a16@1", "w4a16@2", "w4a16@3", "w8a16", "fp8"]


def check_rows_alone(ex, ref, rt, what, threads, per_row=False):
    """Every row of each call of SIZES rows has the bits of the same row computed alone;
    per_row: the reference check is relative to each row's size (per-row activation scales)."""
    alone = bits(np.concatenate([run_flat(ex, [v]) for v in range(V)]))
    rng = np.random.default_rng(len(what))
    for m in SIZES:
        tokens = rng.integers(0, V, m)
        out = run_flat(ex, tokens)
        s = np.abs(ref[tokens]).max(axis=1, keepdims=True) + 1e-30 if per_row else 1.0
        assert_close(out / s, ref[tokens] / s, *rt, f"{what} M={m}")
        diff = np.flatnonzero((bits(out) != alone[tokens]).any(axis=1))
        assert diff.size == 0, f"{what} {threads} threads M={m}: rows {diff[:8]} differ from the row alone"


@pytest.mark.parametrize("kind", KINDS)
def test_rows_read_decoded_weights_bit_identical_to_gemv(tmp_path, kind):
    for N, K in SHAPES:
        rng = np.random.default_rng(N * K)
        table = rng.standard_normal((V, K)).astype(np.float32)
        W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
        ents, plan, ref, rt = linear_case(kind, W, table.astype(np.float64))
        path = write(tmp_path / f"{kind}-{N}x{K}.engine", plan, [f32_entry("emb", table)] + ents)
        for threads in (1, 2):
            check_rows_alone(executor(path, "avx2", threads), ref, rt, f"{kind} {N}x{K}", threads, kind == "fp8")


def test_k_block_wider_than_the_buffer(tmp_path):
    """Group 1280 makes K blocks of 1280 columns, wider than the decoded-panel buffer: the
    GEMM widens in registers there, and its rows are still the GEMV's bits."""
    N, K, G = 40, 2560, 1280
    rng = np.random.default_rng(7)
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    ents, Wd = w4_entries(W, G, True)
    path = write(tmp_path / "g1280.engine", quant_plan("w4", N, K, False, G), [f32_entry("emb", table)] + ents)
    ref = table.astype(np.float64) @ Wd.astype(np.float64).T
    for threads in (1, 2):
        check_rows_alone(executor(path, "avx2", threads), ref, (tol.W4_LINEAR_RTOL, tol.W4_LINEAR_ATOL),
                         f"w4a16@1 g{G}", threads)


@pytest.mark.parametrize("G", [32, 64, 128])
def test_group_sums_made_once_per_block_match_the_microkernels(tmp_path, G):
    N, K = 40, 1536
    rng = np.random.default_rng(G)
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    ents, _ = w4_entries(W, G, True)  # panel16_int4 codes, fp32 parameters: read by @1 and @2
    v2 = write(tmp_path / "v2.engine", quant_plan("w4", N, K, False, G, version=2), [f32_entry("emb", table)] + ents)
    v1 = write(tmp_path / "v1.engine", quant_plan("w4", N, K, False, G),
               [f32_entry("emb", round_to_bf16(table))] + ents)
    tokens = rng.integers(0, V, max(SIZES))
    for threads in (1, 2):
        for m in SIZES:
            a = run_flat(executor(v2, "avx2", threads), tokens[:m])
            b = run_flat(executor(v1, "avx2", threads), tokens[:m])
            assert np.array_equal(bits(a), bits(b)), f"g{G} {threads} threads M={m}: @2 on x vs @1 on bf16(x)"
