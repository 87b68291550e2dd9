"""linear_w8a8@1 (int8 x int8, SmoothQuant) through bessemer._C, against the NumPy
reference of quantization/primitives.py (quantize_int8_per_token, linear_w8a8_ref), on
both ISAs; plus the primitives and the vnni16 packing on their own."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from test_kernels import ISAS, emb_step, make_plan, run_flat, step  # noqa: E402
from test_quant_kernels import _load_err, entry, executor, f32_entry, write, zeros_entry  # noqa: E402

from bessemer.quantization import primitives as prim  # noqa: E402
from bessemer.format.layouts import pack_vnni16, unpack_vnni16  # noqa: E402

V = 50


def w8a8_plan(N, K, smooth, bias, x_col=3, y_col=2):
    ws = ["q", "s", "wsum"] + (["m"] if smooth else []) + (["b"] if bias else [])
    lin = step("linear_w8a8", [[0, x_col, K]], [[1, y_col, N]], ws, {"has_smooth": 1} if smooth else {})
    return make_plan([(K + x_col, "tokens"), (N + y_col + 3, "tokens")], [emb_step([0, x_col, K]), lin],
                     [1, y_col, N], N)


def w8a8_entries(q, ws, smooth=None, bias=None):
    ents = [entry("q", "int8", "vnni16", q.shape, pack_vnni16(q)), f32_entry("s", ws),
            entry("wsum", "int32", "row_major", (q.shape[0],), q.astype(np.int32).sum(axis=1, dtype=np.int32))]
    if smooth is not None:
        ents.append(f32_entry("m", smooth))
    if bias is not None:
        ents.append(f32_entry("b", bias))
    return ents


def run_w8a8(tmp_path, table, q, ws, tokens, isa, threads, smooth=None, bias=None):
    N, K = q.shape
    ents = [f32_entry("emb", table)] + w8a8_entries(q, ws, smooth, bias)
    path = write(tmp_path / "w8a8.engine", w8a8_plan(N, K, smooth is not None, bias is not None), ents)
    return run_flat(executor(path, isa, threads), tokens)


# ---------------------------------------------------------------- primitives and packing

def test_per_token_round_trip_and_sqnr():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    x[:, 7] *= 30  # an outlier channel
    q, scale = prim.quantize_int8_per_token(x)
    assert q.dtype == np.int8 and np.abs(q).max() == 127 and (np.abs(q).max(axis=1) == 127).all()
    err = np.abs(q.astype(np.float32) * scale[:, None] - x)
    assert (err <= scale[:, None] / 2 * (1 + 1e-5)).all()  # round to nearest
    assert prim.sqnr_db(x, prim.fake_quant_int8_per_token(x)) >= tol.SQNR_INT8_PER_TOKEN_DB
    z, zs = prim.quantize_int8_per_token(np.zeros((2, 5), np.float32))
    assert (z == 0).all() and (zs == 1).all()
    # the smoothing multiplier is applied before the range is taken
    m = np.full(256, 0.5, np.float32)
    qm, sm = prim.quantize_int8_per_token(x, m)
    np.testing.assert_array_equal(qm, q)
    np.testing.assert_allclose(sm, scale * 0.5, rtol=1e-6)


@pytest.mark.parametrize("n,k", [(16, 4), (40, 96), (33, 5), (1, 3), (17, 130)])
def test_vnni16_round_trip(n, k):
    q = np.random.default_rng(n + k).integers(-127, 128, (n, k)).astype(np.int8)
    packed = pack_vnni16(q)
    assert packed.size == -(-n // 16) * 16 * -(-k // 4) * 4
    np.testing.assert_array_equal(unpack_vnni16(packed, n, k), q)
    if n >= 16 and k >= 8:  # W[16p + j, 4g + i] at ((p*Kp/4 + g)*16 + j)*4 + i
        kp = -(-k // 4) * 4
        assert packed[((0 * kp // 4 + 1) * 16 + 3) * 4 + 2] == q[3, 6]


# ---------------------------------------------------------------- kernel vs reference

CASES = [  # M, N, K, smooth, bias, threads
    (1, 40, 96, False, False, 1), (1, 40, 96, True, True, 2), (3, 40, 96, False, True, 2),
    (9, 33, 5, True, False, 2), (17, 40, 96, False, False, 2), (130, 40, 98, True, True, 2),
    (8, 200, 1100, False, True, 2), (40, 100, 1030, True, False, 2), (130, 300, 64, False, False, 1),
    (9, 1, 3, False, True, 1), (64, 576, 576, True, False, 2), (2, 64, 1536, False, False, 2),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,smooth,bias,threads", CASES)
def test_linear_w8a8_matches_reference(tmp_path, isa, M, N, K, smooth, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K)
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    q, ws = prim.quantize_int8_per_channel(W)
    m = rng.uniform(0.25, 4.0, K).astype(np.float32) if smooth else None
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)  # token ids must be < the plan's vocab (N)
    out = run_w8a8(tmp_path, table, q, ws, tokens, isa, threads, m, b)
    ref, _ = prim.linear_w8a8_ref(table[tokens], q, ws, m, b)
    err = np.abs(out - ref).max()
    assert err <= tol.W8A8_LINEAR_RTOL * np.abs(ref).max() + tol.W8A8_LINEAR_ATOL, (err, np.abs(ref).max())


@pytest.mark.parametrize("isa", ISAS)
def test_int32_accumulation_is_exact(tmp_path, isa):
    """Integer activations and weights whose ranges are exactly 127 give unit scales, so the
    output is the int32 dot product itself (sums stay below 2^24: exact in fp32)."""
    rng = np.random.default_rng(5)
    M, N, K = 21, 50, 333
    table = rng.integers(-127, 128, (V, K)).astype(np.float32)
    table[:, 0] = 127
    q = rng.integers(-127, 128, (N, K)).astype(np.int8)
    q[:, 1] = -127
    ws = np.ones(N, np.float32)
    tokens = rng.integers(0, V, M)
    _, acc = prim.linear_w8a8_ref(table[tokens], q, ws)
    out = run_w8a8(tmp_path, table, q, ws, tokens, isa, 2)
    np.testing.assert_array_equal(out, acc.astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
def test_w8a8_sqnr_vs_fp32(tmp_path, isa):
    rng = np.random.default_rng(11)
    M, N, K = 17, 96, 512
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    q, ws = prim.quantize_int8_per_channel(W)
    tokens = rng.integers(0, V, M)
    out = run_w8a8(tmp_path, table, q, ws, tokens, isa, 2)
    assert prim.sqnr_db(table[tokens].astype(np.float64) @ W.T, out) >= tol.W8A8_MIN_SQNR_DB


def test_w8a8_errors(tmp_path):
    N, K = 40, 96
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    q = zeros_entry("q", "int8", "vnni16", (N, K))
    s = zeros_entry("s", "float32", "row_major", (N,))
    wsum = zeros_entry("wsum", "int32", "row_major", (N,))
    plan = w8a8_plan(N, K, False, False)
    _load_err(tmp_path, plan, [emb, zeros_entry("q", "int8", "panel16", (N, K)), s, wsum],
              "linear_w8a8@1: weight q: layout panel16 not supported")
    _load_err(tmp_path, plan, [emb, q, s, zeros_entry("wsum", "float32", "row_major", (N,))], "weight wsum: dtype float32")
    _load_err(tmp_path, w8a8_plan(N, K, True, False), [emb, q, s, wsum, zeros_entry("m", "float32", "row_major", (N,))],
              r"weight m: shape \[40\], expected \[96\]")
    no_m = w8a8_plan(N, K, False, False)
    no_m["steps"][1]["attrs"] = {"has_smooth": 1}  # says a multiplier follows, lists none
    _load_err(tmp_path, no_m, [emb, q, s, wsum], "expects 4-5 weights, got 3")
    bad = [emb, zeros_entry("q", "uint8", "row_major", (N * K,)), s, wsum]
    bad[1] = entry("q", "uint8", "vnni16", (N, K), np.zeros(48 * K, np.uint8))
    _load_err(tmp_path, plan, bad, "vnni16 layout needs dtype int8")
