"""Quantizes one weight while it is packed: fp32 array -> stored parts + its SQNR, and
runs the calibration step that AWQ and GPTQ need before packing starts.

One weight at a time (the builder streams); the stored layouts are those of
quantization/packing.py whatever algorithm chose the codes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bessemer.builder.engine_format import pack_panel16
from bessemer.quantization import primitives as prim
from bessemer.builder.input_groups import linear_input_keys
from bessemer.quantization.calibration import CalibrationSpec, collect
from bessemer.quantization.channel_scales import InputGroup
from bessemer.quantization.packing import GROUP_PARAM_DTYPE, pack_group_params, pack_int4_codes, pack_vnni16


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

    def hessian_for(self, spec) -> np.ndarray | None:
        if not self.gptq:  # cached statistics may hold Hessians that this build does not use
            return None
        return self.stats[self.weight_keys[spec.parts[0]]]["hessian"]

    def input_amax_for(self, spec) -> float | None:
        """max |x| over the calibration rows of the weight's input (FP8 activation scale)."""
        return float(self.stats[self.weight_keys[spec.parts[0]]]["abs_max"].max())


def calibrate(ckpt, groups: list[InputGroup], quant, say, kernel_smoothed: frozenset = frozenset()) -> CalibrationResult:
    """groups: the model's input groups (builder/input_groups.py, from its unpassed graph);
    kernel_smoothed: first weights of the linears whose w8a8 kernel applies a stored 1/s."""
    from bessemer.quantization.awq import awq_transforms

    spec = CalibrationSpec(Path(quant.calib_data), quant.calib_samples, quant.calib_seq_len)
    t = time.perf_counter()
    if quant.algorithm == "smoothquant":
        return _calibrate_smoothquant(ckpt, groups, quant, spec, say, kernel_smoothed)
    # only GPTQ (int4, or fp8 codes rounded by GPTQ) needs the (K, K) input Hessians; AWQ
    # and FP8 read abs_mean / abs_max / samples
    stats = collect(ckpt.dir, spec, [g.key for g in groups], say, hessian=quant.uses_gptq)
    result = CalibrationResult(stats, quant.algorithm, {w: g.key for g in groups for w in g.weights},
                               quant.act_order, quant.uses_gptq,
                               report={"stats_s": round(time.perf_counter() - t, 2),
                                       "rows": int(next(iter(stats.values()))["rows"])})
    if quant.algorithm == "awq":
        t = time.perf_counter()
        result.transforms, per_group = awq_transforms(ckpt.get, groups, stats,
                                                      quant.group_size, quant.zero_point, say)
        result.report.update(awq_search_s=round(time.perf_counter() - t, 2), awq=per_group)
    return result


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


def quantize_codes(w: np.ndarray, quant: tuple, hessian: np.ndarray | None = None,
                   act_order: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """w: (N, K) fp32 -> unpacked codes (N, K), scales (N,) or (N, K/G), offsets (4-bit) or None.
    With a Hessian, 4-bit codes come from GPTQ, otherwise from round to nearest."""
    q = dict(quant)
    if q["bits"] == 8:  # w8a16 and w8a8: symmetric per channel
        codes, scale = prim.quantize_int8_per_channel(w)
        return codes, scale, None
    g = q["group_size"]
    if hessian is not None:
        from bessemer.quantization.gptq import gptq_int4

        return gptq_int4(w, hessian, g, q["zero_point"], act_order)
    scale, offset = prim.int4_group_params(w, g, q["zero_point"])
    return prim.quantize_int4(w, scale, offset, g), scale, offset


def slice_codes(codes, scale, offset, quant: tuple, c0: int, c1: int):
    """Columns [c0, c1) of a quantized weight (a tensor-parallel K shard): per-channel int8
    scales stay those of the full row; 4-bit groups must not straddle c0 or c1."""
    q = dict(quant)
    if q["bits"] == 8:
        return codes[:, c0:c1], scale, None
    g = q["group_size"]
    assert c0 % g == 0 and c1 % g == 0, "the shard pass only cuts K on group boundaries"
    return codes[:, c0:c1], scale[:, c0 // g:c1 // g], offset[:, c0 // g:c1 // g]


def pack_quantized(w: np.ndarray, codes, scale, offset, quant: tuple) -> tuple[dict[str, np.ndarray], dict]:
    """Stored parts of quantized `w` (N, K) and its SQNR (of exactly what is stored)."""
    q = dict(quant)
    if q.get("act_bits") == 8:  # w8a8: VNNI layout and the per-channel code sums of the +128 shift
        approx = prim.dequantize_int8_per_channel(codes, scale)
        parts = {"codes": pack_vnni16(codes), "scales": scale,
                 "wsum": codes.astype(np.int32).sum(axis=1, dtype=np.int32)}
    elif q["bits"] == 8:
        approx = prim.dequantize_int8_per_channel(codes, scale)
        parts = {"codes": pack_panel16(codes), "scales": scale}
    else:
        approx = prim.dequantize_int4(codes, scale, offset, q["group_size"])
        parts = {"codes": pack_int4_codes(codes), "scales": pack_group_params(scale, GROUP_PARAM_DTYPE),
                 "offsets": pack_group_params(offset, GROUP_PARAM_DTYPE)}
    stats = {"sqnr_db": round(prim.sqnr_db(w, approx), 2), "bits": q["bits"]}
    if q["bits"] == 4:
        stats["group_size"] = q["group_size"]
    return parts, stats


def quantize_weight(w: np.ndarray, quant: tuple, hessian: np.ndarray | None = None,
                    act_order: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """w: (N, K) fp32. Returns ({role: packed array}, {"sqnr_db": ..., ...})."""
    return pack_quantized(w, *quantize_codes(w, quant, hessian, act_order), quant)


def quantize_fp8_weight(rows: np.ndarray, input_amax: float | None, c0: int = 0,
                        c1: int | None = None, hessian: np.ndarray | None = None,
                        act_order: bool = False) -> tuple[dict[str, np.ndarray], dict]:
    """FP8: whole rows (N, K_full) -> stored parts of columns [c0, c1) (a tensor-parallel K
    shard keeps the scales of the full rows) plus the static scale of the input, from the
    calibrated max |x|; and the SQNR of what is stored. With the input Hessian (K_full,
    K_full) the codes come from GPTQ on the same grid, else from round to nearest."""
    from bessemer.quantization import fp8

    if input_amax is None:
        raise ValueError("fp8 needs the calibrated max |x| of the weight's input")
    if hessian is not None:
        from bessemer.quantization.gptq import gptq_fp8

        codes, scale = gptq_fp8(rows, hessian, act_order)
    else:
        codes, scale = fp8.quantize_fp8_per_channel(rows)
    codes, w = codes[:, c0:c1], rows[:, c0:c1]
    x_scale = fp8.activation_scale(input_amax)
    parts = {"codes": pack_panel16(codes), "scales": scale, "input_scale": np.array([x_scale], np.float32)}
    stats = {"sqnr_db": round(prim.sqnr_db(w, fp8.dequantize_fp8_per_channel(codes, scale)), 2),
             "bits": 8, "dtype": "float8_e4m3", "input_amax": float(np.float32(input_amax)),
             "input_scale": float(x_scale)}
    return parts, stats
