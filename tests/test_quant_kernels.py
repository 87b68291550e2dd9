"""Quantized linear kernels (linear_w8a16@1, linear_w4a16@1/@2/@3) run through bessemer._C.

Each test writes a single-op rank file (an f32 embedding feeds the activations, then the
quantized linear) with the reference packers of bessemer.quantization, and compares with
NumPy: x @ dequantized(w).T in float64 (tight: it is the same math), and the SQNR of the
quantized layer against the fp32 weights.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from test_kernels import ISAS, assert_close, edited, emb_step, make_plan, run_flat, step  # noqa: E402

from bessemer import _C  # noqa: E402
from bessemer.format.container import TensorEntry, write_rank_file  # noqa: E402
from bessemer.format.layouts import (  # noqa: E402
    encode,
    pack_int4_codes,
    pack_panel16,
    pack_panel16_int4_k8,
    packed_nbytes,
    unpack_panel16_int4_k8,
)
from bessemer.quantization.scale_search import (  # noqa: E402
    dequantize_symmetric,
    int4_symmetric_scales,
    symmetric_codes,
)
from bessemer.quantization.primitives import (  # noqa: E402
    dequantize_int4,
    dequantize_int8_per_channel,
    int4_group_params,
    quantize_int4,
    quantize_int8_per_channel,
    round_to_bf16,
    sqnr_db,
)

V = 50  # embedding rows (activation rows are picked from them)


# ---------------------------------------------------------------- helpers

def entry(name, dtype, layout, shape, data):
    data = np.ascontiguousarray(data)
    return TensorEntry(name, dtype, layout, tuple(shape), lambda d=data: d)


def zeros_entry(name, dtype, layout, shape):
    return entry(name, dtype, layout, shape, np.zeros(packed_nbytes(tuple(shape), dtype, layout), np.uint8))


def f32_entry(name, a, layout="row_major"):
    a = np.asarray(a, np.float32)
    return entry(name, "float32", layout, a.shape, pack_panel16(a) if layout == "panel16" else a.reshape(-1))


def w8_entries(W):
    q, s = quantize_int8_per_channel(W)
    ents = [entry("q", "int8", "panel16", q.shape, pack_panel16(q)), f32_entry("s", s)]
    return ents, dequantize_int8_per_channel(q, s)


def w4_symmetric_entries(W, G, layout, params):
    """linear_w4a16@3: symmetric codes and their (searched) scales only, w = s * (code - 8)."""
    s = int4_symmetric_scales(W, G)
    if params == "float32":  # full-precision values, as in w4_entries
        s = (s * (1 + 1e-3 * np.random.default_rng(0).random(s.shape, dtype=np.float32))).astype(np.float32)
    codes = symmetric_codes(W, s, G)
    ents = [entry("c", "int4", layout, codes.shape, pack_int4_codes(codes, layout)),
            entry("s", params, "panel16", s.shape, encode(s, params, "panel16"))]
    return ents, dequantize_symmetric(codes, s, G)


def w4_entries(W, G, zero_point, layout="panel16_int4", params="float32", version=1):
    """params: stored dtype of scales/offsets; fp32 ones are nudged off the bf16 values
    int4_group_params returns, so that fp32 storage is tested with full-precision values."""
    if version >= 3:
        return w4_symmetric_entries(W, G, layout, params)
    s, o = int4_group_params(W, G, zero_point)
    if params == "float32":
        nudge = 1 + 1e-3 * np.random.default_rng(0).random(s.shape, dtype=np.float32)
        s, o = (s * nudge).astype(np.float32), (o * nudge).astype(np.float32)
    codes = quantize_int4(W, s, o, G)
    ents = [entry("c", "int4", layout, codes.shape, pack_int4_codes(codes, layout)),
            entry("s", params, "panel16", s.shape, encode(s, params, "panel16")),
            entry("o", params, "panel16", o.shape, encode(o, params, "panel16"))]
    return ents, dequantize_int4(codes, s, o, G)


def quant_plan(kind, N, K, bias, G=None, x_col=3, y_col=2, version=1):
    """embedding -> quantized linear; x at column x_col of a wider buffer, y at y_col."""
    ws = ["q", "s"] if kind == "w8" else (["c", "s"] if version >= 3 else ["c", "s", "o"])
    if bias:
        ws.append("b")
    attrs = {} if kind == "w8" else {"group_size": G}
    op = "linear_w8a16" if kind == "w8" else "linear_w4a16"
    lin = step(op, [[0, x_col, K]], [[1, y_col, N]], ws, attrs, version)
    return make_plan([(K + x_col, "tokens"), (N + y_col + 3, "tokens")],
                     [emb_step([0, x_col, K]), lin], [1, y_col, N], N)


def write(path, plan, entries):
    header = {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}
    write_rank_file(path, header, entries)
    return path


def executor(path, isa, threads=2):
    return _C.Executor(_C.EngineFile(str(path)), threads, 16, 1, isa)


def run_quant(tmp_path, kind, W, table, tokens, isa, threads, bias=None, G=None, zero_point=True, version=1,
              layout="panel16_int4", params="float32"):
    N, K = W.shape
    ents, Wd = w8_entries(W) if kind == "w8" else w4_entries(W, G, zero_point, layout, params, version)
    ents = [f32_entry("emb", table)] + ents + ([f32_entry("b", bias)] if bias is not None else [])
    plan = quant_plan(kind, N, K, bias is not None, G, version=version)
    path = write(tmp_path / f"{kind}.engine", plan, ents)
    out = run_flat(executor(path, isa, threads), tokens)
    return out, Wd


# ---------------------------------------------------------------- correctness vs dequantized reference

W8_CASES = [  # M, N, K, bias, threads
    (1, 40, 96, False, 1), (1, 40, 96, True, 2), (3, 40, 96, True, 2), (17, 40, 96, False, 2),
    (130, 40, 96, True, 2), (8, 200, 1100, True, 2), (40, 100, 1030, False, 2), (2, 33, 5, True, 2),
    (130, 300, 64, False, 1), (9, 1, 3, True, 1),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,bias,threads", W8_CASES)
def test_linear_w8a16(tmp_path, isa, M, N, K, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K)
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    out, Wd = run_quant(tmp_path, "w8", W, table, tokens, isa, threads, b)
    ref = table[tokens].astype(np.float64) @ Wd.astype(np.float64).T + (b if bias else 0)
    assert_close(out, ref, tol.W8_LINEAR_RTOL, tol.W8_LINEAR_ATOL, "linear_w8a16")


W4_CASES = [  # M, N, K, G, bias, zero_point, threads
    (1, 40, 96, 32, False, True, 1), (1, 40, 96, 96, True, False, 2), (3, 40, 96, 32, True, False, 2),
    (3, 40, 96, 96, False, True, 2), (17, 40, 96, 32, True, True, 2), (17, 40, 96, 96, False, False, 1),
    (130, 40, 96, 32, False, False, 2), (130, 40, 96, 96, True, True, 2),
    (8, 200, 1536, 64, True, True, 2), (40, 100, 1280, 128, False, False, 2),
    (2, 33, 40, 40, True, True, 2), (9, 1, 3, 3, False, True, 1), (130, 300, 64, 16, True, True, 1),
]


W4_FORMS = [(1, "panel16_int4", "float32"), (2, "panel16_int4", "float32"), (2, "panel16_int4_k8", "float32"),
            (2, "panel16_int4_k8", "bfloat16"),  # (version, codes layout, params dtype): the builder's asymmetric
            (3, "panel16_int4", "float32"), (3, "panel16_int4_k8", "bfloat16")]  # @3: symmetric, no offsets


@pytest.mark.parametrize("version,layout,params", W4_FORMS)
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,G,bias,zero_point,threads", W4_CASES)
def test_linear_w4a16(tmp_path, version, layout, params, isa, M, N, K, G, bias, zero_point, threads):
    """@1: fp32 activations; @2: activations rounded to bf16 (nearest even), then the same
    math (AVX-512 BF16 dot products where the CPU has them, else the @1 kernels on bf16(x));
    @3: @2 on symmetric codes with scales only (zero_point does not apply);
    @2 with panel16_int4_k8 codes: the shift decode, or (avx2) the codes re-laid at load;
    bf16 scales/offsets: read as bf16, or (avx2) widened to fp32 at load."""
    if layout == "panel16_int4_k8" and K % 8:
        pytest.skip("panel16_int4_k8 needs K a multiple of 8")
    if version == 3 and zero_point:
        pytest.skip("@3 has no offsets: zero_point does not apply")
    rng = np.random.default_rng(M * 1000 + N + K + G)
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    out, Wd = run_quant(tmp_path, "w4", W, table, tokens, isa, threads, b, G, zero_point, version, layout, params)
    x = table[tokens] if version == 1 else round_to_bf16(table[tokens])
    ref = x.astype(np.float64) @ Wd.astype(np.float64).T + (b if bias else 0)
    rtol, atol = (tol.W4_LINEAR_RTOL, tol.W4_LINEAR_ATOL) if version == 1 else (tol.W4_BF16_RTOL, tol.W4_BF16_ATOL)
    assert_close(out, ref, rtol, atol, f"linear_w4a16@{version}")


@pytest.mark.parametrize("version,layout", [(1, "panel16_int4"), (2, "panel16_int4"), (2, "panel16_int4_k8")])
def test_int4_layout_lanes(tmp_path, version, layout):
    """Each code lands on its own row and k (one-hot weights; exact in bf16 too)."""
    N, K = 16, 16
    codes = np.zeros((N, K), np.uint8)
    for n in range(N):
        codes[n, (3 * n) % K] = n % 15 + 1
    s, o = np.ones((N, 1), np.float32), np.zeros((N, 1), np.float32)
    table = np.eye(K, dtype=np.float32)
    ents = [f32_entry("emb", table), entry("c", "int4", layout, (N, K), pack_int4_codes(codes, layout)),
            entry("s", "float32", "panel16", s.shape, encode(s, "float32", "panel16")),
            entry("o", "float32", "panel16", o.shape, encode(o, "float32", "panel16"))]
    path = write(tmp_path / "lanes.engine", quant_plan("w4", N, K, False, K, 0, 0, version), ents)
    for isa in ISAS:
        out = run_flat(executor(path, isa, 1), np.arange(K))
        np.testing.assert_array_equal(out, codes.T.astype(np.float32))


def test_panel16_int4_k8_packing():
    """Round trip, and the property the kernel decodes by: 16-bit word 2r + e of block b holds
    row r at k = 8b + 2j + e in nibble j."""
    rng = np.random.default_rng(5)
    for n, k in [(16, 8), (20, 64), (33, 96)]:
        codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
        packed = pack_panel16_int4_k8(codes)
        assert packed.size == packed_nbytes((n, k), "int4", "panel16_int4_k8")
        np.testing.assert_array_equal(unpack_panel16_int4_k8(packed, n, k), codes)
    words = pack_panel16_int4_k8(codes[:16, :16]).view("<u2").reshape(2, 32)  # [b, word]
    for b in range(2):
        for r in range(16):
            for e in range(2):
                for j in range(4):
                    assert (words[b, 2 * r + e] >> (4 * j)) & 15 == codes[r, 8 * b + 2 * j + e]
    with pytest.raises(ValueError, match="multiple of 8"):
        pack_panel16_int4_k8(codes[:, :12])


# ---------------------------------------------------------------- quantization quality

@pytest.mark.parametrize("isa", ISAS)
def test_sqnr_vs_fp32(tmp_path, isa):
    rng = np.random.default_rng(11)
    M, N, K = 17, 96, 512
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    tokens = rng.integers(0, V, M)
    ref = table[tokens].astype(np.float64) @ W.astype(np.float64).T
    out8, _ = run_quant(tmp_path, "w8", W, table, tokens, isa, 2)
    assert sqnr_db(ref, out8) >= tol.W8_PER_CHANNEL_MIN_SQNR_DB
    for zp in (True, False):
        out4, _ = run_quant(tmp_path, "w4", W, table, tokens, isa, 2, G=64, zero_point=zp)
        assert sqnr_db(ref, out4) >= tol.W4_G64_MIN_SQNR_DB, zp
    out4, _ = run_quant(tmp_path, "w4", W, table, tokens, isa, 2, G=64, version=3, layout="panel16_int4_k8",
                        params="bfloat16")
    assert sqnr_db(ref, out4) >= tol.W4_G64_MIN_SQNR_DB, "symmetric @3"


def test_w4_symmetric_errors(tmp_path):
    """@3 reads codes and scales only: an offsets tensor in its place is a bias of the wrong shape."""
    N, K, G = 40, 96, 32
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    c = zeros_entry("c", "int4", "panel16_int4_k8", (N, K))
    s = zeros_entry("s", "bfloat16", "panel16", (N, K // G))
    o = zeros_entry("o", "bfloat16", "panel16", (N, K // G))
    plan = quant_plan("w4", N, K, False, G, version=3)
    plan["steps"][1]["weights"] = ["c", "s", "o", "o"]
    _load_err(tmp_path, plan, [emb, c, s, o], "linear_w4a16@3")
    offsets_as_bias = zeros_entry("b", "bfloat16", "panel16", (N, K // G))
    _load_err(tmp_path, quant_plan("w4", N, K, True, G, version=3), [emb, c, s, offsets_as_bias], "weight b: dtype bfloat16")
    path = write(tmp_path / "t.engine", quant_plan("w4", N, K, False, G, version=3), [emb, c, s])
    _C.Executor(_C.EngineFile(str(path)), 1, 16, 1)  # loads


# ---------------------------------------------------------------- errors

def _load_err(tmp_path, plan, ents, match):
    path = write(tmp_path / "err.engine", plan, ents)
    with pytest.raises(ValueError, match=match):
        _C.Executor(_C.EngineFile(str(path)), 1, 16, 1)


def test_w8_errors(tmp_path):
    N, K = 40, 96
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    q = zeros_entry("q", "int8", "panel16", (N, K))
    s = zeros_entry("s", "float32", "row_major", (N,))
    plan = quant_plan("w8", N, K, False)
    _load_err(tmp_path, plan, [emb, q, zeros_entry("s", "float32", "row_major", (N + 1,))],
              r"linear_w8a16@1: weight s: shape \[41\], expected \[40\]")
    _load_err(tmp_path, plan, [emb, q, zeros_entry("s", "float32", "panel16", (N, 1))], "weight s: layout")
    _load_err(tmp_path, plan, [emb, zeros_entry("q", "uint8", "panel16", (N, K)), s], "weight q: dtype uint8")
    _load_err(tmp_path, plan, [emb, zeros_entry("q", "int8", "row_major", (N, K)), s], "weight q: layout row_major")
    _load_err(tmp_path, plan, [emb, zeros_entry("q", "int8", "panel16", (N, K + 16)), s], r"weight q: shape")
    _load_err(tmp_path, quant_plan("w8", N, K, True),
              [emb, q, s, zeros_entry("b", "float32", "row_major", (N - 1,))], "weight b: shape")
    # int8 weights are not accepted by the fp32 linear
    lin = make_plan([(K, "tokens"), (N, "tokens")], [emb_step([0, 0, K]), step("linear", [[0, 0, K]], [[1, 0, N]], ["q"])],
                    [1, 0, N], N)
    _load_err(tmp_path, lin, [emb, q], "weight q: dtype int8 not supported")


def test_w4_errors(tmp_path):
    N, K, G = 40, 96, 32
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    c = zeros_entry("c", "int4", "panel16_int4", (N, K))
    s = zeros_entry("s", "float32", "panel16", (N, K // G))
    o = zeros_entry("o", "float32", "panel16", (N, K // G))
    plan = quant_plan("w4", N, K, False, G)
    _load_err(tmp_path, plan, [emb, c, zeros_entry("s", "float32", "panel16", (N, K // G + 1)), o],
              r"weight s: shape \[40, 4\], expected \[40, 3\]")
    _load_err(tmp_path, plan, [emb, c, s, zeros_entry("o", "float32", "row_major", (N, K // G))],
              "weight o: layout row_major")
    _load_err(tmp_path, plan, [emb, zeros_entry("c", "int8", "panel16", (N, K)), s, o], "weight c: dtype int8")
    for g, match in [(40, "group_size 40 must be > 0 and divide K = 96"),
                     (24, "group_size 24 must be a multiple of 16 or equal K = 96"),
                     (0, "group_size 0"), (192, "group_size 192"), (32.5, "group_size' must be an integer")]:
        ents = [emb, c, zeros_entry("s", "float32", "panel16", (N, 3)), zeros_entry("o", "float32", "panel16", (N, 3))]
        _load_err(tmp_path, quant_plan("w4", N, K, False, g), ents, match)
    no_g = quant_plan("w4", N, K, False, G)
    no_g["steps"][1]["attrs"] = {}
    _load_err(tmp_path, no_g, [emb, c, s, o], "missing attr 'group_size'")
    _load_err(tmp_path, quant_plan("w4", N, K, True, G),
              [emb, c, s, o, zeros_entry("b", "float32", "panel16", (N, 1))], "weight b: layout panel16")


def test_panel16_int4_tensor_checks(tmp_path):
    N, K = 40, 96
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    c = zeros_entry("c", "int4", "panel16_int4", (N, K))
    s = zeros_entry("s", "float32", "panel16", (N, 3))
    path = write(tmp_path / "t.engine", quant_plan("w4", N, K, False, 32), [emb, c, s, zeros_entry("o", "float32", "panel16", (N, 3))])
    _C.Executor(_C.EngineFile(str(path)), 1, 16, 1)  # loads
    assert json.loads(_C.EngineFile(str(path)).header)["tensors"][1]["nbytes"] == 48 * K // 2
    for key, val, match in [("nbytes", 48 * K, "tensor c: nbytes"), ("dtype", 3, "panel16_int4 layout needs dtype int4"),
                            ("shape", [N * K], "panel16_int4 layout needs a 2-D shape"), ("layout", 250, "unknown layout id 250")]:
        bad = edited(path, lambda h: h["tensors"][1].update({key: val}))
        with pytest.raises(ValueError, match=match):
            _C.Executor(_C.EngineFile(str(bad)), 1, 16, 1)


def test_panel16_int4_k8_checks(tmp_path):
    """k8 codes: K a multiple of 8 (tensor check); only linear_w4a16@2 reads them."""
    N, K, G = 40, 96, 32
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    c = zeros_entry("c", "int4", "panel16_int4_k8", (N, K))
    s, o = (zeros_entry(n, "float32", "panel16", (N, K // G)) for n in "so")
    _load_err(tmp_path, quant_plan("w4", N, K, False, G, version=1), [emb, c, s, o], "weight c: layout panel16_int4_k8")
    sb, ob = (zeros_entry(n, "bfloat16", "panel16", (N, K // G)) for n in "so")
    _load_err(tmp_path, quant_plan("w4", N, K, False, G, version=1), [emb, zeros_entry("c", "int4", "panel16_int4", (N, K)), sb, ob],
              "weight s: dtype bfloat16")
    _load_err(tmp_path, quant_plan("w4", N, K, False, G, version=2), [emb, c, sb, o],
              "scales and offsets must have the same dtype")
    path = write(tmp_path / "t.engine", quant_plan("w4", N, K, False, G, version=2), [emb, c, s, o])
    _C.Executor(_C.EngineFile(str(path)), 1, 16, 1)  # loads
    bad = edited(path, lambda h: h["tensors"][1].update(shape=[N * 2, K // 2 - 4],  # same bytes, K = 44
                                                          nbytes=48 * 2 * (K // 2 - 4) // 2))
    with pytest.raises(ValueError, match="panel16_int4_k8 layout needs K a multiple of 8"):
        _C.Executor(_C.EngineFile(str(bad)), 1, 16, 1)


# ---------------------------------------------------------------- int8 table shared by embedding and lm_head

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("Vt,H,T,threads", [(50, 96, 7, 1), (37, 40, 300, 2), (16, 24, 3, 2)])
def test_embedding_w8a16_tied_table(tmp_path, isa, Vt, H, T, threads):
    """embedding_w8a16 gathers dequantized rows of the int8 panel16 table that
    linear_w8a16 reads as lm_head (one stored table, as in a tied quantized engine):
    rows bit-identical to dequantize_int8_per_channel, logits as x @ dequantized.T."""
    rng = np.random.default_rng(Vt * 100 + H + T)
    W = rng.standard_normal((Vt, H)).astype(np.float32)
    ents, Wd = w8_entries(W)  # "q", "s"
    emb = step("embedding_w8a16", outs=[[0, 1, H]], weights=["q", "s"])
    lin = step("linear_w8a16", [[0, 1, H]], [[1, 0, Vt]], ["q", "s"])
    plan = make_plan([(H + 2, "tokens"), (Vt, "tokens")], [emb, lin], [1, 0, Vt], Vt)
    path = write(tmp_path / "tied.engine", plan, ents)
    tokens = rng.integers(0, Vt, T)
    out = run_flat(executor(path, isa, threads), tokens)
    ref = Wd[tokens].astype(np.float64) @ Wd.astype(np.float64).T
    assert_close(out, ref, tol.W8_LINEAR_RTOL, tol.W8_LINEAR_ATOL, "embedding_w8a16 -> linear_w8a16")
    # the gathered rows themselves, as the logits of a plan of the embedding alone (H >= Vt)
    plan_rows = make_plan([(H + 2, "tokens")], [emb], [0, 1, H], H)
    rows = run_flat(executor(write(tmp_path / "rows.engine", plan_rows, ents), isa, threads), tokens)
    np.testing.assert_array_equal(rows, Wd[tokens])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("Vt,H,G,T,threads", [(50, 96, 32, 7, 1), (37, 64, 64, 300, 2), (16, 32, 16, 3, 2)])
def test_embedding_w4a16_tied_table(tmp_path, isa, Vt, H, G, T, threads):
    """embedding_w4a16 gathers dequantized rows of the symmetric int4 table (panel16_int4_k8
    codes, bf16 panel16 scales) that linear_w4a16@3 reads as lm_head (--lm-head int4, one
    stored table): rows bit-identical to dequantize_symmetric (each element one exact
    product), logits as x @ dequantized.T; batch sizes 3..300 give the same rows."""
    rng = np.random.default_rng(Vt * 100 + H + T)
    W = rng.standard_normal((Vt, H)).astype(np.float32)
    ents, Wd = w4_symmetric_entries(W, G, "panel16_int4_k8", "bfloat16")  # "c", "s"
    emb = step("embedding_w4a16", outs=[[0, 1, H]], weights=["c", "s"], attrs={"group_size": G})
    lin = step("linear_w4a16", [[0, 1, H]], [[1, 0, Vt]], ["c", "s"], {"group_size": G}, 3)
    plan = make_plan([(H + 2, "tokens"), (Vt, "tokens")], [emb, lin], [1, 0, Vt], Vt)
    path = write(tmp_path / "tied.engine", plan, ents)
    tokens = rng.integers(0, Vt, T)
    out = run_flat(executor(path, isa, threads), tokens)
    # linear_w4a16@3 rounds its activations to bf16 (as test_linear_w4a16 checks)
    ref = round_to_bf16(Wd[tokens]).astype(np.float64) @ Wd.astype(np.float64).T
    assert_close(out, ref, tol.W4_BF16_RTOL, tol.W4_BF16_ATOL, "embedding_w4a16 -> linear_w4a16@3")
    plan_rows = make_plan([(H + 2, "tokens")], [emb], [0, 1, H], H)
    rows = run_flat(executor(write(tmp_path / "rows.engine", plan_rows, ents), isa, threads), tokens)
    np.testing.assert_array_equal(rows, Wd[tokens])


def test_embedding_w4a16_errors(tmp_path):
    H, G = 96, 32
    c = zeros_entry("c", "int4", "panel16_int4_k8", (V, H))
    emb = step("embedding_w4a16", outs=[[0, 0, H]], weights=["c", "s"], attrs={"group_size": G})
    plan = make_plan([(H, "tokens")], [emb], [0, 0, H], H)
    _load_err(tmp_path, plan, [c, zeros_entry("s", "bfloat16", "panel16", (V, H // G + 1))],
              r"embedding_w4a16@1: weight s: shape \[50, 4\], expected \[50, 3\]")
    _load_err(tmp_path, plan, [zeros_entry("c", "int4", "panel16_int4", (V, H)),
                               zeros_entry("s", "bfloat16", "panel16", (V, H // G))], "weight c: layout")
    bad_g = make_plan([(H, "tokens")], [step("embedding_w4a16", outs=[[0, 0, H]], weights=["c", "s"],
                                             attrs={"group_size": 40})], [0, 0, H], H)
    _load_err(tmp_path, bad_g, [c, zeros_entry("s", "bfloat16", "panel16", (V, 2))], "group_size 40 must be > 0 and divide H = 96")


def test_embedding_w8a16_errors(tmp_path):
    H = 96
    q = zeros_entry("q", "int8", "panel16", (V, H))
    emb = step("embedding_w8a16", outs=[[0, 0, H]], weights=["q", "s"])
    plan = make_plan([(H, "tokens")], [emb], [0, 0, H], H)
    _load_err(tmp_path, plan, [q, zeros_entry("s", "float32", "row_major", (V + 1,))],
              r"embedding_w8a16@1: weight s: shape \[51\], expected \[50\]")
    _load_err(tmp_path, plan, [zeros_entry("q", "float32", "panel16", (V, H)), zeros_entry("s", "float32", "row_major", (V,))],
              "weight q: dtype float32 not supported")
    _load_err(tmp_path, make_plan([(H, "tokens")], [step("embedding_w8a16", outs=[[0, 0, H]], weights=["q"])],
                                  [0, 0, H], H), [q], "expects 2 weights, got 1")
