"""linear_fp8@1 (static activation scale) and @2 (dynamic per-token scales) run through
bessemer._C against quantization/fp8.py.

Single-op rank files as in test_quant_kernels.py (an f32 embedding feeds the activations,
then the fp8 linear); the reference is fp8.linear_fp8_reference in float64, the same math
(E4M3 values and their products are exact), so only the fp32 summation order differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from test_kernels import ISAS, assert_close, emb_step, make_plan, run_flat, step  # noqa: E402
from test_quant_kernels import entry, executor, f32_entry, write, zeros_entry  # noqa: E402

from bessemer import _C  # noqa: E402
from bessemer.format.layouts import pack_panel16  # noqa: E402
from bessemer.quantization import fp8  # noqa: E402
from bessemer.quantization.primitives import sqnr_db  # noqa: E402

V = 50  # embedding rows (activation rows are picked from them)


def fp8_plan(N, K, bias, x_col=3, y_col=2, version=1, act_group=0):
    ws = ["q", "s"] + (["xs"] if version == 1 else []) + (["b"] if bias else [])
    lin = step("linear_fp8", [[0, x_col, K]], [[1, y_col, N]], ws, {"act_group": act_group} if act_group else None,
               version=version)
    return make_plan([(K + x_col, "tokens"), (N + y_col + 3, "tokens")],
                     [emb_step([0, x_col, K]), lin], [1, y_col, N], N)


def fp8_entries(codes, scale, x_scale):
    """x_scale None: @2's entries (no input_scale)."""
    return [entry("q", "float8_e4m3", "panel16", codes.shape, pack_panel16(codes)), f32_entry("s", scale)] + \
        ([f32_entry("xs", np.array([x_scale], np.float32))] if x_scale is not None else [])


def run_fp8(tmp_path, W, table, tokens, isa, threads, bias=None, x_scale=None, version=1, act_group=0):
    N, K = W.shape
    codes, scale = fp8.quantize_fp8_per_channel(W)
    if x_scale is None and version == 1:
        x_scale = fp8.activation_scale(np.abs(table[tokens]).max())
    ents = [f32_entry("emb", table)] + fp8_entries(codes, scale, x_scale) + \
        ([f32_entry("b", bias)] if bias is not None else [])
    path = write(tmp_path / "fp8.engine", fp8_plan(N, K, bias is not None, version=version, act_group=act_group), ents)
    out = run_flat(executor(path, isa, threads), tokens)
    return out, fp8.linear_fp8_reference(table[tokens], codes, scale, x_scale, bias, act_group=act_group)


CASES = [  # M, N, K, bias, threads
    (1, 40, 96, False, 1), (1, 40, 96, True, 2), (3, 40, 97, True, 2), (5, 48, 64, False, 2),
    (17, 40, 96, False, 2), (130, 40, 96, True, 2), (8, 200, 1100, True, 2), (40, 100, 1031, False, 2),
    (2, 33, 5, True, 2), (130, 300, 64, False, 1), (9, 1, 3, True, 1), (1, 576, 1536, False, 2),
    (3, 64, 7000, True, 2),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,bias,threads", CASES)
def test_linear_fp8(tmp_path, isa, M, N, K, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K)
    table = rng.standard_normal((V, K)).astype(np.float32)
    table[:, rng.integers(0, K, 3)] *= 20.0  # outlier channels, as in LLM activations
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    # a scale below the calibrated one: some activations saturate at +-448
    out, ref = run_fp8(tmp_path, W, table, tokens, isa, threads, b,
                       x_scale=fp8.activation_scale(0.5 * np.abs(table[tokens]).max()))
    assert_close(out, ref, tol.FP8_LINEAR_RTOL, tol.FP8_LINEAR_ATOL, "linear_fp8")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,bias,threads", CASES)
def test_linear_fp8_dynamic(tmp_path, isa, M, N, K, bias, threads):
    """@2: each token's scale is its own max |x| / 448 (rows of very different magnitudes,
    and an all-zero row, whose scale is 1)."""
    rng = np.random.default_rng(M * 1000 + N + K + 1)
    table = rng.standard_normal((V, K)).astype(np.float32) * np.exp2(rng.integers(-12, 12, V))[:, None]
    table[:, rng.integers(0, K, 3)] *= 20.0
    table[0] = 0.0
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    tokens[0] = 0
    out, ref = run_fp8(tmp_path, W, table, tokens, isa, threads, b, version=2)
    # relative to each row's own magnitude: rows span 2^24
    rows = np.abs(ref).max(axis=1, keepdims=True) + (np.abs(b).max() if bias else 0) + 1e-30
    assert_close(out / rows, ref / rows, tol.FP8_LINEAR_RTOL, tol.FP8_LINEAR_ATOL, "linear_fp8@2")


def outlier_rows(rng, K):
    """(V, K) activations whose rows span 2^24 in magnitude, with one huge column per row (a
    token's massive activation) so that most groups sit far below the row's max, an all-zero
    row and a row with an all-zero group."""
    table = rng.standard_normal((V, K)).astype(np.float32) * np.exp2(rng.integers(-12, 12, V))[:, None]
    big = rng.integers(0, K, V)
    table[np.arange(V), big] *= np.exp2(rng.integers(4, 20, V)).astype(np.float32)
    table[0] = 0.0
    table[1, : min(K, 32)] = 0.0
    return table


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("group", [16, 32, 128])
@pytest.mark.parametrize("M,N,K,bias,threads", [c for i, c in enumerate(CASES) if i % 2 == 0] + [(4, 40, 576, True, 2)])
def test_linear_fp8_dynamic_groups(tmp_path, isa, group, M, N, K, bias, threads):
    """@2 with act_group: per-group power-of-two sub-scales (K blocks that do not start on a
    group boundary: K 1031 and 7000, ragged last groups: K 97, 576 with G 128)."""
    rng = np.random.default_rng(M * 1000 + N + K + group)
    table = outlier_rows(rng, K)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    tokens = rng.integers(0, min(V, N), M)
    tokens[0] = 0
    if M > 1 and N > 1:  # the row with an all-zero group
        tokens[1] = 1
    out, ref = run_fp8(tmp_path, W, table, tokens, isa, threads, b, version=2, act_group=group)
    rows = np.abs(ref).max(axis=1, keepdims=True) + (np.abs(b).max() if bias else 0) + 1e-30
    assert_close(out / rows, ref / rows, tol.FP8_LINEAR_RTOL, tol.FP8_LINEAR_ATOL, "linear_fp8@2 act_group")


@pytest.mark.parametrize("isa", ISAS)
def test_linear_fp8_groups_are_batch_invariant(tmp_path, isa):
    """A row's output is bit-identical alone and inside batches of any size (group exponents
    and scales are per row; K 1100 has two K blocks, the second starting inside a group)."""
    N, K, G = 200, 1100, 32
    rng = np.random.default_rng(3)
    table = outlier_rows(rng, K)
    codes, scale = fp8.quantize_fp8_per_channel((rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32))
    ents = [f32_entry("emb", table)] + fp8_entries(codes, scale, None)
    ex = executor(write(tmp_path / "inv.engine", fp8_plan(N, K, False, version=2, act_group=G), ents), isa, 2)
    tokens = rng.integers(0, V, 37)
    batch = run_flat(ex, tokens)
    for i in (0, 5, 36):
        np.testing.assert_array_equal(run_flat(ex, tokens[i:i + 1])[0], batch[i])
    np.testing.assert_array_equal(run_flat(ex, tokens[:7]), batch[:7])


def test_group_exponents_and_activations_are_exact(tmp_path):
    """One-hot weights expose the quantized activations of @2 with act_group 16: each equals
    quantize_activation_grouped * s_x, so the kernels' group exponents are the reference's
    integers (powers of two at the bounds: max|group| * 2^e == max|row| exactly)."""
    K, G = 48, 16
    rng = np.random.default_rng(5)
    table = rng.standard_normal((20, K)).astype(np.float32)
    table[:, 16:] *= 1e-3  # per token: E4M3 subnormals (x / s ~ 5e-4), per group: normals
    table[:, 0] = 1000.0  # row max in group 0
    table[0, 16:32] = 1000.0 / 8  # exactly 2^-3 of the row max: e = 3
    table[0, 32:] = np.float32(1000.0 / 8) * np.float32(1.0000001)  # just above: e = 2
    table[1, 16:] = 1e-30  # e capped at 64
    table[2] = 0.0
    R = K  # output n copies input column n
    codes = np.zeros((R, K), np.uint8)
    codes[np.arange(R), np.arange(R)] = 0x38
    ents = [f32_entry("emb", table)] + fp8_entries(codes, np.ones(R, np.float32), None)
    path = write(tmp_path / "eye.engine", fp8_plan(R, K, False, version=2, act_group=G), ents)
    e = fp8.group_exponents(table, G)
    assert e[0].tolist() == [0, 3, 2] and e[1, 1] == fp8.GROUP_EXP_MAX
    s = fp8.token_scales(table)
    want = fp8.quantize_activation_grouped(table, s, G) * s
    # grouped quantization is never worse than per token and much better on the small groups
    err_g = np.abs(want - table)[3:, 16:].max()
    err_t = np.abs(fp8.fake_quant_activation(table, s) - table)[3:, 16:].max()
    assert err_g < err_t / 4
    for isa in ISAS:
        out = run_flat(executor(path, isa, 1), np.arange(len(table)))
        np.testing.assert_array_equal(out[:, :K], want, err_msg=isa)


def test_activation_rounding_is_exact(tmp_path):
    """One-hot weights (code 0x38 = 1.0, scale 1) expose the kernel's quantized activations:
    every value, including subnormals, ties and saturated ones, equals round_to_e4m3."""
    K = 20  # vector body and a tail
    grid = fp8.decode_e4m3(np.arange(0x7F, dtype=np.uint8))
    mids = (grid[:-1] + grid[1:]) / 2  # ties: round to the even code
    vals = np.concatenate([grid, mids, -mids, [500.0, -1e6, 2.0 ** -10, 3 * 2.0 ** -11, 447.9]]).astype(np.float32)
    rng = np.random.default_rng(0)
    vals = np.concatenate([vals, rng.standard_normal(K * 8 - len(vals) % K).astype(np.float32) * 30])
    table = vals[: len(vals) // K * K].reshape(-1, K)
    R = len(table)  # output n copies input column n % K (N = R, so every row is a token)
    codes = np.zeros((R, K), np.uint8)
    codes[np.arange(R), np.arange(R) % K] = 0x38
    ents = [f32_entry("emb", table)] + fp8_entries(codes, np.ones(R, np.float32), 1.0)
    path = write(tmp_path / "eye.engine", fp8_plan(R, K, False), ents)
    for isa in ISAS:
        out = run_flat(executor(path, isa, 1), np.arange(R))
        np.testing.assert_array_equal(out[:, :K], fp8.round_to_e4m3(table), err_msg=isa)


def test_weight_decoding_is_exact(tmp_path):
    """Each of the 254 finite codes decodes to its value (identity activations)."""
    codes = np.arange(256, dtype=np.uint8)
    codes = codes[~np.isin(codes, fp8.NAN_CODES)].reshape(127, 2)  # N = 127 rows, K = 2
    table = np.eye(2, dtype=np.float32)
    ents = [f32_entry("emb", table)] + fp8_entries(codes, np.ones(127, np.float32), 1.0)
    path = write(tmp_path / "codes.engine", fp8_plan(127, 2, False), ents)
    for isa in ISAS:
        out = run_flat(executor(path, isa, 1), np.arange(2))
        np.testing.assert_array_equal(out, fp8.decode_e4m3(codes).T, err_msg=isa)


@pytest.mark.parametrize("isa", ISAS)
def test_fp8_sqnr_vs_fp32(tmp_path, isa):
    rng = np.random.default_rng(11)
    M, N, K = 17, 96, 512
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    tokens = rng.integers(0, V, M)
    out, _ = run_fp8(tmp_path, W, table, tokens, isa, 2)
    assert sqnr_db(table[tokens].astype(np.float64) @ W.astype(np.float64).T, out) >= tol.FP8_LAYER_MIN_SQNR_DB


def test_fp8_errors(tmp_path):
    N, K = 40, 96
    emb = f32_entry("emb", np.ones((V, K), np.float32))
    q = zeros_entry("q", "float8_e4m3", "panel16", (N, K))
    s = zeros_entry("s", "float32", "row_major", (N,))
    xs = f32_entry("xs", np.array([0.5], np.float32))

    def load_err(plan, ents, match):
        path = write(tmp_path / "err.engine", plan, ents)
        with pytest.raises(ValueError, match=match):
            _C.Executor(_C.EngineFile(str(path)), 1, 16, 1)

    plan = fp8_plan(N, K, False)
    load_err(plan, [emb, zeros_entry("q", "int8", "panel16", (N, K)), s, xs], "weight q: dtype int8 not supported")
    load_err(plan, [emb, zeros_entry("q", "float8_e4m3", "row_major", (N, K)), s, xs], "weight q: layout row_major")
    load_err(plan, [emb, q, zeros_entry("s", "float32", "row_major", (N + 1,)), xs], r"weight s: shape \[41\]")
    load_err(plan, [emb, q, s, f32_entry("xs", np.array([1.0, 2.0], np.float32))], r"weight xs: shape \[2\]")
    for bad in (0.0, -1.0, np.inf):
        load_err(plan, [emb, q, s, f32_entry("xs", np.array([bad], np.float32))], "input_scale must be a positive")
    load_err(fp8_plan(N, K, True), [emb, q, s, xs, zeros_entry("b", "float32", "row_major", (N - 1,))],
             "weight b: shape")
    # @2 (dynamic scales) reads no input_scale: the third weight is a bias of shape [N]
    load_err(fp8_plan(N, K, True, version=2), [emb, q, s, f32_entry("b", np.array([0.5], np.float32))],
             r"linear_fp8@2: weight b: shape \[1\], expected \[40\]")
    # act_group: dynamic scales only, and one of the supported widths
    load_err(fp8_plan(N, K, False, version=2, act_group=48), [emb, q, s], "act_group must be 16, 32, 64 or 128")
    load_err(fp8_plan(N, K, False, version=1, act_group=32), [emb, q, s, xs], "act_group must be .* on @1")
