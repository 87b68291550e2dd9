"""Quantized mixture-of-experts weights on the cpu target (issue 34): every expert format
(float32, w8a16, w4a16, MXFP4 as gpt-oss ships it) through build_engine and LLM against HF
running the same fake-quantized expert weights (and, for w4a16, the same bf16-rounded expert
inputs the kernel reads). Oracle: tests/test_quantization.py's fake quantization of the
dense linears plus fake_quantize_experts here; tolerances from tests/tolerances.py."""

import copy
from dataclasses import dataclass
import json

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization.config import QuantConfig
from bessemer.runtime.llm import LLM
import tolerances as tol
from conftest import _hf_model, model_graph
from test_kernels import ISAS, assert_close, bf16_round, emb_step, load, make_plan, run_flat, step
from test_quantization import _C_header, _fake_quantize_hf, fake_quantize_rows
from tolerances import FAKE_QUANT_LOGITS_ATOL, FAKE_QUANT_LOGITS_RTOL, W4_BF16_FAKE_QUANT_LOGITS_RTOL

MOE_FAMILIES = ["mixtral", "qwen2-moe", "qwen3-moe", "gpt-oss"]
# a prompt of 150 tokens over 4 experts top-2 gives each expert more than one 64-token chunk
# of the grouped kernel (moe_grouped.h kExpertChunk); the short one is two decode-like steps
PROMPTS = [list(range(5, 155)), [7, 8, 9]]


# ---------------------------------------------------------------- the kernels against ops.ref_moe

def _expert_format(kind: str, layout: int, experts: int, k: int):
    """kind's stored format of a moe weight whose K is k (int4: groups of 32, or what divides K)."""
    from bessemer.quantization import primitives as prim
    from bessemer.quantization.formats import ExpertStack, Int4Group, Int8PerChannel, Mxfp4Experts

    if kind == "mxfp4":
        return Mxfp4Experts()
    g = prim.effective_group_size(k, 32)
    inner = {"w8": Int8PerChannel(), "w4": Int4Group(g, False), "w4zp": Int4Group(g, True)}[kind]
    return ExpertStack(inner, experts, layout == 1)


def _stored(name: str, w: np.ndarray, fmt):
    """(engine entries of w stored in fmt, the values they stand for in w's graph shape)."""
    from bessemer.format.container import TensorEntry
    from bessemer.quantization.formats import WeightCalibration
    from bessemer.targets.cpu.kernel_table import QUANT_KERNELS

    q, _ = fmt.store(w, WeightCalibration())
    layouts = QUANT_KERNELS[("moe", type(fmt))](fmt, w.shape).layouts
    entries = [TensorEntry(name + p.suffix, p.dtype, layouts.get(p.role, "row_major"), p.shape,
                           (lambda p=p: fmt.pack(p.role, q[p.role], layouts.get(p.role, "row_major"))))
               for p in fmt.parts(w.shape)]
    values = fmt.dequantize(q)  # (E*N, K) output rows
    if w.ndim == 3:  # input-major (E, K, N)
        values = np.swapaxes(values.reshape(w.shape[0], w.shape[2], w.shape[1]), 1, 2)
    return entries, values


KERNEL_CASES = [("w8", 0), ("w8", 1), ("w4", 0), ("w4zp", 1), ("mxfp4", 1)]


E_KERNEL, K_KERNEL = 4, 2  # experts and top-k of the expert kernel tests


@dataclass
class ExpertKernelRun:
    out: np.ndarray  # (150, hidden) the kernel's output
    x: np.ndarray  # (150, hidden + experts) its input rows: hidden states | router logits
    weights: list  # the stored experts' values (gate_up, down) and the biases, for ops.ref_moe
    dtypes: list  # the stored entries' dtypes
    hidden: int
    tokens: np.ndarray  # (150,) the embedding rows run
    path: object  # the engine file


def run_expert_kernel(tmp_path, isa, layout: int, I: int, std: float, seed: int, fmt_for, op: str,
                      attrs: dict | None = None, H: int = 64) -> ExpertKernelRun:
    """A plan of one embedding (hidden H | 4 router logits) and one `op` step over 4 random
    experts (top 2, expert size I, weights N(0, std), layout 0 Mixtral-like or 1 gpt-oss-like
    with biases) stored as fmt_for(weight), run on 150 tokens: more than one 64-token chunk
    for each expert."""
    from bessemer.format.container import TensorEntry, write_rank_file
    from bessemer.format.layouts import encode
    from bessemer.plugins import ops

    rng = np.random.default_rng(seed)
    E, V = E_KERNEL, 24
    base = {"num_experts": E, "top_k": K_KERNEL, "expert_size": I, "softmax_after_topk": layout,
            "norm_topk_prob": 1 - layout, "layout": layout, "activation": layout}
    shapes = ops.moe_weight_shapes(base, H)[:4 if layout else 2]
    ws = [(rng.standard_normal(s) * std).astype(np.float32) for s in shapes]
    entries, values = [], []
    for name, w in zip(("gu", "d"), ws[:2]):
        e, v = _stored(name, w, fmt_for(w))
        entries += e
        values.append(v)
    dtypes = [e.dtype for e in entries]
    floats = {"emb": (rng.standard_normal((V, H + E)) * 2).astype(np.float32), **dict(zip(("gub", "db"), ws[2:]))}
    entries += [TensorEntry(n, "float32", "row_major", a.shape, (lambda a=a: encode(a, "float32", "row_major")))
                for n, a in floats.items()]
    names = [e.name for e in entries if e.name not in ("emb", "gub", "db")] + ["gub", "db"][:len(ws) - 2]
    plan = make_plan([(H + E, "tokens"), (H, "tokens")],
                     [emb_step([0, 0, H + E]), step(op, [[0, 0, H], [0, H, E]], [[1, 0, H]], names,
                                                    dict(base, **(attrs or {})), 1)],
                     [1, 0, H], H)
    path = tmp_path / "k.engine"
    write_rank_file(path, {"rank": 0, "tp_size": 1, "target": "cpu", "isa_baseline": "avx2", "plan": plan}, entries)
    tokens = rng.integers(0, V, 150)
    out = run_flat(load(path, isa=isa)[1], tokens)
    return ExpertKernelRun(out, floats["emb"][tokens], values + ws[2:], dtypes, H, tokens, path)


def assert_small_batches_match(run: ExpertKernelRun, isa: str, what: str) -> None:
    """A token's output is bit-identical alone and among 2, 5 and 16 tokens (4 to 32 (token,
    expert) pairs: the driver's small-batch path, the routed experts' rows split over the
    threads in runs of whole panel groups) as among the 150 of run.out (2 threads, chunks of
    64 tokens per expert, the whole GEMM threaded): threads split rows, never K, and a row's
    arithmetic depends on K alone. With 3 threads the runs start and end inside experts (2
    routed experts of 2I = 176 rows, 3 panel groups each, make 2 groups per thread)."""
    for threads in (2, 3):
        _, ex = load(run.path, isa=isa, threads=threads)
        for r in (0, 1, 63, 64, 149):
            alone = np.asarray(run_flat(ex, run.tokens[r:r + 1]))
            assert np.array_equal(alone[0], run.out[r]), f"{what} {isa} {threads} threads: row {r} alone"
        for n in (2, 5, 16):
            assert np.array_equal(np.asarray(run_flat(ex, run.tokens[:n])), run.out[:n]), \
                f"{what} {isa} {threads} threads: {n} tokens"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kind,layout", KERNEL_CASES, ids=[f"{k}-layout{lay}" for k, lay in KERNEL_CASES])
def test_expert_kernel_matches_reference(tmp_path, isa, kind, layout):
    """moe_w8a16 / moe_w4a16 / moe_mxfp4 against ops.ref_moe on the values their stored
    experts stand for (w4a16: on bf16-rounded matmul inputs, as the kernel reads them); 150
    tokens over 4 experts give each expert more than one 64-token chunk; and the same tokens
    in small batches bit-identical to them (assert_small_batches_match; MXFP4's:
    test_moe_mxfp4_kernel.py). MXFP4 needs K in blocks of 32, so its expert size is 32."""
    from bessemer.plugins import ops

    # I = 88 as the tiny Mixtral's: down's K is not a multiple of 16 (int4: one group of 88)
    I = 32 if kind == "mxfp4" else 88
    op = {"w8": "moe_w8a16", "w4": "moe_w4a16", "w4zp": "moe_w4a16", "mxfp4": "moe_mxfp4"}[kind]
    run = run_expert_kernel(tmp_path, isa, layout, I, 0.3, 7, lambda w: _expert_format(kind, layout, E_KERNEL, w.shape[1]),
                            op, {"zero_point": int(kind == "w4zp")})
    x, H = run.x, run.hidden
    rounding = (lambda a: a.astype(np.float32).astype(np.float64)) if not kind.startswith("w4") else \
        (lambda a: bf16_round(a.astype(np.float32)).astype(np.float64))
    ref = ops.ref_moe(x[:, :H], x[:, H:], run.weights, E_KERNEL, K_KERNEL, I, layout, 1 - layout, layout, layout,
                      matmul_input=rounding)
    assert_close(run.out, ref, tol.W4_BF16_RTOL if kind.startswith("w4") else tol.MOE_RTOL,
                 tol.W4_BF16_ATOL if kind.startswith("w4") else tol.MOE_ATOL, op)
    if kind != "mxfp4":
        assert_small_batches_match(run, isa, op)


@pytest.mark.parametrize("isa", ISAS)
def test_w4_experts_at_a_long_k_match_reference_and_small_batches(tmp_path, isa):
    """moe_w4a16 (symmetric, groups of 32) with hidden 2112 > 1024: a decode step's experts
    are GEMVs that read K in one pass (int4 on bf16 activations, linear_driver.h), a chunk of
    up to 64 tokens a GEMM in K blocks of about 512; and one token's 2 experts go whole to
    each of 2 threads, but are split in panel groups over 3 (moe.cpp run_small_batch). Every
    way must give the same bits as the 150-token run, and that run the reference."""
    from bessemer.plugins import ops

    I, H = 88, 2112
    run = run_expert_kernel(tmp_path, isa, 0, I, 0.3, 11, lambda w: _expert_format("w4", 0, E_KERNEL, w.shape[1]),
                            "moe_w4a16", {"zero_point": 0}, H=H)
    ref = ops.ref_moe(run.x[:, :H], run.x[:, H:], run.weights, E_KERNEL, K_KERNEL, I, 0, 1, 0, 0,
                      matmul_input=lambda a: bf16_round(a.astype(np.float32)).astype(np.float64))
    assert_close(run.out, ref, tol.MOE_W4_LONG_K_RTOL, tol.W4_BF16_ATOL, "moe_w4a16 K 2112")
    assert_small_batches_match(run, isa, "moe_w4a16 K 2112")


def _round_bf16(t):
    return t.bfloat16().float()


def fake_quantize_experts(model, quant: QuantConfig) -> None:
    """Every HF experts module of `model` (stacked gate_up_proj / down_proj parameters) holds its
    experts' dequantize(quantize(rows)), each expert's output rows quantized as the builder
    does (tests/test_quantization.fake_quantize_rows). w4a16: the expert kernel reads its
    inputs rounded to bf16 (moe_quant.cpp), so the module's two matmul inputs are rounded too:
    the experts' input by a pre-hook, the down projection's by _apply_gate (transformers' experts
    implementations all compute act(gate, up) through it)."""
    import torch

    for _, mod in model.named_modules():
        # an experts module holds stacked Parameters (a dense MLP such as Phi-3's holds Linears)
        if not isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter):
            continue
        input_major = getattr(mod, "is_transposed", False)  # gpt-oss: (E, K, N) tensors
        with torch.no_grad():
            for p in (mod.gate_up_proj, mod.down_proj):
                w = p.detach().numpy().astype(np.float32)
                rows = np.swapaxes(w, 1, 2) if input_major else w  # (E, N, K)
                approx = np.stack([fake_quantize_rows(np.ascontiguousarray(r), quant) for r in rows])
                p.copy_(torch.from_numpy(np.ascontiguousarray(np.swapaxes(approx, 1, 2) if input_major else approx)))
        if quant.bits == 4:
            gate = mod._apply_gate
            mod._apply_gate = lambda gate_up, gate=gate: _round_bf16(gate(gate_up))
            mod.register_forward_pre_hook(lambda _m, args: (_round_bf16(args[0]),) + tuple(args[1:]))


def _plan_ops(engine) -> set[str]:
    return {s["op"] for s in json.loads(_C_header(engine))["plan"]["steps"]}


def _max_error(engine, hf, prompts=PROMPTS) -> tuple[float, float]:
    """(max |engine - HF| over the prompts' logits, max |HF|)."""
    import torch

    llm = LLM(engine, num_threads=2)
    try:
        got = llm.score(prompts, num_prefill=2)
    finally:
        llm.close()
    err, top = 0.0, 0.0
    for ids, g in zip(prompts, got):
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].numpy()
        err, top = max(err, float(np.abs(g - ref).max())), max(top, float(np.abs(ref).max()))
    return err, top


CASES = [(kind, quant) for kind in MOE_FAMILIES
         for quant in (QuantConfig("w8a16", lm_head="none"), QuantConfig("w4a16", group_size=32, lm_head="none"))]


@pytest.mark.parametrize("kind,quant", CASES, ids=[f"{k}-{q.mode}" for k, q in CASES])
def test_quantized_experts_match_fake_quantized_hf(kind, quant, tiny_checkpoint, tmp_path):
    ckpt = tiny_checkpoint(kind)
    lines = []
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4), progress=lines.append)
    kernel = "moe_w8a16" if quant.bits == 8 else "moe_w4a16"
    assert kernel in _plan_ops(engine) and "moe" not in _plan_ops(engine)
    assert "experts: RTN" in lines
    report = json.loads((engine / "build_report.json").read_text())
    experts = {k: v for k, v in report["quant_error"].items() if ".experts." in k}
    assert experts and all(v["algorithm"] == "rtn" for v in experts.values())
    hf = _fake_quantize_hf(copy.deepcopy(_hf_model(str(ckpt), "float32")), quant)
    err, top = _max_error(engine, hf)
    rtol = W4_BF16_FAKE_QUANT_LOGITS_RTOL if quant.bits == 4 else FAKE_QUANT_LOGITS_RTOL
    print(f"{kind} {quant.mode}: max |engine - fake-quantized HF| = {err:.2e} (max |HF| {top:.2f})")
    assert err <= FAKE_QUANT_LOGITS_ATOL + rtol * top


def test_float32_experts_grouped_kernel_matches_hf(tiny_checkpoint, tmp_path):
    """moe@1 (fp32 experts, grouped by expert): the long prompt runs several chunks per expert."""
    ckpt = tiny_checkpoint("mixtral")
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(kv_block_size=4))
    assert "moe" in _plan_ops(engine)
    err, top = _max_error(engine, _hf_model(str(ckpt), "float32"))
    assert err <= FAKE_QUANT_LOGITS_ATOL + FAKE_QUANT_LOGITS_RTOL * top


def _mxfp4_checkpoints(src, tmp_path):
    """The tiny gpt-oss with its experts in MXFP4 (blocks, scales and the quantization_config
    the released checkpoints carry), and the same weights dequantized by transformers' own
    decoder for HF to run."""
    import torch
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    from bessemer.quantization.mxfp4 import BLOCK, encode_mxfp4_rows

    tensors = load_file(src / "model.safetensors")
    packed, dense = dict(tensors), dict(tensors)
    for name in [n for n in tensors if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        w = tensors[name]  # (E, K, N)
        pairs = [encode_mxfp4_rows(np.ascontiguousarray(e.T)) for e in w]
        blocks = np.stack([c.reshape(c.shape[0], -1, BLOCK // 2) for c, _ in pairs])  # (E, N, K/32, 16)
        scales = np.stack([s for _, s in pairs])
        del packed[name]
        packed[f"{name}_blocks"], packed[f"{name}_scales"] = blocks, scales
        dense[name] = convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales),
                                                 dtype=torch.float32).numpy()
    config = json.loads((src / "config.json").read_text())
    for out, t, cfg in (("mxfp4", packed, dict(config, quantization_config={"quant_method": "mxfp4"})),
                        ("dense", dense, config)):
        (tmp_path / out).mkdir()
        (tmp_path / out / "config.json").write_text(json.dumps(cfg))
        save_file(t, tmp_path / out / "model.safetensors", metadata={"format": "pt"})
    return tmp_path / "mxfp4", tmp_path / "dense"


def test_mxfp4_experts_kept_as_shipped(tiny_checkpoint, tmp_path):
    """No --quant: gpt-oss's MXFP4 experts are stored as their codes and scales (uint8, the
    checkpoint's bytes) and read by moe_mxfp4; logits equal HF on the dequantized weights."""
    from safetensors.numpy import load_file

    mxfp4, dense = _mxfp4_checkpoints(tiny_checkpoint("gpt-oss"), tmp_path)
    engine = build_engine(mxfp4, tmp_path / "e", BuildConfig(kv_block_size=4))
    assert "moe_mxfp4" in _plan_ops(engine) and "moe" not in _plan_ops(engine)
    header = json.loads(_C_header(engine))
    tensors = {t["name"]: t for t in header["tensors"]}
    shipped = load_file(mxfp4 / "model.safetensors")
    name = "model.layers.0.mlp.experts.gate_up_proj"
    e, n, g, _ = shipped[name + "_blocks"].shape
    assert tuple(tensors[name]["shape"]) == (e * n, g * 16) and tuple(tensors[name + ".scales"]["shape"]) == (e * n, g)
    raw = (engine / "rank0.engine").read_bytes()
    data = len(raw) - header["data_size"]  # the tensor data section ends the file

    def stored(t):
        return raw[data + t["offset"]:data + t["offset"] + t["nbytes"]]

    # the checkpoint's own codes and scales, byte for byte (uint8, row-major)
    assert stored(tensors[name]) == shipped[name + "_blocks"].tobytes()
    assert stored(tensors[name + ".scales"]) == shipped[name + "_scales"].tobytes()
    err, top = _max_error(engine, _hf_model(str(dense), "float32"))
    print(f"gpt-oss mxfp4: max |engine - HF| = {err:.2e} (max |HF| {top:.2f})")
    assert err <= FAKE_QUANT_LOGITS_ATOL + FAKE_QUANT_LOGITS_RTOL * top


def test_mxfp4_experts_requantized_by_quant(tiny_checkpoint, tmp_path):
    """--quant w4a16 on an MXFP4 checkpoint requantizes the dequantized experts (moe_w4a16)."""
    mxfp4, dense = _mxfp4_checkpoints(tiny_checkpoint("gpt-oss"), tmp_path)
    quant = QuantConfig("w4a16", group_size=32, lm_head="none")
    engine = build_engine(mxfp4, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4))
    assert "moe_w4a16" in _plan_ops(engine) and "moe_mxfp4" not in _plan_ops(engine)
    hf = _fake_quantize_hf(copy.deepcopy(_hf_model(str(dense), "float32")), quant)
    err, top = _max_error(engine, hf)
    assert err <= FAKE_QUANT_LOGITS_ATOL + W4_BF16_FAKE_QUANT_LOGITS_RTOL * top


def test_expert_notes_say_how_experts_are_stored(tiny_checkpoint):
    """AWQ searches each expert's grids and scales its down (gpt-oss: no down scales; with
    --zero-point RTN grids), GPTQ calibrates each expert, modes without an expert kernel keep
    them fp32, and the build log says so (never silently)."""
    from bessemer.builder.passes.quantize import expert_notes
    from bessemer.builder.pipeline import run_passes

    graph, _ = model_graph(tiny_checkpoint("mixtral"))
    awq = BuildConfig(quant=QuantConfig("w4a16-awq", calib_data="unused.txt", group_size=32))
    searched = ("gate/up and down grids searched per expert for their output error on the calibration tokens routed "
                "to it")
    fallback = "RTN for an expert fewer than 16 calibration tokens reach"
    assert expert_notes(run_passes(graph, awq)[0], awq) == [
        f"experts: AWQ: {searched}; down scaled per expert from those tokens (folded into its up rows); {fallback}"]
    oss, _ = model_graph(tiny_checkpoint("gpt-oss"))
    no_fold = "no down scales (gpt-oss's clamped activation takes no exact per-expert fold)"
    assert expert_notes(run_passes(oss, awq)[0], awq) == [f"experts: AWQ: {searched}; {no_fold}; {fallback}"]
    awq_zp = BuildConfig(quant=QuantConfig("w4a16-awq", calib_data="unused.txt", group_size=32, zero_point=True))
    assert expert_notes(run_passes(oss, awq_zp)[0], awq_zp) == [
        f"experts: AWQ: grids RTN (--zero-point's min/max grid has no scale search); {no_fold}; {fallback}"]
    gptq = BuildConfig(quant=QuantConfig("w4a16-gptq", calib_data="unused.txt", group_size=32))
    assert expert_notes(run_passes(graph, gptq)[0], gptq) == [
        "experts: GPTQ per expert from the calibration tokens routed to it (RTN for an expert fewer than 16 reach)"]
    sq = BuildConfig(quant=QuantConfig("w8a8-sq", calib_data="unused.txt"))
    assert expert_notes(graph, sq) == ["experts: float32 (no w8a8-sq expert kernel; w8a16, w4a16 and fp8 quantize experts)"]
    tp2 = BuildConfig(quant=QuantConfig("w8a16"), tp_size=2)
    # the tiny Mixtral's experts of 88 split to 44 per rank: 88 gate_up rows are not whole panels of 16
    assert expert_notes(graph, tp2) == ["experts: float32 (2 * expert_size (per rank at --tp 2: 44) and hidden_size "
                                        "must be multiples of 16 for quantized experts)"]
    assert expert_notes(graph, BuildConfig()) == []
    # the cuda target's int4 experts need groups of a multiple of 32: the tiny Mixtral's down
    # (K = 88, one group of 88) keeps its experts unquantized there, and the log says why
    cuda = BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig("w4a16", group_size=32))
    assert expert_notes(graph, cuda) == ["experts: float32 (4-bit groups of 88 (its 88 input features) are not a "
                                         "multiple of 32, which the cuda kernels need; use --group-size 32, 64 or "
                                         "128 with a model whose widths they divide)"]
    cuda_w8 = BuildConfig(target="cuda", dtype="bfloat16", quant=QuantConfig("w8a16"))
    assert expert_notes(run_passes(graph, cuda_w8)[0], cuda_w8) == ["experts: RTN"]


@pytest.mark.parametrize("isa", ISAS)
def test_mxfp4_engine_requests_are_batch_invariant(tiny_checkpoint, tmp_path, isa):
    """gpt-oss with MXFP4 experts, both ISAs: a request's tokens and logprobs are bit-identical
    alone (its decode steps in the expert driver's small-batch path) and inside batches of 3
    and 16 other requests (steps with more (token, expert) pairs than a chunk: chunked)."""
    from invariance import assert_same_alone_and_in_batches

    mxfp4, _ = _mxfp4_checkpoints(tiny_checkpoint("gpt-oss"), tmp_path)
    engine = build_engine(mxfp4, tmp_path / "e", BuildConfig(kv_block_size=4))
    assert "moe_mxfp4" in _plan_ops(engine)
    llm = LLM(engine, num_threads=2, isa=isa, enable_prefix_caching=False)
    try:
        assert_same_alone_and_in_batches(llm)
    finally:
        llm.close()
