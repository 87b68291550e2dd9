"""Calibration per expert (issue 34): w4a16-gptq (and fp8, whose default rounding is GPTQ's)
chooses each expert's codes from the Hessian of the calibration tokens the router sends to it, w4a16-awq searches each expert's gate/up
grid for its output error on them and scales its down from its own activations
on them (folded into its up rows), RTN for an expert too few reach.
Oracles: HF running the engine's own stored expert values (read back from the rank file),
and HF's own routing and expert inputs on the calibration text for the error each expert
makes. Only the experts are quantized here (the linears are excluded), so HF
holds exactly what the engine holds."""

import copy
import json

import numpy as np
import pytest

from bessemer.builder.build import build_engine
from bessemer.builder.config import BuildConfig
from bessemer.quantization.config import QuantConfig
from bessemer.quantization.expert_calibration import MIN_EXPERT_TOKENS
from conftest import _hf_model, make_tiny_checkpoint
from test_families import _with_word_tokenizer
from test_moe_quant import MOE_FAMILIES, _max_error, _plan_ops, _round_bf16
from test_quantization import fake_quantize_rows
from tolerances import FAKE_QUANT_LOGITS_ATOL, W4_BF16_FAKE_QUANT_LOGITS_RTOL

# experts only: every linear (attention, dense and shared MLPs) and Qwen2-MoE's shared-expert gate stay fp32
EXPERTS_ONLY = ("*_proj", "*shared_expert_gate")
CALIB = dict(calib_samples=4, calib_seq_len=64)


def _quant(calibration_text, mode="w4a16-gptq", **extra) -> QuantConfig:
    return QuantConfig(mode, calib_data=str(calibration_text), group_size=32, lm_head="none",
                       exclude_modules=EXPERTS_ONLY, **{**CALIB, **extra})


@pytest.fixture(scope="module")
def calibrated_engine(tiny_checkpoint, calibration_text, tmp_path_factory):
    """(kind, mode) -> (HF checkpoint with a word tokenizer, its engine, build log): built once each."""
    built = {}

    def get(kind, mode="w4a16-gptq"):
        if (kind, mode) not in built:
            root = tmp_path_factory.mktemp(f"{mode}-{kind}")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("BESSEMER_CACHE", str(root / "cache"))
                # mixtral-128: experts of 128, whose down has 4-bit groups of 32 (the tiny Mixtral's 88 is one group a row)
                base = (make_tiny_checkpoint("mixtral", root / "base", intermediate_size=128) if kind == "mixtral-128"
                        else tiny_checkpoint(kind))
                ckpt = _with_word_tokenizer(base, root / "hf")
                lines = []
                engine = build_engine(ckpt, root / "e", BuildConfig(quant=_quant(calibration_text, mode), kv_block_size=4),
                                      progress=lines.append)
            built[kind, mode] = (ckpt, engine, lines)
        return built[kind, mode]

    return get


def engine_expert_rows(engine, name: str, rank: int = 0) -> np.ndarray:
    """The (E*N, K) values an engine's 4-bit or E4M3 expert stack `name` stores (codes and
    scales read back from rank{rank}.engine and unpacked from their layouts)."""
    from bessemer import _C
    from bessemer.format import layouts
    from bessemer.format.dtypes import DTYPE_IDS, bfloat16_bits_to_float32
    from bessemer.quantization import primitives as prim

    path = engine / f"rank{rank}.engine"
    header = json.loads(_C.EngineFile(str(path)).header)
    tensors = {t["name"]: t for t in header["tensors"]}
    raw = path.read_bytes()
    data = len(raw) - header["data_size"]
    layout_names = {v: k for k, v in layouts.LAYOUT_IDS.items()}

    def stored(t, dtype):
        return np.frombuffer(raw, dtype, t["nbytes"] // np.dtype(dtype).itemsize, data + t["offset"])

    codes_t, scales_t = tensors[name], tensors[name + ".scales"]
    n, k = codes_t["shape"]
    if codes_t["dtype"] == DTYPE_IDS["float8_e4m3"]:  # panel16 codes, a float32 scale per output row
        from bessemer.quantization import fp8

        assert layout_names[codes_t["layout"]] == "panel16" and scales_t["shape"] == [n]
        codes = layouts.unpack_panel16(stored(codes_t, np.uint8), n, k)
        return fp8.dequantize_fp8_per_channel(codes, stored(scales_t, np.float32))
    assert name + ".offsets" not in tensors  # symmetric codes: offset = -8 * scale
    unpack = {"panel16_int4_k8": layouts.unpack_panel16_int4_k8, "panel16_int4": layouts.unpack_panel16_int4}
    codes = unpack[layout_names[codes_t["layout"]]](stored(codes_t, np.uint8), n, k)
    g = scales_t["shape"][1]
    scale = bfloat16_bits_to_float32(layouts.unpack_panel16(stored(scales_t, np.uint16), n, g))
    return prim.dequantize_int4(codes, scale, -8.0 * scale, k // g)


def _experts_modules(model):
    """(layer index, experts module) of a HF model: the modules holding stacked expert Parameters."""
    import torch

    for name, mod in model.named_modules():
        if isinstance(getattr(mod, "gate_up_proj", None), torch.nn.Parameter):
            yield int(name.split(".layers.")[1].split(".")[0]), mod


def _engine_name(engine, layer: int, matrix: str) -> str:
    from bessemer import _C

    names = [t["name"] for t in json.loads(_C.EngineFile(str(engine / "rank0.engine")).header)["tensors"]]
    return next(n for n in names if f".layers.{layer}." in n and n.split(".experts.")[-1] in (matrix, matrix + ".weight"))


def _hf_rows(mod, matrix: str) -> np.ndarray:
    """An experts module's gate_up or down as (E, N, K) output rows (gpt-oss stores (E, K, N))."""
    w = getattr(mod, matrix).detach().numpy().astype(np.float32)
    return np.swapaxes(w, 1, 2) if getattr(mod, "is_transposed", False) else w


def _set_hf_rows(mod, matrix: str, rows: np.ndarray) -> None:
    import torch

    p = getattr(mod, matrix)
    with torch.no_grad():
        p.copy_(torch.from_numpy(np.ascontiguousarray(np.swapaxes(rows, 1, 2) if getattr(mod, "is_transposed", False)
                                                      else rows)))


def _with_engine_experts(model, engine):
    """model whose experts hold the engine's stored values, reading bf16-rounded inputs as the
    w4a16 expert kernel does (test_moe_quant.fake_quantize_experts' rounding)."""
    for layer, mod in _experts_modules(model):
        for matrix in ("gate_up_proj", "down_proj"):
            e, n, k = _hf_rows(mod, matrix).shape
            _set_hf_rows(mod, matrix, engine_expert_rows(engine, _engine_name(engine, layer, matrix)).reshape(e, n, k))
        gate = mod._apply_gate
        mod._apply_gate = lambda gate_up, gate=gate: _round_bf16(gate(gate_up))
        mod.register_forward_pre_hook(lambda _m, args: (_round_bf16(args[0]),) + tuple(args[1:]))
    return model


ENGINE_CASES = [(kind, "w4a16-gptq") for kind in MOE_FAMILIES] + [(kind, "w4a16-awq")
                                                                   for kind in ("mixtral", "qwen2-moe", "gpt-oss")]


@pytest.mark.parametrize("kind,mode", ENGINE_CASES, ids=[f"{k}-{m}" for k, m in ENGINE_CASES])
def test_calibrated_experts_match_hf_on_the_engines_own_values(kind, mode, calibrated_engine):
    """The engine with per-expert calibrated experts against HF holding the engine's stored
    expert values (AWQ: the scaled up rows and down columns as stored): the kernels read the
    codes as stored, and the build log says per layer which experts were calibrated."""
    ckpt, engine, lines = calibrated_engine(kind, mode)
    assert "moe_w4a16" in _plan_ops(engine)
    report = json.loads((engine / "build_report.json").read_text())
    experts = {k: v for k, v in report["quant_error"].items() if ".experts." in k}
    assert set(report["quant_error"]) == set(experts)  # the linears are excluded: HF holds what the engine holds
    if mode == "w4a16-gptq":
        assert any(line.startswith("experts: GPTQ per expert") for line in lines)
        assert experts and all(v["algorithm"] == "gptq" and v["experts_calibrated"] >= 1 for v in experts.values())
        for name, v in experts.items():
            assert sum(f" {name}: GPTQ for {v['experts_calibrated']}/{v['experts']} experts" in f" {line}" for line in lines) == 1
    else:
        assert any(line.startswith("experts: AWQ: gate/up and down grids searched per expert for their output error")
                   for line in lines)
        assert experts and all(v["algorithm"] == "awq" and v["experts_calibrated"] >= 1 for v in experts.values())
        for name, v in experts.items():
            assert sum(f" {name}: AWQ grid searched on the output error for {v['experts_calibrated']}/{v['experts']} experts"
                       in f" {line}" for line in lines) == 1
        # the down's scales fold into the up rows where the activation is silu(gate) * up (not gpt-oss's clamp)
        assert ("awq_experts" in report["calibration"]) == (kind != "gpt-oss")
        for node, r in report["calibration"].get("awq_experts", {}).items():
            assert r["experts_awq"] >= 1 and r["experts_awq"] + len(r["rtn_fallback"]) == len(r["expert_tokens"])
            assert sum(line.startswith(f"{node}: AWQ for the down of {r['experts_awq']}/") for line in lines) == 1
    hf = _with_engine_experts(copy.deepcopy(_hf_model(str(ckpt), "float32")), engine)
    err, top = _max_error(engine, hf)
    print(f"{kind} {mode} experts: max |engine - HF on the engine's values| = {err:.2e} (max |HF| {top:.2f})")
    assert err <= FAKE_QUANT_LOGITS_ATOL + W4_BF16_FAKE_QUANT_LOGITS_RTOL * top


def _round_to_nearest(w: np.ndarray, quant: QuantConfig) -> np.ndarray:
    """(N, K) rows as the mode stores them without calibration (E4M3 per row, or int4 groups)."""
    from bessemer.quantization import fp8

    if quant.mode == "fp8":
        return fp8.dequantize_fp8_per_channel(*fp8.quantize_fp8_per_channel(w))
    return fake_quantize_rows(w, quant)


def _routed_inputs(ckpt, spec):
    """{layer: (x (T, H), top_k_index (T, k))}: what HF's experts modules receive on the
    calibration windows (transformers' own routing)."""
    import torch

    from bessemer.quantization.calibration import calibration_windows

    model = _hf_model(str(ckpt), "float32")
    seen, handles = {}, []
    for layer, mod in _experts_modules(model):
        def record(_m, args, layer=layer):
            x = args[0].detach().reshape(-1, args[0].shape[-1])  # (T, H)
            top = args[1].detach().reshape(x.shape[0], -1)  # (T, k)
            prev = seen.get(layer, (np.zeros((0, x.shape[1]), np.float32), np.zeros((0, top.shape[1]), np.int64)))
            seen[layer] = (np.concatenate([prev[0], x.numpy()]), np.concatenate([prev[1], top.numpy()]))
        handles.append(mod.register_forward_pre_hook(record))
    with torch.no_grad():
        for w in calibration_windows(ckpt, spec):
            model(torch.tensor([w]))
    for h in handles:
        h.remove()
    return model, seen


def _expert_out(x, gate_up, down, mod, e, activation):
    """Expert e's output on rows x (R, H) with gate_up (2I, H) and down (H, I) output rows."""
    from bessemer.plugins.ops import ref_expert_hidden

    gu = x @ gate_up.T
    bias = getattr(mod, "gate_up_proj_bias", None)
    if bias is not None:
        gu = gu + bias[e].detach().numpy()
    y = ref_expert_hidden(gu.astype(np.float64), activation, getattr(mod, "is_transposed", False)) @ down.T
    bias = getattr(mod, "down_proj_bias", None)
    return y + (bias[e].detach().numpy() if bias is not None else 0.0)


# (kind, mode, bound on each calibrated expert's error ratio, bound on the layer's summed ratio).
# AWQ runs on experts of 128 (down in 4-bit groups of 32): measured 0.25-0.46 per expert,
# summed 0.27-0.29 (the down's scales and both matrices' grids searched for their output
# error; the down's scales with RTN grids alone measured 0.81-0.95 per expert). On the tiny
# Mixtral's down (K = 88, one group a row) AWQ's scales alone measured 1.03-1.21, worse than
# RTN, though their own search loss said 0.35-0.84: awq.search_scale compares candidates on the
# unsearched grid, and the stored codes use the searched one (scale_search.py)
# fp8 (its default GPTQ rounding of the E4M3 codes, the grid a per-row scale): measured 0.138-0.184
# per expert, summed 0.164 (the tiny Qwen3-MoE's one sparse layer)
ERROR_CASES = [("mixtral", "w4a16-gptq", 0.3, 0.2), ("gpt-oss", "w4a16-gptq", 0.3, 0.2),
               ("mixtral-128", "w4a16-awq", 0.7, 0.5), ("qwen3-moe", "fp8", 0.3, 0.25)]


@pytest.mark.parametrize("kind,mode,each,summed", ERROR_CASES, ids=[f"{k}-{m}" for k, m, _, _ in ERROR_CASES])
def test_calibration_lowers_each_experts_error_on_its_routed_tokens(kind, mode, each, summed, calibrated_engine,
                                                                    calibration_text):
    """Per expert, on the calibration tokens HF routes to it: the output error of the engine's
    calibrated expert (vs its fp32 weights) is below that of the same expert stored RTN, for
    each calibrated expert and summed over the layer (GPTQ: a fraction of it), and the experts
    the build left RTN are those HF routes fewer than MIN_EXPERT_TOKENS tokens to."""
    from bessemer.quantization.calibration import CalibrationSpec

    ckpt, engine, _ = calibrated_engine(kind, mode)
    report = json.loads((engine / "build_report.json").read_text())
    quant = _quant(calibration_text, mode)
    model, seen = _routed_inputs(ckpt, CalibrationSpec(calibration_text, CALIB["calib_samples"], CALIB["calib_seq_len"]))
    activation = int(kind == "gpt-oss")
    for layer, mod in _experts_modules(model):
        x, top = seen[layer]
        names = {m: _engine_name(engine, layer, m) for m in ("gate_up_proj", "down_proj")}
        fallback = (report["quant_error"][names["gate_up_proj"]]["rtn_fallback"] if mode != "w4a16-awq" else
                    report["calibration"]["awq_experts"][names["gate_up_proj"].split(".gate_up_proj")[0]]["rtn_fallback"])
        fp32 = {m: _hf_rows(mod, m) for m in names}
        stored = {m: engine_expert_rows(engine, n).reshape(fp32[m].shape) for m, n in names.items()}
        ratios, sums = [], [0.0, 0.0]
        for e in range(fp32["gate_up_proj"].shape[0]):
            rows = x[(top == e).any(axis=1)]
            assert (len(rows) < MIN_EXPERT_TOKENS) == (str(e) in fallback)  # the build's routing is HF's
            if str(e) in fallback:
                continue
            ref = _expert_out(rows, fp32["gate_up_proj"][e], fp32["down_proj"][e], mod, e, activation)
            rtn = {m: _round_to_nearest(fp32[m][e], quant) for m in names}
            errs = [float(((_expert_out(rows, w["gate_up_proj"], w["down_proj"], mod, e, activation) - ref) ** 2).sum())
                    for w in ({m: stored[m][e] for m in names}, rtn)]
            ratios.append(errs[0] / errs[1])
            sums = [sums[0] + errs[0], sums[1] + errs[1]]
        print(f"{kind} {mode} layer {layer}: calibrated / RTN output error per calibrated expert {np.round(ratios, 3).tolist()}, "
              f"summed {sums[0] / sums[1]:.3f}")
        # GPTQ measured: per expert 0.045-0.131, summed 0.055-0.119; from the Hessians of the next
        # expert's tokens instead: per-expert maxima 0.64, 0.91, 0.84 and 61 in the four layers
        assert ratios and sums[0] < summed * sums[1] and max(ratios) < each


# (kind, bound on each calibrated expert's ratio, bound on the layer's summed ratio); the
# engines are ENGINE_CASES' and ERROR_CASES' (built once by calibrated_engine)
# Measured: per expert 0.22-0.80 and one of 1.06 (Qwen2-MoE layer 1: the search minimises each
# group's share of the error, the cross terms between a row's groups left out), summed 0.25-0.38
GATE_UP_CASES = [("mixtral-128", 1.1, 0.5), ("qwen2-moe", 1.1, 0.5), ("gpt-oss", 1.1, 0.5)]


@pytest.mark.parametrize("kind,each,summed", GATE_UP_CASES, ids=[k for k, _, _ in GATE_UP_CASES])
def test_awq_grid_search_lowers_each_experts_gate_up_error(kind, each, summed, calibrated_engine, calibration_text):
    """w4a16-awq's gate/up path, per expert, on the calibration tokens HF routes to it: the
    error of x @ W^T of the engine's stored gate/up (each group's scale searched for its share
    of that error) vs the same rows stored RTN, for each calibrated expert and summed over the
    layer. Layout 0 folds the down's AWQ 1/s into the up rows, so there only the gate rows
    (no fold) are compared; gpt-oss's interleaved gate/up rows are all compared."""
    from bessemer.quantization.calibration import CalibrationSpec

    ckpt, engine, _ = calibrated_engine(kind, "w4a16-awq")
    report = json.loads((engine / "build_report.json").read_text())
    quant = _quant(calibration_text, "w4a16-awq")
    model, seen = _routed_inputs(ckpt, CalibrationSpec(calibration_text, CALIB["calib_samples"], CALIB["calib_seq_len"]))
    for layer, mod in _experts_modules(model):
        x, top = seen[layer]
        name = _engine_name(engine, layer, "gate_up_proj")
        fallback = report["quant_error"][name]["rtn_fallback"]
        fp32 = _hf_rows(mod, "gate_up_proj")  # (E, 2I, H)
        stored = engine_expert_rows(engine, name).reshape(fp32.shape)
        compared = slice(None) if kind == "gpt-oss" else slice(0, fp32.shape[1] // 2)  # layout 0: [gate | up]
        ratios, sums = [], [0.0, 0.0]
        for e in range(fp32.shape[0]):
            rows = x[(top == e).any(axis=1)]
            assert (len(rows) < MIN_EXPERT_TOKENS) == (str(e) in fallback)
            if str(e) in fallback:
                continue
            w = fp32[e][compared]
            errs = [float(((rows @ (q - w).T) ** 2).sum()) for q in (stored[e][compared], fake_quantize_rows(w, quant))]
            ratios.append(errs[0] / errs[1])
            sums = [sums[0] + errs[0], sums[1] + errs[1]]
        print(f"{kind} w4a16-awq layer {layer}: gate/up output error, searched / RTN, per calibrated expert "
              f"{np.round(ratios, 3).tolist()}, summed {sums[0] / sums[1]:.3f}")
        assert ratios and sums[0] < summed * sums[1] and max(ratios) < each


@pytest.mark.parametrize("mode,by", [("w4a16-gptq", "GPTQ"), ("w4a16-awq", "AWQ grid searched on the output error")])
def test_experts_no_token_reaches_fall_back_to_rtn(mode, by, tiny_checkpoint, calibration_text, tmp_path, monkeypatch):
    """2 calibration tokens (top-2: 4 routes) give no expert the MIN_EXPERT_TOKENS it needs:
    every expert is stored RTN (exactly the values fake_quantize_rows gives: AWQ scales no
    expert's down either), and the report and the build log list each with its tokens."""
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    ckpt = _with_word_tokenizer(tiny_checkpoint("mixtral"), tmp_path / "hf")
    quant = _quant(calibration_text, mode, calib_samples=1, calib_seq_len=2)
    lines = []
    engine = build_engine(ckpt, tmp_path / "e", BuildConfig(quant=quant, kv_block_size=4), progress=lines.append)
    report = json.loads((engine / "build_report.json").read_text())
    model = _hf_model(str(ckpt), "float32")
    for layer, mod in _experts_modules(model):
        for m in ("gate_up_proj", "down_proj"):
            name = _engine_name(engine, layer, m)
            v = report["quant_error"][name]
            assert v["algorithm"] == "rtn" and v["experts_calibrated"] == 0
            assert v["rtn_fallback"] == {str(e): t for e, t in enumerate(v["expert_tokens"])}
            assert sum(v["expert_tokens"]) == 2 * 2  # 2 tokens, top-2
            assert any(line.startswith(f"{name}: {by} for 0/4 experts") and "RTN for 4: 0 (" in line for line in lines)
            fp32 = _hf_rows(mod, m)
            rtn = np.concatenate([fake_quantize_rows(w, quant) for w in fp32])
            np.testing.assert_array_equal(engine_expert_rows(engine, name), rtn)
    if mode == "w4a16-awq":
        assert all(r["experts_awq"] == 0 and len(r["rtn_fallback"]) == 4
                   for r in report["calibration"]["awq_experts"].values())


@pytest.mark.parametrize("mode", ["w4a16-gptq", "w4a16-awq"])
@pytest.mark.parametrize("kind", ["mixtral-128", "gpt-oss"])
def test_calibrated_experts_under_tp2_are_the_tp1_experts_sliced(kind, mode, tiny_checkpoint, calibration_text,
                                                                 tmp_path, monkeypatch):
    """--tp 2: the ranks store the tp1 engine's calibrated experts, sliced, bit for bit. Mixtral
    (experts of 128): each rank holds every expert's half of the intermediate features; down's
    K is cut, so its experts are quantized on the full matrices (GPTQ's whole-row error
    propagation; AWQ's output error over every input channel) then cut; gate/up rows are cut,
    and both treat rows independently. gpt-oss: each rank holds whole experts, calibrated with
    their own global index's tokens."""
    monkeypatch.setenv("BESSEMER_CACHE", str(tmp_path / "cache"))
    # intermediate 128: each rank's 64 is whole panels of 16 and whole 4-bit groups of 32
    base = (make_tiny_checkpoint("mixtral", tmp_path / "base", intermediate_size=128) if kind == "mixtral-128"
            else tiny_checkpoint(kind))
    ckpt = _with_word_tokenizer(base, tmp_path / "hf")
    opts = dict(quant=_quant(calibration_text, mode), kv_block_size=4, max_num_tokens=24)
    e1 = build_engine(ckpt, tmp_path / "tp1", BuildConfig(**opts))
    e2 = build_engine(ckpt, tmp_path / "tp2", BuildConfig(tp_size=2, **opts))
    tp1, tp2 = (json.loads((e / "build_report.json").read_text())["quant_error"] for e in (e1, e2))
    for layer in (0, 1):
        gate_up, down = (_engine_name(e1, layer, m) for m in ("gate_up_proj", "down_proj"))
        full_gu, full_down = engine_expert_rows(e1, gate_up), engine_expert_rows(e1, down)
        for r in (0, 1):
            assert tp2[f"{down}[rank{r}]"]["algorithm"] == mode.split("-")[1]
            if kind == "gpt-oss":  # experts [2r, 2r + 2) whole
                assert tp2[f"{gate_up}[rank{r}]"]["expert_tokens"] == tp1[gate_up]["expert_tokens"][2 * r:2 * r + 2]
                for name, full in ((gate_up, full_gu), (down, full_down)):
                    rows = len(full) // 2
                    np.testing.assert_array_equal(engine_expert_rows(e2, name, r), full[rows * r:rows * (r + 1)])
                continue
            half = slice(64 * r, 64 * (r + 1))
            np.testing.assert_array_equal(engine_expert_rows(e2, gate_up, r).reshape(4, 2, 64, -1),
                                          full_gu.reshape(4, 2, 128, -1)[:, :, half])  # (E, gate|up, I, H)
            np.testing.assert_array_equal(engine_expert_rows(e2, down, r).reshape(4, -1, 64),
                                          full_down.reshape(4, -1, 128)[:, :, half])  # (E, H, I)
