"""The two-level 4-bit format (--quant w4k, quantization/superblock.py, linear_w4k@1).

The format against its NumPy statement (stored parts -> dequantize), the kernel against
bf16(x) @ dequantized(w).T in float64 on both ISA paths (AVX512_BF16 reading the stored
parameters, the AVX2 fallback on parameters made at load), the grid against the
one-level w4a16 g32 grids it is meant to beat, and the K cuts of tensor parallelism.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from test_kernels import ISAS, assert_close, emb_step, make_plan, run_flat, step  # noqa: E402
from test_quant_kernels import V, entry, executor, f32_entry, write  # noqa: E402

from bessemer.errors import InvalidOptionError  # noqa: E402
from bessemer.quantization import superblock as sb  # noqa: E402
from bessemer.quantization.config import QuantConfig  # noqa: E402
from bessemer.quantization.formats import (Int4Group, Int4SuperBlock, WeightCalibration,  # noqa: E402
                                           weight_format)
from bessemer.quantization.primitives import round_to_bf16, sqnr_db  # noqa: E402


def _weights(rng, n, k):
    return (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)


def test_super_block_is_the_largest_multiple_of_32_dividing_k():
    assert [sb.super_block_size(k) for k in (256, 576, 1536, 96, 4096, 40)] == [256, 192, 256, 96, 256, None]
    assert weight_format(QuantConfig("w4k"), 576) == Int4SuperBlock(192)
    with pytest.raises(InvalidOptionError, match="multiple of 32.*use --quant w4a16"):
        weight_format(QuantConfig("w4k"), 40)


def test_stored_parts_dequantize_to_the_formula_and_sit_on_their_grid():
    """dequantize == (d * sc) * code - dmin * m written out per element; the sub-codes fit a
    byte, the super values are fp16 values, every sub-block's minimum is <= 0."""
    rng = np.random.default_rng(1)
    w = _weights(rng, 24, 384)
    fmt = Int4SuperBlock(sb.super_block_size(384))
    q = fmt.quantize(w, WeightCalibration())
    assert q["codes"].shape == (24, 384) and q["codes"].max() <= 15
    assert q["scales"].dtype == np.uint8 and q["scales"].shape == (24, 12) and q["super_scales"].shape == (24, 2)
    for part in ("super_scales", "super_offsets"):
        np.testing.assert_array_equal(q[part].astype(np.float16).astype(np.float32), q[part])
    n, k = np.indices(w.shape)
    d, dmin = q["super_scales"][n, k // 192], q["super_offsets"][n, k // 192]
    sc, m = q["scales"][n, k // 32].astype(np.float32), q["offsets"][n, k // 32].astype(np.float32)
    expected = (d * sc).astype(np.float32) * q["codes"] - (dmin * m).astype(np.float32)
    np.testing.assert_allclose(fmt.dequantize(q), expected, rtol=1e-6, atol=1e-7)
    assert sqnr_db(w, fmt.dequantize(q)) > tol.W4K_GAUSSIAN_MIN_SQNR_DB


def test_more_accurate_than_the_one_level_g32_grids():
    """Per weight, the two-level grid (4.625 bits) beats both w4a16 g32 grids (4.5 and 5
    bits) on Gaussian weights, and its 8-bit sub-codes beat Q4_K's 6-bit ones."""
    rng = np.random.default_rng(2)
    w = _weights(rng, 64, 512)
    two = sb.dequantize(dict(grid := sb.superblock_grid(w, 256), codes=sb.quantize_codes(w, grid)))
    six = sb.dequantize(dict(g6 := sb.superblock_grid(w, 256, levels=63), codes=sb.quantize_codes(w, g6)))
    ones = [Int4Group(32, zp) for zp in (False, True)]
    one_level = [f.dequantize(f.quantize(w, WeightCalibration())) for f in ones]
    assert sqnr_db(w, two) > max(sqnr_db(w, x) for x in one_level) + 0.5
    assert sqnr_db(w, two) > sqnr_db(w, six)


def test_the_search_in_row_blocks_equals_the_search_of_the_whole_weight():
    """sub_block_params_reference searches SEARCH_ROWS rows at a time (for speed): bit for
    bit what one search over every row gives (rows are independent), importance weights or not."""
    rng = np.random.default_rng(7)
    w = _weights(rng, 2 * sb.SEARCH_ROWS + 37, 192)
    w[5] = 0.0  # an all-zero row
    g = w.reshape(w.shape[0], -1, sb.SUB)
    for importance in (None, rng.random(192).astype(np.float32)):
        h = np.ones(192, np.float32) if importance is None else importance
        h = np.maximum(h, 1e-12 * float(h.max()))  # sub_block_params' floor
        whole = sb._search(g, h.reshape(1, -1, sb.SUB))
        blocked = sb.sub_block_params_reference(w, importance)
        for a, b in zip(blocked, whole):
            assert a.dtype == np.float32 and np.array_equal(a, b)


@pytest.mark.parametrize("weighted", [False, True])
def test_native_search_is_bit_identical_to_the_numpy_reference(weighted):
    """The native sub-block search (bessemer._C) gives exactly the reference's scales and
    minimums, bit for bit, on weights with outliers, all-zero rows and sub-blocks, signed
    zeros, sub-blocks without negative or without positive weights, a constant sub-block
    and denormal-sized weights, with and without importance (some of it zero: floored)."""
    rng = np.random.default_rng(11 + weighted)
    w = (rng.standard_normal((300, 576)) * 0.02).astype(np.float32)
    w[rng.random(w.shape) < 0.02] *= 8
    w[0] = 0
    w[1] = 0
    w[1, 3] = -0.5
    w[2] *= 1e-36
    w[3, :32] = np.abs(w[3, :32])
    w[4, :64] = -0.0
    w[4, 5] = 0.3
    w[5, :32] = -np.abs(w[5, :32])
    w[6, :64] = 0.25
    h = None
    if weighted:
        h = rng.gamma(0.5, 1.0, 576).astype(np.float32)
        h[::7] = 0
    got = sb.sub_block_params(w, h)
    ref = sb.sub_block_params_reference(w, h)
    for a, b in zip(got, ref):
        assert a.shape == (300, 576 // sb.SUB) and a.dtype == np.float32
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{int((a != b).sum())} of {b.size} differ"


def test_native_search_is_bit_identical_on_a_layer_sized_weight():
    """Near-ties between range factors are rare: a layer-sized Gaussian weight (SmolLM2's
    gate|up shape) has enough sub-blocks for a contracted multiply-add or a reordered sum
    to pick another candidate somewhere."""
    w = _weights(np.random.default_rng(13), 3072, 576)
    got, ref = sb.sub_block_params(w), sb.sub_block_params_reference(w)
    for a, b in zip(got, ref):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"{int((a != b).sum())} of {b.size} differ"


def test_gptq_codes_lie_on_the_grid_and_lower_the_output_error():
    rng = np.random.default_rng(3)
    w = _weights(rng, 32, 256)
    # correlated inputs (what GPTQ's error feedback exploits), channels of unequal energy
    mix = rng.standard_normal((256, 256)).astype(np.float32) / 16 + np.eye(256, dtype=np.float32)
    x = (rng.standard_normal((512, 256)).astype(np.float32) @ mix) * np.linspace(0.2, 3, 256, dtype=np.float32)
    h = (x.T @ x).astype(np.float64)
    fmt = Int4SuperBlock(256)
    rtn, gptq = fmt.quantize(w, WeightCalibration()), fmt.quantize(w, WeightCalibration(hessian=h))

    def out_err(q):
        return float(np.square(x @ (w - fmt.dequantize(q)).T).mean())

    assert out_err(gptq) < 0.9 * out_err(rtn)


def test_k_cuts_follow_super_blocks():
    fmt = Int4SuperBlock(192)
    assert fmt.column_split_error(576, [(0, 192), (192, 576)], 0) is None
    why = fmt.column_split_error(576, [(0, 288), (288, 576)], 1)
    assert "column 288" in why and "super-block of 192" in why
    rng = np.random.default_rng(4)
    w = _weights(rng, 16, 576)
    q = fmt.quantize(w, WeightCalibration())
    half = fmt.slice_columns(q, 192, 576)
    np.testing.assert_array_equal(fmt.dequantize(half), fmt.dequantize(q)[:, 192:])


# ---------------------------------------------------------------- kernel vs reference

def _w4k_engine(tmp_path, w, table, bias, calib=WeightCalibration()):
    n, k = w.shape
    fmt = Int4SuperBlock(sb.super_block_size(k))
    q = fmt.quantize(w, calib)
    layouts = {"codes": "panel16_int4_k8"}
    names = {"codes": "c", "scales": "s", "offsets": "o", "super_scales": "d", "super_offsets": "dm"}
    ents = [f32_entry("emb", table)]
    for p in fmt.parts((n, k)):
        layout = layouts.get(p.role, "panel16")
        ents.append(entry(names[p.role], p.dtype, layout, p.shape, fmt.pack(p.role, q[p.role], layout)))
    ws = list(names.values()) + (["b"] if bias is not None else [])
    if bias is not None:
        ents.append(f32_entry("b", bias))
    lin = step("linear_w4k", [[0, 3, k]], [[1, 2, n]], ws, {"super_block": fmt.super_block}, 1)
    plan = make_plan([(k + 3, "tokens"), (n + 5, "tokens")], [emb_step([0, 3, k]), lin], [1, 2, n], n)
    return write(tmp_path / "w4k.engine", plan, ents), fmt.dequantize(q)


W4K_CASES = [  # M, N, K, bias, threads: decode (M <= 8), prefill, K blocks of several super-blocks,
    (1, 40, 256, False, 1), (1, 48, 576, True, 2), (3, 40, 576, False, 2),  # N off panels
    (17, 40, 1536, True, 2), (130, 33, 256, True, 2), (8, 200, 2304, False, 2),
    # super-blocks of one sub-block (K = 32: each sub-block starts and ends its super-block)
    # and of seven (K = 224)
    (2, 64, 32, True, 1), (4, 72, 224, False, 2),
    # a GEMV wider than the prepared-activation buffer: K blocks whose bf16 rows carry their
    # sub-block sums after them (linear_driver.h, x_sums)
    (1, 32, 16384, True, 2),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("M,N,K,bias,threads", W4K_CASES)
def test_linear_w4k_matches_reference(tmp_path, isa, M, N, K, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K)
    table = rng.standard_normal((V, K)).astype(np.float32)
    w = _weights(rng, N, K)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    path, wd = _w4k_engine(tmp_path, w, table, b)
    tokens = rng.integers(0, min(V, N), M)
    out = run_flat(executor(path, isa, threads), tokens)
    ref = round_to_bf16(table[tokens]).astype(np.float64) @ wd.astype(np.float64).T + (b if bias else 0)
    assert_close(out, ref, tol.W4_BF16_RTOL, tol.W4_BF16_ATOL, f"linear_w4k ({isa})")


def test_linear_w4k_rows_do_not_depend_on_the_batch(tmp_path):
    """A row's output is bit-identical alone and inside 1..12-row steps (fixed K order)."""
    rng = np.random.default_rng(9)
    table = rng.standard_normal((V, 576)).astype(np.float32)
    path, _ = _w4k_engine(tmp_path, _weights(rng, 96, 576), table, None)
    for isa in ISAS:
        ex = executor(path, isa, 2)
        alone = run_flat(ex, np.array([7]))[0]
        for m in (2, 5, 9, 12):
            np.testing.assert_array_equal(run_flat(ex, np.array([7] + list(range(m - 1))))[0], alone)


# ---------------------------------------------------------------- engines

@pytest.fixture(scope="module")
def tiny_wide(tmp_path_factory) -> Path:
    """A tied tiny Llama whose K (512) is two super-blocks of 256, so --tp 2 cuts o_proj and
    down_proj on super-block boundaries."""
    from conftest import make_tiny_checkpoint

    return make_tiny_checkpoint("llama-tied", tmp_path_factory.mktemp("wide") / "hf", hidden_size=512,
                                intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def test_w4k_engine_matches_hf_on_the_same_fake_quantized_weights(tiny_wide, tmp_path):
    """The engine (linear_w4k for every decoder linear, the int8 tied table) equals HF
    running dequantize(quantize(w)) of each linear (a row-wise format: q|k|v and gate|up
    quantize alone as in the fused weight) on bf16-rounded inputs. Built at --tp 2 (one
    build: the suite's time): o_proj and down_proj hold one super-block of K per rank, cut
    from the TP=1 codes; the single-rank kernel is test_linear_w4k_matches_reference's."""
    tp = 2
    from conftest import assert_engine_matches_hf_model
    from test_mixed_precision import fake_quantized_hf
    from tolerances import W4_BF16_FAKE_QUANT_LOGITS_RTOL

    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    engine = build_engine(tiny_wide, tmp_path / "e", BuildConfig(quant=QuantConfig("w4k"), max_seq_len=64, tp_size=tp))
    names = [f"model.layers.{i}.{m}" for i in range(2)
             for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")]
    hf = fake_quantized_hf(tiny_wide, dict({n: "int4-k" for n in names}, lm_head="int8"))
    assert_engine_matches_hf_model(engine, hf, W4_BF16_FAKE_QUANT_LOGITS_RTOL)


def test_a_k_cut_inside_a_super_block_is_refused_naming_tp(tiny_wide, tmp_path):
    """--tp 4 would cut o_proj's 512 input features at 128 (one head a rank), inside the
    first super-block of 256; the error names the --tp that works."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    with pytest.raises(InvalidOptionError, match=r"o_proj: --tp 4 cuts its 512 input features at column 128, inside "
                                                 r"a super-block of 256 \(--quant w4k\); use --quant w4a16 --group-size "
                                                 r"32 or --tp 1 or 2"):
        build_engine(tiny_wide, tmp_path / "e", BuildConfig(quant=QuantConfig("w4k"), max_seq_len=64, tp_size=4))


def test_input_features_not_in_whole_sub_blocks_are_refused_naming_the_linear(tiny_checkpoint, tmp_path):
    """intermediate 88: down_proj's K is not a multiple of 32."""
    from bessemer.builder.build import build_engine
    from bessemer.builder.config import BuildConfig

    with pytest.raises(InvalidOptionError, match=r"mlp.down_proj: --quant w4k needs input features that are a "
                                                 r"multiple of 32, got 88; use --quant w4a16"):
        build_engine(tiny_checkpoint("llama-tied"), tmp_path / "e", BuildConfig(quant=QuantConfig("w4k"), max_seq_len=64))


def test_cuda_target_reads_w4k_with_its_two_level_kernel():
    """--target cuda --quant w4k is accepted and its linears map to gemm_w4k_kernel, which
    takes K one sub-block at a time with the weight's super-block (the kernel itself:
    tests/cuda_interpreter/test_quantized.py)."""
    from bessemer.builder.config import BuildConfig
    from bessemer.quantization.formats import Int4SuperBlock
    from bessemer.targets import get_target

    BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig("w4k-gptq", calib_data="c.txt"))
    kernel = get_target("cuda").quant_kernel("linear", Int4SuperBlock)(Int4SuperBlock(192), (1536, 576))
    assert (kernel.function, kernel.constexprs, kernel.max_block[1]) == \
        ("gemm_w4k_kernel", {"SUB_BLOCK": 32, "SUPER_BLOCK": 192}, 32)


def test_w4k_options():
    """No --zero-point (sub-blocks always have a minimum); GPTQ needs calibration text and
    takes act-order by default; --bits-per-weight applies; config.json names the layout."""
    with pytest.raises(InvalidOptionError, match="--zero-point does not apply to --quant w4k"):
        QuantConfig("w4k", zero_point=True)
    with pytest.raises(InvalidOptionError, match="needs calibration text"):
        QuantConfig("w4k-gptq")
    assert QuantConfig("w4k-gptq", calib_data="c.txt").act_order
    assert QuantConfig("w4k", bits_per_weight=4.85, calib_data="c.txt").bits_per_weight == 4.85
    d = QuantConfig("w4k").to_json()
    assert d["granularity"] == "two_level" and "group_size" not in d


def test_native_search_is_the_same_on_any_number_of_threads():
    """The rows split over the threads (row_threads.h) unevenly here (37 rows); a negative
    count is refused."""
    from bessemer import _C

    w = _weights(np.random.default_rng(17), 37, 192)
    h, f = np.ones(192, np.float32), np.asarray(sb.RANGE_FACTORS, np.float64)
    one = _C.int4_superblock_search(w, h, f, 1)
    for threads in (2, 3, 0):
        for a, b in zip(one, _C.int4_superblock_search(w, h, f, threads)):
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    with pytest.raises(ValueError, match="threads must be >= 0"):
        _C.int4_superblock_search(w, h, f, -1)
