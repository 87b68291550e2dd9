"""C++ kernel tests: tiny rank files run through bessemer._C, checked against NumPy (float64).

Every test builds a plan whose first step is an f32 row_major embedding (the only way to
feed activations in), runs the kernel under test, and returns a buffer as the logits.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tolerances as tol  # noqa: E402
from edit_loop import check_subset  # noqa: E402

from bessemer import _C  # noqa: E402
from bessemer.plugins import ops  # noqa: E402
from bessemer.quantization import kv_cache as kvq  # noqa: E402
from bessemer.format.container import FORMAT_MAJOR, FORMAT_MINOR, TensorEntry, rewrite_header, write_rank_file  # noqa: E402
from bessemer.format.dtypes import bfloat16_bits_to_float32, to_bfloat16_bits  # noqa: E402
from bessemer.format.kv import kv_bytes_per_token  # noqa: E402
from bessemer.format.layouts import encode  # noqa: E402
from bessemer.format.step import StepBatch  # noqa: E402

_FEATS = _C.cpu_features()
ISAS = ["avx2"] + (["avx512"] if all(_FEATS[k] for k in ("avx512f", "avx512bw", "avx512vl")) else [])
KVQ_NAME = {"int8": "int8", "float8_e4m3": "fp8"}  # plan dtype -> build flag
NO_KV = {"num_layers": 0, "num_kv_heads": 1, "head_dim": 1, "dtype": "float32"}


# ---------------------------------------------------------------- helpers

def bf16_round(x: np.ndarray) -> np.ndarray:
    return bfloat16_bits_to_float32(to_bfloat16_bits(np.asarray(x, np.float32)))


def assert_close(out, ref, rtol, atol, what=""):
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = float(np.max(np.abs(out - ref))) if out.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    assert err <= rtol * scale + atol, f"{what}: max err {err:.3g} (scale {scale:.3g}, rtol {rtol}, atol {atol})"


def make_plan(buffers, steps, logits, vocab, kv=None):
    return {"buffers": [{"id": i, "width": w, "rows": r} for i, (w, r) in enumerate(buffers)],
            "steps": steps, "kv_cache": kv or NO_KV, "logits": list(logits), "vocab_size": vocab}


def step(op, ins=(), outs=(), weights=(), attrs=None, version=1):
    return {"op": op, "version": version, "node": "", "ins": [list(v) for v in ins],
            "outs": [list(v) for v in outs], "weights": list(weights), "attrs": dict(attrs or {})}


def emb_step(out_view, table="emb"):
    return step("embedding", outs=[out_view], weights=[table])


def write_engine(path: Path, plan: dict, tensors: dict) -> Path:
    """tensors: name -> (fp32 array, dtype, layout)."""
    entries = [TensorEntry(name, dt, lay, tuple(a.shape), (lambda a=a, dt=dt, lay=lay: encode(a, dt, lay)))
               for name, (a, dt, lay) in tensors.items()]
    header = {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}
    write_rank_file(path, header, entries)
    return path


def load(path: Path, isa="auto", threads=2, block_size=16, num_blocks=64):
    f = _C.EngineFile(str(path))
    return f, _C.Executor(f, threads, block_size, num_blocks, isa)


def edited(path: Path, edit) -> Path:
    """A copy of rank file `path` whose header `edit` changed (data unchanged): the executor
    reads its plan and tensor table from the file, so a bad plan or table is a bad file."""
    return rewrite_header(path, path.with_name(f"{path.stem}-edited{path.suffix}"), edit)


def i32(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32))


def run_flat(ex, tokens, logits_indices=None, block_size=16):
    """One sequence of len(tokens) rows at positions 0..T-1 (no attention in the plan)."""
    T = len(tokens)
    nb = (T + block_size - 1) // block_size
    li = np.arange(T) if logits_indices is None else logits_indices
    return ex.step(StepBatch(i32(tokens), i32(np.arange(T)), i32([0, T]), i32([T]), i32(np.full((1, nb), -1)),
                             i32(li)))


def build_and_run(tmp_path, plan, tensors, tokens, isa, threads=2, logits_indices=None, name="k.engine"):
    path = write_engine(tmp_path / name, plan, tensors)
    _, ex = load(path, isa=isa, threads=threads)
    return run_flat(ex, tokens, logits_indices)


# ---------------------------------------------------------------- engine file

def test_engine_file_fields(tmp_path):
    plan = make_plan([(8, "tokens")], [emb_step([0, 0, 8])], [0, 0, 8], 8)
    table = np.arange(80, dtype=np.float32).reshape(10, 8)
    path = write_engine(tmp_path / "a.engine", plan, {"emb": (table, "float32", "row_major")})
    f = _C.EngineFile(str(path))
    assert (f.format_major, f.format_minor) == (FORMAT_MAJOR, FORMAT_MINOR) == (1, 1)
    assert f.size == path.stat().st_size
    assert f.data_offset % 4096 == 0 and f.data_offset <= f.size
    assert f.path == str(path)
    hdr = json.loads(f.header)
    assert hdr["plan"] == plan and hdr["tensors"][0]["name"] == "emb"


def test_engine_file_errors(tmp_path):
    short = tmp_path / "short.engine"
    short.write_bytes(b"BESSEMER\x01\x00")
    with pytest.raises(ValueError, match="too short"):
        _C.EngineFile(str(short))
    bad = tmp_path / "bad.engine"
    bad.write_bytes(b"NOTANENG" + struct.pack("<HHIQ", 1, 0, 0, 2) + b"{}")
    with pytest.raises(ValueError, match="magic"):
        _C.EngineFile(str(bad))
    long_header = tmp_path / "hdr.engine"
    long_header.write_bytes(b"BESSEMER" + struct.pack("<HHIQ", 1, 0, 0, 1000) + b"{}")
    with pytest.raises(ValueError, match="header length"):
        _C.EngineFile(str(long_header))
    no_data = tmp_path / "nodata.engine"
    no_data.write_bytes(b"BESSEMER" + struct.pack("<HHIQ", 1, 0, 0, 2) + b"{}" + b"\0" * 100)
    with pytest.raises(ValueError, match="data offset"):
        _C.EngineFile(str(no_data))
    major = tmp_path / "major.engine"
    major.write_bytes(b"BESSEMER" + struct.pack("<HHIQ", 2, 3, 0, 2) + b"{}" + b"\0" * 4070)
    f = _C.EngineFile(str(major))  # opens (header readable); the Executor refuses it
    assert (f.format_major, f.format_minor, f.header) == (2, 3, b"{}")
    with pytest.raises(ValueError, match="format version 2.3"):
        _C.Executor(f, 1, 16, 1)
    with pytest.raises(FileNotFoundError):
        _C.EngineFile(str(tmp_path / "missing.engine"))


def test_truncated_rank_file(tmp_path):
    plan = make_plan([(8, "tokens")], [emb_step([0, 0, 8])], [0, 0, 8], 8)
    path = write_engine(tmp_path / "t.engine", plan, {"emb": (np.ones((10, 8), np.float32), "float32", "row_major")})
    data = path.read_bytes()
    # Cut inside the tensor data: the EngineFile opens, the Executor refuses the tensor.
    cut = tmp_path / "cut.engine"
    cut.write_bytes(data[:-16])
    f = _C.EngineFile(str(cut))
    with pytest.raises(ValueError, match="emb"):
        _C.Executor(f, 1, 16, 4)
    # Cut inside the header: refused by EngineFile.
    cut2 = tmp_path / "cut2.engine"
    cut2.write_bytes(data[:40])
    with pytest.raises(ValueError):
        _C.EngineFile(str(cut2))


# ---------------------------------------------------------------- load-time errors

def _simple_engine(tmp_path):
    plan = make_plan([(16, "tokens"), (8, "tokens")],
                     [emb_step([0, 0, 16]), step("linear", [[0, 0, 16]], [[1, 0, 8]], ["w"])], [1, 0, 8], 8)
    rng = np.random.default_rng(0)
    tensors = {"emb": (rng.standard_normal((10, 16)).astype(np.float32), "float32", "row_major"),
               "w": (rng.standard_normal((8, 16)).astype(np.float32), "float32", "panel16")}
    return write_engine(tmp_path / "s.engine", plan, tensors)


def test_executor_load_errors(tmp_path):
    path = _simple_engine(tmp_path)
    ok = _C.Executor(_C.EngineFile(str(path)), 2, 16, 4)
    assert ok.num_threads == 2 and ok.kv_block_size == 16 and ok.num_kv_blocks == 4
    assert ok.isa in ("avx2", "avx512") and ok.kv_cache_bytes == 0

    def bad_plan(mutate):
        return lambda h: mutate(h["plan"])

    def bad_tensors(mutate):
        return lambda h: mutate(h["tensors"])

    cases = [
        (bad_plan(lambda p: p["steps"][1].update(version=2)), r"unsupported kernel linear@2: this runtime supports .*linear@1"),
        (bad_plan(lambda p: p["steps"][1].update(op="conv")), "unsupported kernel conv@1"),
        (bad_plan(lambda p: p["steps"][1].update(weights=["nope"])), "nope"),
        (bad_plan(lambda p: p["steps"][1].update(ins=[[0, 4, 16]])), "outside buffer"),
        (bad_plan(lambda p: p["steps"][1].update(ins=[[7, 0, 16]])), "unknown buffer"),
        (bad_plan(lambda p: p.update(logits=[1, 0, 4])), "vocab_size"),
        (bad_plan(lambda p: p["steps"][1]["attrs"].update(eps="x")), "must be a finite number"),
        (bad_tensors(lambda t: t[1].update(offset=t[1]["offset"] + 1 << 20)), "w: data"),
        (bad_tensors(lambda t: t[1].update(offset=t[1]["offset"] + 32)), "multiple of 64"),
        (bad_tensors(lambda t: t[1].update(nbytes=t[1]["nbytes"] - 4)), "tensor w: nbytes"),
        (bad_tensors(lambda t: t[1].update(layout=0)), "w"),
        (bad_tensors(lambda t: t[1].update(dtype=9)), "unknown dtype"),
        (bad_tensors(lambda t: t[1].update(shape=[8, 16.0])), "shape must be an integer"),
    ]
    for edit, match in cases:
        with pytest.raises(ValueError, match=match):
            _C.Executor(_C.EngineFile(str(edited(path, edit))), 1, 16, 4)
    with pytest.raises(ValueError, match="isa"):
        _C.Executor(_C.EngineFile(str(path)), 1, 16, 4, "sse2")


def test_weight_dtype_checked(tmp_path):
    plan = make_plan([(16, "tokens"), (16, "tokens")],
                     [emb_step([0, 0, 16]), step("rms_norm", [[0, 0, 16]], [[1, 0, 16]], ["n"], {"eps": 1e-5})],
                     [1, 0, 16], 16)
    tensors = {"emb": (np.ones((10, 16), np.float32), "float32", "row_major"),
               "n": (np.ones(16, np.float32), "bfloat16", "row_major")}
    path = write_engine(tmp_path / "d.engine", plan, tensors)
    with pytest.raises(ValueError, match="bfloat16"):
        load(path)


def test_step_input_errors(tmp_path):
    ex = _C.Executor(_C.EngineFile(str(_simple_engine(tmp_path))), 1, 16, 4)
    good = dict(token_ids=i32([1, 2]), positions=i32([0, 1]), cu_seqlens=i32([0, 2]), context_lens=i32([2]),
                block_tables=i32([[0]]), logits_indices=i32([1]))
    assert ex.step(StepBatch(**good)).shape == (1, 8)
    for key, val, match in [("token_ids", i32([1, 8]), "token_ids"),        # vocab 8
                            ("positions", i32([0, 2]), "positions"),
                            ("block_tables", i32([[4]]), "block_tables"),
                            ("logits_indices", i32([2]), "logits_indices"),
                            ("cu_seqlens", i32([0, 1]), "cu_seqlens"),
                            ("context_lens", i32([17]), "context_lens"),
                            ("token_ids", np.array([1.0, 2.0]), "int32")]:
        with pytest.raises(ValueError, match=match):
            ex.step(StepBatch(**dict(good, **{key: val})))


# ---------------------------------------------------------------- linear

LINEAR_CASES = [  # M, N, K, bias, threads
    (1, 40, 72, False, 1), (1, 40, 72, True, 2), (3, 40, 72, True, 2), (17, 40, 72, False, 2),
    (130, 40, 72, True, 2), (7, 70, 1000, True, 2), (130, 200, 96, False, 1), (2, 33, 5, True, 2),
    (64, 16, 16, False, 2), (9, 1, 3, True, 1), (40, 100, 1030, False, 2), (8, 50, 1100, True, 2),
    (2, 300, 1, False, 2),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("M,N,K,bias,threads", LINEAR_CASES)
def test_linear(tmp_path, isa, wdtype, M, N, K, bias, threads):
    rng = np.random.default_rng(M * 1000 + N + K)
    V = 50
    table = rng.standard_normal((V, K)).astype(np.float32)
    W = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    # x at column 3 of a wider buffer, y at column 2: exercises view offsets and strides.
    lin = step("linear", [[0, 3, K]], [[1, 2, N]], ["w", "b"] if bias else ["w"])
    plan = make_plan([(K + 3, "tokens"), (N + 5, "tokens")], [emb_step([0, 3, K]), lin], [1, 2, N], N)
    tensors = {"emb": (table, "float32", "row_major"), "w": (W, wdtype, "panel16")}
    if bias:
        tensors["b"] = (b, "float32", "row_major")
    tokens = rng.integers(0, min(V, N), M)
    out = build_and_run(tmp_path, plan, tensors, tokens, isa, threads)
    Wr = bf16_round(W) if wdtype == "bfloat16" else W
    ref = table[tokens].astype(np.float64) @ Wr.astype(np.float64).T + (b if bias else 0)
    if wdtype == "bfloat16":
        assert_close(out, ref, tol.BF16_LINEAR_RTOL, tol.BF16_LINEAR_ATOL, "linear bf16")
    else:
        assert_close(out, ref, tol.FP32_LINEAR_RTOL, tol.FP32_LINEAR_ATOL, "linear f32")


@pytest.mark.parametrize("isa", ISAS)
def test_selected_rows_lm_head(tmp_path, isa):
    """embedding -> rms_norm -> gather_rows -> linear on selected rows (the lm_head path)."""
    rng = np.random.default_rng(7)
    V, H = 53, 24
    table = rng.standard_normal((V, H)).astype(np.float32)
    w_norm = rng.standard_normal(H).astype(np.float32)
    steps = [emb_step([0, 0, H]),
             step("rms_norm", [[0, 0, H]], [[0, 0, H]], ["n"], {"eps": 1e-6, "weight_offset": 0}),
             step("gather_rows", [[0, 0, H]], [[1, 0, H]]),
             step("linear", [[1, 0, H]], [[2, 0, V]], ["emb"])]  # tied: the table is panel16 too
    plan = make_plan([(H, "tokens"), (H, "selected"), (V, "selected")], steps, [2, 0, V], V)
    tensors = {"emb": (table, "bfloat16", "panel16"), "n": (w_norm, "float32", "row_major")}
    tokens = rng.integers(0, V, 11)
    li = np.array([10, 3, 3, 0])
    out = build_and_run(tmp_path, plan, tensors, tokens, isa, logits_indices=li)
    t = bf16_round(table).astype(np.float64)
    x = t[tokens]
    y = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6) * w_norm
    ref = y[li] @ t.T
    assert_close(out, ref, tol.BF16_LINEAR_RTOL, tol.BF16_LINEAR_ATOL, "lm_head")


# ---------------------------------------------------------------- embedding, elementwise, norms

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["row_major", "panel16"])
def test_embedding(tmp_path, isa, dtype, layout):
    rng = np.random.default_rng(1)
    V, H = 37, 48
    table = rng.standard_normal((V, H)).astype(np.float32)
    plan = make_plan([(H, "tokens")], [emb_step([0, 0, H], "t")], [0, 0, H], H)
    tokens = np.concatenate([np.arange(V), rng.integers(0, V, 9)])
    out = build_and_run(tmp_path, plan, {"t": (table, dtype, layout)}, tokens, isa)
    ref = bf16_round(table)[tokens] if dtype == "bfloat16" else table[tokens]
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", [40, 19])
def test_add_silu_mul_gather(tmp_path, isa, H):
    rng = np.random.default_rng(2)
    V = 30
    table = (rng.standard_normal((V, 2 * H)) * 4).astype(np.float32)
    table[0, :4] = [-100.0, 100.0, 0.0, -20.0]
    steps = [emb_step([0, 0, 2 * H]),
             step("add", [[0, 0, H], [0, H, H]], [[1, 0, H]]),
             step("silu_mul", [[0, 0, H], [0, H, H]], [[1, H, H]]),
             step("gather_rows", [[1, 0, 2 * H]], [[2, 0, 2 * H]])]
    plan = make_plan([(2 * H, "tokens"), (2 * H, "tokens"), (2 * H, "selected")], steps, [2, 0, 2 * H], 2 * H)
    tokens = np.concatenate([[0], rng.integers(0, V, 12)])
    li = np.array([0, 12, 5, 5, 1])
    out = build_and_run(tmp_path, plan, {"emb": (table, "float32", "row_major")}, tokens, isa, logits_indices=li)
    x = table[tokens].astype(np.float64)
    g, u = x[:, :H], x[:, H:]
    ref = np.concatenate([g + u, g / (1 + np.exp(-g)) * u], axis=1)[li]
    assert_close(out[:, :H], ref[:, :H], tol.ELEMENTWISE_RTOL, 0, "add")
    np.testing.assert_allclose(out[:, H:], ref[:, H:], rtol=tol.SILU_RTOL, atol=1e-30)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H", [40, 19])
def test_gelu_tanh_mul_scale_sigmoid_gate(tmp_path, isa, H):
    """gelu_tanh_mul, scale and sigmoid_gate_mul (Gemma 3, Granite, Qwen2-MoE) against their
    NumPy references in plugins/ops.py, extreme gates included."""
    rng = np.random.default_rng(5)
    V = 30
    table = (rng.standard_normal((V, 2 * H + 1)) * 4).astype(np.float32)
    table[0, :4] = [-100.0, 100.0, 0.0, -20.0]
    table[1, 2 * H] = -90.0
    steps = [emb_step([0, 0, 2 * H + 1]),
             step("gelu_tanh_mul", [[0, 0, H], [0, H, H]], [[1, 0, H]]),
             step("scale", [[0, 0, H]], [[1, H, H]], attrs={"factor": 2.5}),
             step("sigmoid_gate_mul", [[0, H, H], [0, 2 * H, 1]], [[1, 2 * H, H]])]
    plan = make_plan([(2 * H + 1, "tokens"), (3 * H, "tokens")], steps, [1, 0, 3 * H], 3 * H)
    tokens = np.concatenate([[0, 1], rng.integers(0, V, 12)])
    out = build_and_run(tmp_path, plan, {"emb": (table, "float32", "row_major")}, tokens, isa)
    x = table[tokens]
    g, u, gate = x[:, :H], x[:, H:2 * H], x[:, 2 * H:]
    np.testing.assert_allclose(out[:, :H], ops.ref_gelu_tanh_mul(g, u), rtol=tol.GELU_RTOL, atol=tol.GELU_ATOL)
    np.testing.assert_allclose(out[:, H:2 * H], ops.ref_scale(g, 2.5), rtol=tol.ELEMENTWISE_RTOL, atol=0)
    np.testing.assert_allclose(out[:, 2 * H:], ops.ref_sigmoid_gate_mul(u, gate), rtol=tol.SILU_RTOL, atol=1e-30)


MOE_CASES = [  # (layout, activation, softmax_after_topk, norm_topk_prob, biases, first_expert, local_experts)
    (0, 0, 0, 0, False, 0, 5), (0, 0, 0, 1, False, 0, 5),  # Qwen2-MoE, Mixtral / Qwen3-MoE
    (1, 1, 1, 0, True, 0, 5), (1, 1, 1, 0, True, 2, 3)]  # gpt-oss, and one tensor-parallel rank's experts


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("layout,act,after,renorm,biases,first,local", MOE_CASES)
def test_moe(tmp_path, isa, layout, act, after, renorm, biases, first, local):
    """moe@1 against ops.ref_moe: routing (softmax then top-2 of 5, or softmax over the top-2
    logits), both weight layouts and activations, biases, a rank holding experts 2..4 only."""
    rng = np.random.default_rng(6)
    H, I, E, k, V = 24, 12, 5, 2, 20  # token ids < V <= the logits width H
    attrs = {"num_experts": E, "top_k": k, "expert_size": I, "softmax_after_topk": after, "norm_topk_prob": renorm,
             "layout": layout, "activation": act, "first_expert": first, "local_experts": local}
    shapes = ops.moe_weight_shapes(attrs, H)[:4 if biases else 2]
    ws = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in shapes]
    names = ["gu", "d", "gub", "db"][:len(ws)]
    table = (rng.standard_normal((V, H + E)) * 2).astype(np.float32)
    steps = [emb_step([0, 0, H + E]), step("moe", [[0, 0, H], [0, H, E]], [[1, 0, H]], names, attrs)]
    plan = make_plan([(H + E, "tokens"), (H, "tokens")], steps, [1, 0, H], H)
    tensors = {"emb": (table, "float32", "row_major"), **{n: (w, "float32", "row_major") for n, w in zip(names, ws)}}
    tokens = rng.integers(0, V, 17)
    out = build_and_run(tmp_path, plan, tensors, tokens, isa)
    x = table[tokens]
    ref = ops.ref_moe(x[:, :H], x[:, H:], ws, E, k, I, after, renorm, layout, act, first, local)
    assert_close(out, ref, tol.MOE_RTOL, tol.MOE_ATOL, "moe")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H,offset", [(64, 0.0), (37, 1.0)])
def test_rms_norm(tmp_path, isa, H, offset):
    rng = np.random.default_rng(3)
    table = (rng.standard_normal((20, H)) * 3).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32)
    steps = [emb_step([0, 0, H]),
             step("rms_norm", [[0, 0, H]], [[1, 1, H]], ["n"], {"eps": 1e-5, "weight_offset": offset})]
    plan = make_plan([(H, "tokens"), (H + 1, "tokens")], steps, [1, 1, H], H)
    tokens = rng.integers(0, 20, 33)
    out = build_and_run(tmp_path, plan, {"emb": (table, "float32", "row_major"), "n": (w, "float32", "row_major")},
                        tokens, isa)
    x = table[tokens].astype(np.float64)
    ref = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-5) * (w + offset)
    np.testing.assert_allclose(out, ref, rtol=tol.NORM_RTOL, atol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("heads,d,offset,inplace", [(4, 16, 0.0, False), (3, 12, 1.0, True), (2, 37, 0.0, True)])
def test_rms_norm_heads(tmp_path, isa, heads, d, offset, inplace):
    """Each head of a column view (q inside a fused qkv row) normalised alone, one weight
    for all heads, against ops.ref_rms_norm_heads; in place too (what the planner may choose)."""
    rng = np.random.default_rng(4)
    W, width = heads * d, heads * d + 5
    table = (rng.standard_normal((20, width)) * 3).astype(np.float32)
    w = rng.standard_normal(d).astype(np.float32)
    out_view = [0, 3, W] if inplace else [1, 1, W]
    steps = [emb_step([0, 0, width]),
             step("rms_norm_heads", [[0, 3, W]], [out_view], ["n"],
                  {"num_heads": heads, "head_dim": d, "eps": 1e-5, "weight_offset": offset})]
    plan = make_plan([(width, "tokens"), (W + 1, "tokens")], steps, [out_view[0], out_view[1], W], W)
    tokens = rng.integers(0, 20, 33)
    out = build_and_run(tmp_path, plan, {"emb": (table, "float32", "row_major"), "n": (w, "float32", "row_major")},
                        tokens, isa)
    ref = ops.ref_rms_norm_heads(table[tokens].astype(np.float64)[:, 3:3 + W], w.astype(np.float64), heads, d,
                                 1e-5, offset)
    np.testing.assert_allclose(out, ref, rtol=tol.NORM_RTOL, atol=1e-6)


def test_rms_norm_heads_checks_its_heads(tmp_path):
    steps = [emb_step([0, 0, 32]),
             step("rms_norm_heads", [[0, 0, 32]], [[1, 0, 32]], ["n"], {"num_heads": 3, "head_dim": 8, "eps": 1e-5})]
    plan = make_plan([(32, "tokens"), (32, "tokens")], steps, [1, 0, 32], 32)
    tensors = {"emb": (np.ones((4, 32), np.float32), "float32", "row_major"),
               "n": (np.ones(8, np.float32), "float32", "row_major")}
    with pytest.raises(ValueError, match="num_heads x head_dim does not equal the row width 32"):
        build_and_run(tmp_path, plan, tensors, [1, 2], "auto")


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("inplace", [False, True])
def test_add_rms_norm(tmp_path, isa, inplace):
    rng = np.random.default_rng(4)
    H = 72
    table = rng.standard_normal((25, 2 * H)).astype(np.float32)
    w = rng.standard_normal(H).astype(np.float32)
    res_out = [0, H, H] if inplace else [1, H, H]
    x = table.astype(np.float64)
    for which in ("y", "residual"):
        steps = [emb_step([0, 0, 2 * H]),
                 step("add_rms_norm", [[0, 0, H], [0, H, H]], [[1, 0, H], res_out], ["n"],
                      {"eps": 1e-6, "weight_offset": 0.0})]
        logits = [1, 0, H] if which == "y" else res_out
        plan = make_plan([(2 * H, "tokens"), (2 * H, "tokens")], steps, logits, H)
        tokens = rng.integers(0, 25, 21)
        out = build_and_run(tmp_path, plan, {"emb": (table, "float32", "row_major"), "n": (w, "float32", "row_major")},
                            tokens, isa, name=f"{which}.engine")
        r = x[tokens, :H] + x[tokens, H:]
        if which == "residual":
            np.testing.assert_allclose(out, r, rtol=tol.ELEMENTWISE_RTOL)
        else:
            ref = r / np.sqrt(np.mean(r * r, axis=1, keepdims=True) + 1e-6) * w
            np.testing.assert_allclose(out, ref, rtol=tol.NORM_RTOL, atol=1e-6)


# ---------------------------------------------------------------- rope

@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("D,R,scaling", [(16, 16, 1.0), (32, 16, 0.9), (24, 24, 1.0)])
def test_rope(tmp_path, isa, D, R, scaling):
    rng = np.random.default_rng(5)
    H, Hkv = 3, 1
    W = (H + Hkv) * D
    table = rng.standard_normal((40, W)).astype(np.float32)
    inv_freq = (1.0 / (10000.0 ** (np.arange(0, R, 2, dtype=np.float64) / R))).astype(np.float32)
    attrs = {"num_heads": H, "num_kv_heads": Hkv, "head_dim": D, "rotary_dim": R, "attention_scaling": scaling}
    steps = [emb_step([0, 0, W]), step("rope", [[0, 0, H * D], [0, H * D, Hkv * D]], [], ["inv_freq"], attrs)]
    plan = make_plan([(W, "tokens")], steps, [0, 0, W], W)
    path = write_engine(tmp_path / "r.engine", plan, {"emb": (table, "float32", "row_major"),
                                                       "inv_freq": (inv_freq, "float32", "row_major")})
    _, ex = load(path, isa=isa)
    T = 20
    tokens = rng.integers(0, 40, T)
    pos = np.concatenate([[0, 1, 4095], rng.integers(0, 4096, T - 3)])
    out = ex.step(StepBatch(i32(tokens), i32(pos), i32([0, T]), i32([4096]), i32(np.full((1, 256), -1)),
                            i32(np.arange(T))))
    f = pos.astype(np.float32)[:, None] * inv_freq[None, :]  # fp32 angle, as torch computes it
    c = np.cos(f.astype(np.float64)).astype(np.float32).astype(np.float64) * scaling
    s = np.sin(f.astype(np.float64)).astype(np.float32).astype(np.float64) * scaling
    x = table[tokens].astype(np.float64).reshape(T, H + Hkv, D).copy()
    a, b = x[:, :, : R // 2].copy(), x[:, :, R // 2: R].copy()
    x[:, :, : R // 2] = a * c[:, None, :] - b * s[:, None, :]
    x[:, :, R // 2: R] = b * c[:, None, :] + a * s[:, None, :]
    np.testing.assert_allclose(out, x.reshape(T, W), rtol=0, atol=tol.ROPE_ATOL)


# ---------------------------------------------------------------- attention

class AttnCase:
    """Runs attention@1 over several steps and keeps a float64 reference of the KV history."""

    def __init__(self, tmp_path, isa, H, Hkv, D, window=0, block_size=16, kv_dtype="float32", threads=2,
                 seq_max=(80, 80, 80), num_blocks=64, seed=0, sinks=None):
        """sinks: (H,) logits: runs attention_sinks@1 (one more softmax term per head, no value)."""
        self.rng = np.random.default_rng(seed)
        self.sinks = sinks
        self.H, self.Hkv, self.D, self.window, self.bs = H, Hkv, D, window, block_size
        self.kv_dtype = kv_dtype
        W = (H + 2 * Hkv) * D
        self.V = 61
        self.table = self.rng.standard_normal((self.V, W)).astype(np.float32)
        self.scale = 1.0 / np.sqrt(D) * 1.7
        attrs = {"layer": 1, "num_heads": H, "num_kv_heads": Hkv, "head_dim": D, "scale": float(self.scale),
                 "sliding_window": window}
        q, k, v = [0, 0, H * D], [0, H * D, Hkv * D], [0, (H + Hkv) * D, Hkv * D]
        op, weights = ("attention", []) if sinks is None else ("attention_sinks", ["sinks"])
        steps = [emb_step([0, 0, W]), step(op, [q, k, v], [[1, 0, H * D]], weights, attrs)]
        kv = {"num_layers": 2, "num_kv_heads": Hkv, "head_dim": D, "dtype": kv_dtype}
        if kv_dtype in KVQ_NAME:
            kv["scales"] = "dynamic_per_token_head_float32"
        plan = make_plan([(W, "tokens"), (H * D, "tokens")], steps, [1, 0, H * D], H * D, kv)
        self.tok_limit = min(self.V, H * D)
        tensors = {"emb": (self.table, "float32", "row_major")}
        if sinks is not None:
            tensors["sinks"] = (np.asarray(sinks, np.float32), "float32", "row_major")
        path = write_engine(tmp_path / "attn.engine", plan, tensors)
        self.file, self.ex = load(path, isa=isa, threads=threads, block_size=block_size, num_blocks=num_blocks)
        per_token = kv_bytes_per_token(2, Hkv, D, kv_dtype)  # the runtime's accounting, scales included
        assert self.ex.kv_cache_bytes == num_blocks * block_size * per_token
        # Disjoint, shuffled (non-contiguous) blocks per sequence.
        perm = self.rng.permutation(num_blocks)
        self.tables, used = [], 0
        for m in seq_max:
            nb = (m + block_size - 1) // block_size
            self.tables.append(perm[used: used + nb])
            used += nb
        assert used <= num_blocks
        self.hist = [dict() for _ in seq_max]  # seq -> pos -> (k, v) float64 [Hkv, D]

    def step(self, rows, drop_blocks_below_window=False, tokens=None):
        """rows: list of (seq, start_pos, n); tokens: {seq: token ids by position} to take the
        rows' tokens from (default: random)."""
        H, Hkv, D = self.H, self.Hkv, self.D
        toks, pos, cu, ctx = [], [], [0], []
        for s, p0, n in rows:
            toks += list(tokens[s][p0: p0 + n]) if tokens and s in tokens else list(self.rng.integers(0, self.tok_limit, n))
            pos += list(range(p0, p0 + n))
            cu.append(cu[-1] + n)
            ctx.append(p0 + n)
        B = max(len(self.tables[s]) for s, _, _ in rows)
        bt = np.full((len(rows), B), -1)
        for i, (s, p0, n) in enumerate(rows):
            bt[i, : len(self.tables[s])] = self.tables[s]
            if drop_blocks_below_window and self.window:
                lo = max(0, p0 - self.window + 1)
                bt[i, : lo // self.bs] = -1
        T = len(toks)
        out = self.ex.step(StepBatch(i32(toks), i32(pos), i32(cu), i32(ctx), i32(bt), i32(np.arange(T))))
        x = self.table[np.array(toks)].astype(np.float64)
        q = x[:, : H * D].reshape(T, H, D)
        k = x[:, H * D: (H + Hkv) * D].reshape(T, Hkv, D)
        v = x[:, (H + Hkv) * D:].reshape(T, Hkv, D)
        t = 0
        for s, p0, n in rows:
            for i in range(n):
                self.hist[s][p0 + i] = (k[t + i], v[t + i])
            t += n
        ref = np.zeros((T, H, D))
        ref_q = np.zeros((T, H, D))  # with bf16-rounded K/V
        t = 0
        G = H // Hkv
        for s, p0, n in rows:
            for i in range(n):
                p = p0 + i
                lo = max(0, p - self.window + 1) if self.window else 0
                K = np.stack([self.hist[s][j][0] for j in range(lo, p + 1)])
                Vv = np.stack([self.hist[s][j][1] for j in range(lo, p + 1)])
                for kv_round, dst in ((False, ref), (True, ref_q)):
                    Kx = self._stored(K) if kv_round else K
                    Vx = self._stored(Vv) if kv_round else Vv
                    for h in range(H):
                        sc = self.scale * (Kx[:, h // G] @ q[t + i, h])
                        top = sc.max() if self.sinks is None else max(sc.max(), float(self.sinks[h]))
                        e = np.exp(sc - top)
                        sink = 0.0 if self.sinks is None else np.exp(float(self.sinks[h]) - top)
                        dst[t + i, h] = (e / (e.sum() + sink)) @ Vx[:, h // G]
            t += n
        ref, ref_q = ref.reshape(T, H * D), ref_q.reshape(T, H * D)
        if self.sinks is not None:  # the op's reference (plugins/ops.py) agrees with this one
            s, p0, n = rows[-1]
            p = p0 + n - 1
            lo = max(0, p - self.window + 1) if self.window else 0
            K = np.stack([self.hist[s][j][0] for j in range(lo, p + 1)]).reshape(p + 1 - lo, -1)
            Vv = np.stack([self.hist[s][j][1] for j in range(lo, p + 1)]).reshape(p + 1 - lo, -1)
            op_ref = ops.ref_attention(x[T - 1: T, : H * D], K, Vv, np.array([p]), np.arange(lo, p + 1), H, Hkv, D,
                                       self.scale, self.window, sinks=np.asarray(self.sinks, np.float64))
            np.testing.assert_allclose(op_ref[0], ref[T - 1], rtol=0, atol=1e-5)
        if self.kv_dtype in KVQ_NAME:  # the op's reference with the cache write's quantization agrees
            s, p0, n = rows[-1]
            p = p0 + n - 1
            lo = max(0, p - self.window + 1) if self.window else 0
            K = np.stack([self.hist[s][j][0] for j in range(lo, p + 1)]).reshape(p + 1 - lo, -1)
            Vv = np.stack([self.hist[s][j][1] for j in range(lo, p + 1)]).reshape(p + 1 - lo, -1)
            op_ref = ops.ref_attention(x[T - 1: T, : H * D], K, Vv, np.array([p]), np.arange(lo, p + 1), H, Hkv, D,
                                       self.scale, self.window, kv_dtype=KVQ_NAME[self.kv_dtype])
            np.testing.assert_allclose(op_ref[0], ref_q[T - 1], rtol=0, atol=1e-5)
        if self.kv_dtype == "float32":
            assert_close(out, ref, tol.ATTN_FP32_RTOL, tol.ATTN_FP32_ATOL, "attention fp32")
        else:
            assert_close(out, ref_q, tol.ATTN_FP32_RTOL, tol.ATTN_FP32_ATOL, f"attention vs {self.kv_dtype} ref")
            err = np.max(np.abs(out - ref))
            err_ref = np.max(np.abs(ref_q - ref))
            assert err <= tol.ATTN_BF16_ERROR_FACTOR * err_ref + tol.ATTN_FP32_ATOL, (err, err_ref)
        return out

    def _stored(self, x):
        """x: (n, Hkv, D) float64 rows as the cache gives them back (the cache write's reference)."""
        if self.kv_dtype == "float32":
            return x
        if self.kv_dtype == "bfloat16":
            return bf16_round(x).astype(np.float64)
        return kvq.fake_quantize_kv(x.astype(np.float32), KVQ_NAME[self.kv_dtype]).astype(np.float64)


MIXED = [[(0, 0, 5), (1, 0, 20), (2, 0, 37)],          # prefill, three sequences
         [(0, 5, 1), (1, 20, 3), (2, 37, 1)],          # decode + chunked prefill reading the cache
         [(2, 38, 1), (0, 6, 17), (1, 23, 1)]]         # order of sequences changes


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("H,Hkv,D,bs,kv_dtype,threads", [
    (2, 2, 16, 16, "float32", 2),      # MHA
    (4, 2, 32, 32, "float32", 2),      # GQA, block 32
    (6, 1, 24, 16, "float32", 1),      # MQA, head_dim not a multiple of 16
    (4, 2, 16, 16, "bfloat16", 2),     # bf16 cache
    (2, 1, 40, 32, "bfloat16", 1),
    (4, 2, 32, 16, "int8", 2),         # one-byte caches, GQA
    (6, 1, 24, 32, "int8", 1),         # MQA, head_dim not a multiple of 16
    (2, 2, 16, 16, "float8_e4m3", 2),
    (4, 2, 20, 32, "float8_e4m3", 1),  # head_dim with a tail of 4
])
def test_attention_mixed(tmp_path, isa, H, Hkv, D, bs, kv_dtype, threads):
    case = AttnCase(tmp_path, isa, H, Hkv, D, block_size=bs, kv_dtype=kv_dtype, threads=threads)
    for rows in MIXED:
        case.step(rows)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bs", [16, 32])
def test_attention_sliding_window(tmp_path, isa, bs):
    case = AttnCase(tmp_path, isa, 4, 2, 16, window=7, block_size=bs, seq_max=(90, 90, 90))
    for rows in MIXED:
        case.step(rows)
    # Blocks wholly before the window may be released (-1) by the runtime.
    case.step([(0, 23, 1), (1, 24, 40), (2, 39, 1)], drop_blocks_below_window=True)


@pytest.mark.parametrize("isa", ISAS)
# fp8 is left to make test: its reference decodes slowly
@pytest.mark.parametrize("kv_dtype", check_subset(["float32", "int8", "float8_e4m3"], keep=["float32", "int8"]))
def test_attention_long_context(tmp_path, isa, kv_dtype):
    case = AttnCase(tmp_path, isa, 2, 1, 64, block_size=16, kv_dtype=kv_dtype, seq_max=(1100,), num_blocks=72,
                    seed=3)
    case.step([(0, 0, 50)])
    case.step([(0, 50, 550)])   # tiles straddle 64-key blocks: some lanes see no key in a block
    case.step([(0, 600, 450)])
    case.step([(0, 1050, 1)])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16", "int8", "float8_e4m3"])
def test_attention_long_window(tmp_path, isa, kv_dtype):
    case = AttnCase(tmp_path, isa, 4, 4, 20, window=100, block_size=32, kv_dtype=kv_dtype,
                    seq_max=(300, 300), num_blocks=40, seed=4)
    case.step([(0, 0, 130), (1, 0, 3)])
    case.step([(1, 3, 150), (0, 130, 70)])
    case.step([(0, 200, 1), (1, 153, 1)], drop_blocks_below_window=True)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
def test_attention_sinks(tmp_path, isa, kv_dtype):
    """attention_sinks@1 (gpt-oss): tiles, decode rows and a window, then decode rows split
    across threads (the sink counted once when the chunks combine); sinks above and below
    the scores."""
    sinks = np.array([2.5, -1.0, 0.3, 6.0])
    case = AttnCase(tmp_path, isa, 4, 2, 16, window=7, kv_dtype=kv_dtype, sinks=sinks)
    for rows in MIXED:
        case.step(rows)
    (tmp_path / "split").mkdir()
    split = AttnCase(tmp_path / "split", isa, 3, 1, 20, kv_dtype=kv_dtype, threads=3, seq_max=(1010, 10),
                     num_blocks=70, seed=5, sinks=sinks[:3])
    split.step([(0, 0, 1000), (1, 0, 2)])
    split.step([(0, 1000, 1), (1, 2, 1)])


def test_attention_missing_block_rejected(tmp_path):
    case = AttnCase(tmp_path, "auto", 2, 2, 16)
    case.step([(0, 0, 20)])
    with pytest.raises(ValueError, match="block_tables"):
        case.ex.step(StepBatch(i32([1]), i32([20]), i32([0, 1]), i32([21]), i32([[case.tables[0][0], -1]]), i32([0])))


@pytest.mark.parametrize("isa", ISAS)
# three threads split the long row's keys unevenly and leave chunks of the short row empty
@pytest.mark.parametrize("threads", check_subset([1, 2, 3], keep=[3]))
@pytest.mark.parametrize("kv_dtype", check_subset(["float32", "bfloat16", "int8", "float8_e4m3"],
                                                  keep=["float32", "bfloat16", "int8"]))
def test_attention_decode_split(tmp_path, isa, threads, kv_dtype):
    """Decode rows of a long and a short sequence: few (row, KV head) units, so the key
    range is split across threads (some chunks of the short row are empty)."""
    case = AttnCase(tmp_path, isa, 3, 1, 20, block_size=16, kv_dtype=kv_dtype, threads=threads,
                    seq_max=(1010, 10), num_blocks=70, seed=5)
    case.step([(0, 0, 1000), (1, 0, 2)])
    case.step([(0, 1000, 1), (1, 2, 1)])
    case.step([(1, 3, 1)])
    case.step([(0, 1001, 2)])


KEY_BLOCK = 64  # attention.cpp's kKB: a query's keys are cut into blocks at its multiples


@pytest.mark.parametrize("isa", ISAS)
# the edit loop: a 16-bit and a one-byte cache (the codes' scales are in the key blocks too)
@pytest.mark.parametrize("kv_dtype,window,H,D", check_subset(
    [("float32", 0, 4, 32), ("bfloat16", 0, 4, 32), ("int8", 0, 4, 32), ("float8_e4m3", 0, 4, 32),
     ("bfloat16", 100, 4, 32), ("bfloat16", 0, 6, 64)],  # the last: SmolLM2's group of 3, head_dim 64
    keep=[("bfloat16", 0, 4, 32), ("int8", 0, 4, 32)]))
def test_attention_key_blocks_bit_identical_across_paths_batches_and_threads(tmp_path, isa, kv_dtype, window, H, D):
    """A prompt of five key blocks: each checked row's output has the same bits as the prompt's
    prefill row at its position (the tiles) whether it runs as a decode row alone (its key
    blocks spread over the threads), as a decode row among others' decodes and a prefill, or
    inside a short (row path) or long (tile path) prefill chunk; and whatever the thread count.
    Every step is also checked against the float64 reference."""
    Hkv, n = 2, 5 * KEY_BLOCK - 20
    checked = [0, KEY_BLOCK - 1, KEY_BLOCK, 2 * KEY_BLOCK + 3, 4 * KEY_BLOCK, n - 1]
    rng = np.random.default_rng(7)
    tokens = {s: rng.integers(0, 61, n) for s in range(4)}
    got = {}  # (threads, how, position) -> the row's output bits
    for threads in (1, 2, 3):
        (tmp_path / str(threads)).mkdir()
        case = AttnCase(tmp_path / str(threads), isa, H, Hkv, D, window=window, kv_dtype=kv_dtype, threads=threads,
                        seq_max=(n, n, n, n), num_blocks=4 * (n // 16 + 1), seed=9)
        out = case.step([(0, 0, n), (1, 0, n - 1), (2, 0, n - 2), (3, 0, n - 3)], tokens=tokens)
        bits = out.view(np.uint32)
        for p in checked:
            got[threads, "prefill", p] = bits[p]
            # the cache already holds every position: a step rewrites position p's K/V with the same bits
            got[threads, "decode alone", p] = case.step([(0, p, 1)], tokens=tokens).view(np.uint32)[0]
            mixed = case.step([(1, 5, 1), (0, p, 1), (2, n - 3, 1), (3, 0, 40)], tokens=tokens)
            got[threads, "decode in a batch", p] = mixed.view(np.uint32)[1]
            lo = max(0, p - 2)
            got[threads, "short chunk", p] = case.step([(0, lo, p - lo + 1)], tokens=tokens).view(np.uint32)[-1]
            lo = max(0, p - 29)
            got[threads, "long chunk", p] = case.step([(0, lo, p - lo + 1)], tokens=tokens).view(np.uint32)[-1]
    for (threads, how, p), row in got.items():
        assert np.array_equal(row, got[1, "prefill", p]), f"position {p}: {how} on {threads} threads != prefill"


def test_executor_extras(tmp_path):
    """kernels list, opt-in per-op profiling, an empty step, any integer dtype accepted."""
    ex = _C.Executor(_C.EngineFile(str(_simple_engine(tmp_path))), 2, 16, 4)
    assert ex.kernels == ["embedding@1", "linear@1"]
    assert not ex.profiling
    ex.profiling = True
    args = (np.array([1, 2], np.int64), i32([0, 1]), i32([0, 2]), i32([2]), i32([[0]]), i32([0, 1]))
    out = ex.step(StepBatch(*args))
    stats = ex.profile_stats()
    assert set(stats) == {"embedding", "linear"} and stats["linear"][0] == 1 and stats["linear"][1] >= 0
    np.testing.assert_array_equal(out, ex.step(StepBatch.of(*args)))
    empty = ex.step(StepBatch(i32([]), i32([]), i32([0]), i32([]), i32(np.zeros((0, 1))), i32([])))
    assert empty.shape == (0, 8)
