"""moe_mxfp4@1 (the grouped expert kernel on gpt-oss's MXFP4 experts) against a NumPy MXFP4
reference, on both ISAs (AVX-512: moe_mxfp4_avx512.cpp; AVX2: the fallback in moe_mxfp4.cpp),
and its batch invariance.

The reference decodes the stored bytes itself (E2M1 code c of element 2j in the low nibble of
byte j, 2j + 1 in the high one, value table[c] * 2^(scale - 127) for each block of 32) and runs
ops.ref_moe on the values in float64. Codes are random bytes (every E2M1 value, both zeros),
scales spread over 2^-9..2^-1 (each block through its own scaled table on AVX-512), and the
widths give odd and even block counts (H: 3 blocks, I: 2); 150
tokens over 4 experts fill one expert's 64-token chunks several times over (8-token passes and
their remainders). Tolerance: tests/tolerances.py MOE_RTOL / MOE_ATOL (fp32 products and
accumulation over H and I terms)."""

import numpy as np
import pytest

import tolerances as tol
from test_kernels import ISAS, assert_close, emb_step, load, make_plan, run_flat, step

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
H, I, E, K_TOP, V = 96, 64, 4, 2, 24


def dequantize_mxfp4(codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """codes (N, K/2) uint8, scales (N, K/32) uint8 -> (N, K) float64."""
    n = codes.shape[0]
    elems = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, -1)  # element 2j, 2j + 1
    return E2M1[elems] * np.repeat(np.exp2(scales.astype(np.float64) - 127), 32, axis=1)


def _engine(tmp_path, rng):
    """A plan of embedding -> moe_mxfp4 (gpt-oss's layout, routing and activation, biases), and
    the reference's weights: gate_up (E, H, 2I), down (E, I, H) input-major, biases."""
    from bessemer.format.container import TensorEntry, write_rank_file
    from bessemer.format.layouts import encode

    attrs = {"num_experts": E, "top_k": K_TOP, "expert_size": I, "softmax_after_topk": 1, "norm_topk_prob": 0,
             "layout": 1, "activation": 1}
    entries, values = [], []
    for name, n, k in (("gu", 2 * I, H), ("d", H, I)):
        codes = rng.integers(0, 256, (E * n, k // 2), dtype=np.uint8)
        scales = rng.integers(118, 127, (E * n, k // 32), dtype=np.uint8)
        entries += [TensorEntry(name, "uint8", "row_major", codes.shape, codes.tobytes),
                    TensorEntry(name + ".scales", "uint8", "row_major", scales.shape, scales.tobytes)]
        # (E*N, K) output rows -> (E, K, N) as layout 1 holds them
        values.append(np.swapaxes(dequantize_mxfp4(codes, scales).reshape(E, n, k), 1, 2))
    floats = {"emb": (rng.standard_normal((V, H + E)) * 2).astype(np.float32),
              "gub": (rng.standard_normal((E, 2 * I)) * 0.3).astype(np.float32),
              "db": (rng.standard_normal((E, H)) * 0.3).astype(np.float32)}
    entries += [TensorEntry(n, "float32", "row_major", a.shape, (lambda a=a: encode(a, "float32", "row_major")))
                for n, a in floats.items()]
    plan = make_plan([(H + E, "tokens"), (H, "tokens")],
                     [emb_step([0, 0, H + E]),
                      step("moe_mxfp4", [[0, 0, H], [0, H, E]], [[1, 0, H]], ["gu", "gu.scales", "d", "d.scales", "gub", "db"],
                           attrs, 1)],
                     [1, 0, H], H)
    path = tmp_path / "mxfp4.engine"
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, entries)
    return path, floats, values + [floats["gub"], floats["db"]]


@pytest.mark.parametrize("isa", ISAS)
def test_mxfp4_expert_kernel_matches_numpy_dequantize_and_matmul(tmp_path, isa):
    from bessemer.plugins import ops

    rng = np.random.default_rng(11)
    path, floats, weights = _engine(tmp_path, rng)
    tokens = rng.integers(0, V, 150)
    out = run_flat(load(path, isa=isa)[1], tokens)
    x = floats["emb"][tokens].astype(np.float64)
    ref = ops.ref_moe(x[:, :H], x[:, H:], weights, E, K_TOP, I, 1, 0, 1, 1)
    assert_close(out, ref, tol.MOE_RTOL, tol.MOE_ATOL, f"moe_mxfp4 {isa}")


@pytest.mark.parametrize("isa", ISAS)
def test_mxfp4_expert_rows_do_not_depend_on_the_batch(tmp_path, isa):
    """A token's output is bit-identical alone, among 16 tokens (the driver's small-batch path:
    every active expert's rows split over the threads in one region) and among 150 (chunks of
    64 tokens per expert, its row in 1-token or 8-token passes, first or last in a chunk): the
    kernels fix a row's order of operations by K and split output rows, never K, over the
    threads."""
    rng = np.random.default_rng(12)
    path, _, _ = _engine(tmp_path, rng)
    tokens = rng.integers(0, V, 150)
    _, ex = load(path, isa=isa)
    together = np.asarray(run_flat(ex, tokens))
    for r in (0, 1, 63, 64, 149):
        alone = np.asarray(run_flat(ex, tokens[r:r + 1]))
        assert np.array_equal(alone[0], together[r]), f"{isa}: row {r} differs alone and batched"
    for n in (2, 16):  # 4 and 32 (token, expert) pairs: the small-batch path
        assert np.array_equal(np.asarray(run_flat(ex, tokens[:n])), together[:n]), f"{isa}: {n} tokens"
