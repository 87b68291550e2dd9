"""linear_w4a8@1 (4-bit codes x int8 activations per row and group) through bessemer._C,
against the NumPy reference of quantization/primitives.py (quantize_int8_per_group,
linear_w4a8_ref), on both ISAs (the AVX2 path runs when the test asks for isa avx2);
bit-identical output on both ISAs and for every row count."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from invariance import bits  # noqa: E402
from test_kernels import ISAS, emb_step, make_plan, run_flat, step  # noqa: E402
from test_quant_kernels import _load_err, entry, executor, f32_entry, write  # noqa: E402

from bessemer.format.layouts import encode, pack_int4_codes  # noqa: E402
from bessemer.quantization import primitives as prim  # noqa: E402
from bessemer.quantization.scale_search import int4_symmetric_scales, symmetric_codes  # noqa: E402

V = 50


def w4a8_plan(N, K, G, bias, x_col=3, y_col=2):
    ws = ["c", "s"] + (["b"] if bias else [])
    lin = step("linear_w4a8", [[0, x_col, K]], [[1, y_col, N]], ws, {"group_size": G})
    return make_plan([(K + x_col, "tokens"), (N + y_col + 3, "tokens")], [emb_step([0, x_col, K]), lin],
                     [1, y_col, N], N)


def w4a8_executor(tmp_path, table, codes, scales, G, isa, threads, bias=None, params="bfloat16"):
    N, K = codes.shape
    ents = [f32_entry("emb", table), entry("c", "int4", "panel16_int4_k8", codes.shape,
                                           pack_int4_codes(codes, "panel16_int4_k8")),
            entry("s", params, "panel16", scales.shape, encode(scales, params, "panel16"))]
    if bias is not None:
        ents.append(f32_entry("b", bias))
    path = write(tmp_path / f"w4a8_{isa}.engine", w4a8_plan(N, K, G, bias is not None), ents)
    return executor(path, isa, threads)


def run_w4a8(tmp_path, table, codes, scales, G, tokens, isa, threads, bias=None, params="bfloat16"):
    return run_flat(w4a8_executor(tmp_path, table, codes, scales, G, isa, threads, bias, params), tokens)


def symmetric_weights(rng, N, K, G):
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    s = int4_symmetric_scales(W, G)  # bf16 values
    return symmetric_codes(W, s, G), s


# ---------------------------------------------------------------- the activation quantization

def test_per_group_quantization_matches_per_token_of_each_group():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    x[:, 40] *= 50  # an outlier: it coarsens only its own group's steps
    x[3, 64:96] = 0  # an all-zero group: codes 0, scale 1
    q, s = prim.quantize_int8_per_group(x, 32)
    assert q.shape == (5, 96) and s.shape == (5, 3)
    for g in range(3):
        qg, sg = prim.quantize_int8_per_token(x[:, 32 * g:32 * g + 32])
        np.testing.assert_array_equal(q[:, 32 * g:32 * g + 32], qg)
        np.testing.assert_array_equal(s[:, g], sg)
    assert (q[3, 64:] == 0).all() and s[3, 2] == 1
    assert (np.abs(q.reshape(5, 3, 32)).max(axis=2)[s != 1] == 127).all()


# ---------------------------------------------------------------- kernel vs reference

CASES = [  # M, N, K, G, bias, threads
    (1, 40, 96, 32, False, 1), (1, 40, 96, 32, True, 2), (3, 40, 96, 32, True, 2), (7, 33, 64, 64, False, 2),
    (17, 40, 96, 32, False, 2), (130, 40, 128, 32, True, 2), (8, 200, 1152, 32, True, 2),
    (40, 100, 1024, 128, False, 2), (130, 300, 64, 32, False, 1), (9, 1, 8, 8, True, 1),
    (64, 576, 576, 32, False, 2), (2, 64, 1536, 32, False, 2), (300, 48, 96, 48, True, 2),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,G,bias,threads", CASES)
def test_linear_w4a8_matches_reference(tmp_path, isa, M, N, K, G, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K + G)
    table = rng.standard_normal((V, K)).astype(np.float32)
    table[:, 5] *= 20  # an outlier channel
    codes, s = symmetric_weights(rng, N, K, G)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    out = run_w4a8(tmp_path, table, codes, s, G, tokens, isa, threads, b)
    ref, _ = prim.linear_w4a8_ref(table[tokens], codes, s, G, b)
    err = np.abs(out - ref).max()
    assert err <= tol.W4A8_LINEAR_RTOL * np.abs(ref).max(), (err, np.abs(ref).max())
    # the layer itself: int4 weights and int8 activations against fp32 (catches a wrong
    # reference too: a swapped nibble or a lost -8 offset costs far more than this)
    W = prim.dequantize_int4(codes, s, (-8 * s).astype(np.float32), G)
    exact = table[tokens].astype(np.float64) @ W.T.astype(np.float64) + (b if bias else 0)
    assert prim.sqnr_db(exact, out) >= 30.0


@pytest.mark.parametrize("isa", ISAS)
def test_int32_dot_products_are_exact(tmp_path, isa):
    """Integer activations whose group maxima are 127 and unit weight scales make every
    scale 1: the output is the sum of the exact per-group integer dot products (< 2^24)."""
    rng = np.random.default_rng(5)
    M, N, K, G = 21, 50, 256, 32
    table = rng.integers(-127, 128, (V, K)).astype(np.float32)
    table[:, ::G] = 127
    codes = rng.integers(0, 16, (N, K)).astype(np.uint8)
    codes[:, 1] = 0  # the extreme codes: -8 and 7
    codes[:, 2] = 15
    s = np.ones((N, K // G), np.float32)
    tokens = rng.integers(0, V, M)
    _, acc = prim.linear_w4a8_ref(table[tokens], codes, s, G)
    out = run_w4a8(tmp_path, table, codes, s, G, tokens, isa, 2)
    np.testing.assert_array_equal(out, acc.sum(axis=2).astype(np.float32))


def test_isas_and_row_counts_agree_bitwise(tmp_path):
    """The same row gives the same bits on both ISAs, alone or among 130 rows, on 1 or 2
    threads: the integer sums are exact and the fp32 steps run in one order per row."""
    rng = np.random.default_rng(9)
    N, K, G = 200, 576, 32
    table = rng.standard_normal((V, K)).astype(np.float32)
    codes, s = symmetric_weights(rng, N, K, G)
    tokens = rng.integers(0, V, 130)
    outs = [run_w4a8(tmp_path, table, codes, s, G, tokens[:m], isa, t)
            for isa in ISAS for m, t in ((130, 2), (1, 1), (7, 2))]
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0][:len(o)])


@pytest.mark.parametrize("G", [32, 64, 128])
def test_rows_of_every_call_size_have_the_bits_of_the_row_alone(tmp_path, G):
    """AVX2: every row of a call of M rows, as raw bits, equals the same row computed alone
    (M = 1: the GEMV kernel), for M covering the 4-row kernel of groups of multiples of 32
    (4, 64, 130), its 1-3 row tails (5, 7, 13) and the GEMV path (1-3); each call is also held
    to the NumPy reference."""
    rng = np.random.default_rng(G)
    N, K = 40, 384  # a partial last panel; 12, 6 or 3 groups
    table = rng.standard_normal((V, K)).astype(np.float32)
    table[:, 7] *= 30  # an outlier column: one group's int8 steps coarsen
    codes, s = symmetric_weights(rng, N, K, G)
    b = rng.standard_normal(N).astype(np.float32)
    for threads in (1, 2):
        ex = w4a8_executor(tmp_path, table, codes, s, G, "avx2", threads, b)
        alone = np.concatenate([run_flat(ex, [v]) for v in range(N)])  # token ids < N (the plan's vocabulary)
        for m in (1, 2, 3, 4, 5, 7, 13, 64, 130):
            tokens = rng.integers(0, N, m)
            out = run_flat(ex, tokens)
            ref, _ = prim.linear_w4a8_ref(table[tokens], codes, s, G, b)
            assert np.abs(out - ref).max() <= tol.W4A8_LINEAR_RTOL * np.abs(ref).max(), (G, threads, m)
            diff = np.flatnonzero((bits(out) != bits(alone[tokens])).any(axis=1))
            assert diff.size == 0, f"G={G} {threads} threads M={m}: rows {diff[:8]} differ from the row alone"


def test_fp32_scales_are_read_too(tmp_path):
    rng = np.random.default_rng(3)
    N, K, G = 40, 96, 32
    table = rng.standard_normal((V, K)).astype(np.float32)
    codes, s = symmetric_weights(rng, N, K, G)
    s = (s * 1.001).astype(np.float32)  # not bf16 values
    tokens = rng.integers(0, N, 9)
    ref, _ = prim.linear_w4a8_ref(table[tokens], codes, s, G)
    for isa in ISAS:
        out = run_w4a8(tmp_path, table, codes, s, G, tokens, isa, 2, params="float32")
        assert np.abs(out - ref).max() <= tol.W4A8_LINEAR_RTOL * np.abs(ref).max()


def test_w4a8_errors(tmp_path):
    N, K = 32, 96
    codes = np.zeros((N, K), np.uint8)
    c = entry("c", "int4", "panel16_int4_k8", (N, K), pack_int4_codes(codes, "panel16_int4_k8"))
    ents = [f32_entry("emb", np.zeros((V, K), np.float32)), c,
            entry("s", "bfloat16", "panel16", (N, 3), encode(np.ones((N, 3), np.float32), "bfloat16", "panel16"))]
    _load_err(tmp_path, w4a8_plan(N, K, 20, False), ents, "group_size 20 must be a multiple of 8 that divides K = 96")
    _load_err(tmp_path, w4a8_plan(N, K, 40, False), ents, "group_size 40 must be a multiple of 8 that divides K")
    _load_err(tmp_path, w4a8_plan(N, K, 24, False), ents, r"weight s: shape \[32, 3\], expected \[32, 4\]")
