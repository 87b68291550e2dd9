"""The calibration step of a build (AWQ, GPTQ, SmoothQuant, fp8 need it): activation
statistics of the calibration text, and what they decide before packing starts (AWQ and
SmoothQuant transforms, SmoothQuant's kernel 1/s); then, per weight, what its stored
format may use of them (WeightCalibration: Hessian, input max, 1/s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


from bessemer.builder.input_groups import linear_input_keys
from bessemer.datasets import text_path
from bessemer.quantization.calibration import CalibrationSpec, collect
from bessemer.quantization.channel_scales import ChannelScales, InputGroup
from bessemer.quantization.expert_calibration import (ExpertCalibration, ExpertInputs, MoeLayer, awq_down_scales,
                                                     awq_folds_exactly)
from bessemer.quantization.formats import (ExpertStack, Fp8E4M3, Int4Group, StoredFormat, WeightCalibration,
                                          expert_format)


@dataclass
class CalibrationResult:
    stats: dict  # input key -> activation statistics (quantization/calibration.py)
    algorithm: str
    weight_keys: dict = field(default_factory=dict)  # HF weight tensor -> its input's key
    act_order: bool = False
    gptq: bool = False  # codes chosen by GPTQ (w4a16-gptq, fp8 --fp8-rounding gptq)
    transforms: dict = field(default_factory=dict)  # AWQ, SmoothQuant: tensor -> channel_scales.Transform
    multipliers: dict = field(default_factory=dict)  # SmoothQuant: weight name -> (K,) kernel 1/s
    backend: str = "native"  # where the activation statistics came from
    report: dict = field(default_factory=dict)
    # w4a16-gptq, w4a16-awq, fp8 with GPTQ rounding: a moe weight's first HF tensor -> its
    # layer's calibration rows and which matrix it is ("gate_up" | "down"), for GPTQ per
    # expert or the grid searched per expert for its output error (expert_calibration.py)
    experts: dict = field(default_factory=dict)

    def for_weight(self, parts: tuple[str, ...], fmt: StoredFormat, slices: tuple = (),
                   read=None) -> WeightCalibration:
        """What `fmt` uses of the calibration for the weight made of HF tensors `parts`:
        the input's Hessian when GPTQ chooses its codes (cached statistics may hold
        Hessians a build does not use: an int8 lm_head is round to nearest), its max |x|
        (fp8's static input scale), SmoothQuant's kernel 1/s; for experts stored 4-bit or
        E4M3, each expert's Hessian (w4a16-gptq, fp8's GPTQ rounding) or input rows
        (w4a16-awq) from the tokens routed to it. slices: the weight's tensor-parallel
        blocks (a rank's whole stacked experts start at slices[0][0]); read(name, sl): the
        checkpoint tensors the experts' inputs need, as the build transforms them (AWQ's
        down reads act(gate, up) / s)."""
        if parts[0] in self.experts and isinstance(fmt, ExpertStack) and isinstance(fmt.inner, (Int4Group, Fp8E4M3)):
            inputs, matrix = self.experts[parts[0]]
            first = slices[0][0] if fmt.input_major and slices else 0
            algorithm = "gptq" if self.gptq else "awq"
            return WeightCalibration(experts=ExpertCalibration(inputs, matrix, read, first, self.act_order, algorithm))
        key = self.weight_keys.get(parts[0])
        stats = self.stats.get(key, {}) if key else {}
        return WeightCalibration(
            # lm_head's input (the final norm's output) is not calibrated: an int4 lm_head is RTN
            hessian=stats.get("hessian") if self.gptq and fmt.gptq_codes else None,
            act_order=self.act_order,
            input_amax=float(stats["abs_max"].max()) if fmt.needs_input_amax else None,
            smooth=self.multipliers[parts[0]] if fmt.smooth else None)


def calibrate(ckpt, groups: list[InputGroup], quant, say, kernel_smoothed: frozenset = frozenset(),
              moe: list[MoeLayer] = ()) -> CalibrationResult:
    """groups: the model's input groups (builder/input_groups.py, from its unpassed graph);
    kernel_smoothed: first weights of the linears whose w8a8 kernel applies a stored 1/s;
    moe: its moe layers (builder/moe_layers.py), whose experts w4a16-gptq and w4a16-awq
    calibrate per expert."""
    from bessemer.quantization.awq import awq_transforms

    spec = CalibrationSpec(text_path(quant.calib_data), quant.calib_samples, quant.calib_seq_len)
    t = time.perf_counter()
    if quant.algorithm == "smoothquant":
        return _calibrate_smoothquant(ckpt, groups, quant, spec, say, kernel_smoothed)
    # experts stored as 4-bit groups, or as E4M3 codes GPTQ rounds, are calibrated per expert:
    # every row of their layer's input is kept (GPTQ; AWQ where it searches their grids or its
    # down's scale folds exactly)
    moe = [m for m in moe if _calibrates_experts(m, expert_format(quant, ckpt.shape(m.router)[1]), quant)]
    # only GPTQ (int4, or fp8 codes rounded by GPTQ) and the mixed-precision sensitivity need
    # the (K, K) input Hessians; AWQ and FP8 read abs_mean / abs_max / samples
    stats = collect(ckpt.dir, spec, [g.key for g in groups], say,
                    hessian=quant.uses_gptq or quant.bits_per_weight is not None,
                    keep_rows=[m.input_key for m in moe])
    result = CalibrationResult(stats, quant.algorithm, {w: g.key for g in groups for w in g.weights},
                               quant.act_order, quant.uses_gptq,
                               report={"stats_s": round(time.perf_counter() - t, 2),
                                       "rows": int(next(iter(stats.values()))["rows"])})
    inputs = {m.node: ExpertInputs(m, stats[m.input_key]["inputs"]) for m in moe}
    if quant.uses_gptq or _awq_searches_grids(quant):
        for m in moe:
            result.experts.update({m.gate_up[0]: (inputs[m.node], "gate_up"), m.down[0]: (inputs[m.node], "down")})
    if quant.mode == "fp8" and quant.fp8_smoothing_alpha is not None:
        _smooth_fp8(ckpt, groups, quant.fp8_smoothing_alpha, result, say)
    if quant.algorithm == "awq":
        t = time.perf_counter()
        result.transforms, per_group = awq_transforms(ckpt.get, groups, stats,
                                                      quant.group_size, quant.zero_point, say)
        result.report.update(awq_search_s=round(time.perf_counter() - t, 2), awq=per_group)
        down_scaled = {node: i for node, i in inputs.items() if awq_folds_exactly(i.layer)}
        if down_scaled:
            t = time.perf_counter()
            result.report["awq_experts"] = _awq_experts(ckpt, down_scaled, quant, result, say)
            result.report["awq_experts_s"] = round(time.perf_counter() - t, 2)
    return result


def _calibrates_experts(layer: MoeLayer, fmt: StoredFormat, quant) -> bool:
    """Whether the layer's experts (each stored in fmt) take codes from their routed tokens."""
    if isinstance(fmt, Fp8E4M3):
        return quant.uses_gptq  # --fp8-rounding gptq: each expert's Hessian
    return isinstance(fmt, Int4Group) and (quant.algorithm == "gptq" or
                                           (quant.algorithm == "awq" and _awq_calibrates(layer, quant)))


def _awq_searches_grids(quant) -> bool:
    """Whether w4a16-awq searches each expert's grid for its output error on its routed tokens:
    the symmetric grid (--zero-point's min/max grid has no search)."""
    return quant.algorithm == "awq" and not quant.zero_point


def _awq_calibrates(layer: MoeLayer, quant) -> bool:
    """Whether w4a16-awq calibrates the layer's experts: their grids searched, or the down's
    scales where they fold exactly."""
    return _awq_searches_grids(quant) or awq_folds_exactly(layer)


def _awq_experts(ckpt, inputs: dict, quant, result: CalibrationResult, say) -> dict:
    """AWQ scales for each expert's down (expert_calibration.awq_down_scales), added to the
    build's transforms (expert tensors are no linear's: no factor lands twice on one)."""
    scales = ChannelScales()
    report = {}
    for node, layer_inputs in inputs.items():
        r = report[node] = awq_down_scales(layer_inputs, ckpt.get, scales,
                                          quant.group_size, quant.zero_point)
        fallback = ", ".join(f"{e} ({t} tokens)" for e, t in list(r["rtn_fallback"].items())[:8])
        more = f" and {len(r['rtn_fallback']) - 8} more" if len(r["rtn_fallback"]) > 8 else ""
        say(f"{node}: AWQ for the down of {r['experts_awq']}/{len(r['expert_tokens'])} experts "
            f"({min(r['expert_tokens'])}-{max(r['expert_tokens'])} tokens each)"
            + (f"; RTN for {len(r['rtn_fallback'])}: {fallback}{more}" if r["rtn_fallback"] else ""))
    result.transforms.update(scales.transforms)
    return report


def _smooth_fp8(ckpt, groups, alpha: float, result: CalibrationResult, say) -> None:
    """fp8 with SmoothQuant's migration: the folded factors become transforms, and GPTQ and the
    static input scales see the statistics of the smoothed inputs x / s."""
    from bessemer.quantization.smoothquant import smoothed_statistics, smoothquant_transforms

    act_amax = {k: v["abs_max"] for k, v in result.stats.items()}
    result.transforms, _, per_group = smoothquant_transforms(ckpt.get, groups, act_amax, alpha)
    inverse = {}
    for g in groups:
        if g.key in per_group:  # smoothed: 1/s is the column factor's inverse
            inverse[g.key] = (1.0 / result.transforms[g.weights[0]].col).astype("float32")
    result.stats = smoothed_statistics(result.stats, groups, inverse)
    result.report["fp8_smoothing"] = per_group
    say(f"fp8: SmoothQuant factors for {len(per_group)} inputs (alpha {alpha})")


def _calibrate_smoothquant(ckpt, groups, quant, spec, say, kernel_smoothed) -> CalibrationResult:
    from bessemer.quantization.modelopt_calib import modelopt_available, modelopt_act_amax
    from bessemer.quantization.smoothquant import smoothquant_transforms

    t = time.perf_counter()
    backend = quant.calib_backend
    if backend == "auto":
        backend = "modelopt" if modelopt_available() else "native"
    if backend == "modelopt":
        act_amax, rows = modelopt_act_amax(ckpt.dir, spec, quant.smoothquant_alpha, linear_input_keys(groups), say)
    else:
        stats = collect(ckpt.dir, spec, [g.key for g in groups], say, hessian=False)
        act_amax = {k: v["abs_max"] for k, v in stats.items()}
        rows = int(next(iter(stats.values()))["rows"])
    result = CalibrationResult({}, quant.algorithm, backend=backend,
                               report={"stats_s": round(time.perf_counter() - t, 2), "rows": rows, "backend": backend})
    result.transforms, result.multipliers, per_group = smoothquant_transforms(
        ckpt.get, groups, act_amax, quant.smoothquant_alpha, kernel_smoothed)
    result.report["smoothquant"] = per_group
    say(f"smoothquant: factors for {len(per_group)} inputs (alpha {quant.smoothquant_alpha}, {backend} statistics)")
    return result
