"""SmoothQuant statistics from nvidia-modelopt (the `quant` extra), on the CPU.

mtq.quantize(model, INT8_SMOOTHQUANT_CFG, forward_loop) runs modelopt's own calibration
over the calibration windows: it records every linear input's per-channel max |x|
(`input_quantizer._amax_for_smoothing`) and sets its smoothing (`_pre_quant_scale`,
= w_j^(1-alpha) / a_j^alpha for that linear's own weight). We take the per-channel maxima
as the activation statistics (the same quantity calibration.py's hooks record as
abs_max; tests compare them) and compute the factors with quantization/smoothquant.py,
because the fused q/k/v and gate/up need one factor per shared input, not per linear.
"""

from __future__ import annotations

import copy
import hashlib
import os
from pathlib import Path
from typing import Callable

import numpy as np

from bessemer.errors import BessemerError
from bessemer.quantization.calibration import CalibrationSpec, _content_hash, cache_dir, calibration_windows

MODELOPT_STATS_VERSION = 1


def modelopt_available() -> bool:
    """Installed? (Found, not imported: importing modelopt costs ~12 s of CPU.)"""
    import importlib.util

    # the top-level name only: finding modelopt.torch.* would import modelopt.torch
    return importlib.util.find_spec("modelopt") is not None


def _import_mtq():
    try:
        import warnings

        with warnings.catch_warnings():  # "transformers X is not tested with modelopt"
            warnings.simplefilter("ignore")
            import modelopt.torch.quantization as mtq
    except ImportError:
        raise BessemerError("--calib-backend modelopt needs nvidia-modelopt: pip install 'bessemer[quant]'") from None
    return mtq


def run_modelopt_smoothquant(model, windows: list[list[int]], alpha: float, progress=lambda m: None) -> dict:
    """Quantizes `model` (a HF torch model, in place) with modelopt's INT8 SmoothQuant and
    returns {linear module name: {"abs_max": (K,), "pre_quant_scale": (K,)}} (numpy)."""
    import torch

    mtq = _import_mtq()
    cfg = copy.deepcopy(mtq.INT8_SMOOTHQUANT_CFG)
    cfg["algorithm"] = {"method": "smoothquant", "alpha": alpha}

    def forward_loop(m):
        with torch.no_grad():
            for i, w in enumerate(windows):
                m(torch.tensor([w]))
                if (i + 1) % 8 == 0 or i + 1 == len(windows):
                    progress(f"calibration (modelopt): {i + 1}/{len(windows)} samples")

    mtq.quantize(model, cfg, forward_loop)
    out = {}
    for name, m in model.named_modules():
        iq = getattr(m, "input_quantizer", None)
        amax = getattr(iq, "_amax_for_smoothing", None)
        if amax is None:
            continue
        out[name] = {"abs_max": amax.detach().float().reshape(-1).numpy(),
                     "pre_quant_scale": iq._pre_quant_scale.detach().float().reshape(-1).numpy()}
    return out


def modelopt_act_amax(model_dir: Path, spec: CalibrationSpec, alpha: float, input_keys: dict[str, str],
                      progress: Callable[[str], None] = lambda m: None) -> tuple[dict, int]:
    """({input key: (K,) max |x|}, rows seen), cached like calibration.collect.
    input_keys: {linear module name: the key of its input group} (builder/input_groups.py)."""
    from bessemer.builder.hf_loader import load_hf_model

    model_dir = Path(model_dir)
    key = hashlib.sha256(f"modelopt-v{MODELOPT_STATS_VERSION}:{alpha}:{_content_hash(model_dir, spec)}".encode())
    path = cache_dir() / f"modelopt-{key.hexdigest()[:32]}.npz"
    if path.exists():
        progress(f"calibration: cached modelopt statistics {path}")
        with np.load(path) as data:
            rows = int(data["__rows__"])
            return {k: data[k] for k in data.files if k != "__rows__"}, rows
    _import_mtq()
    wins = calibration_windows(model_dir, spec)
    model = load_hf_model(model_dir, "calibration with nvidia-modelopt")
    per_linear = run_modelopt_smoothquant(model, wins, alpha, progress)
    act = {}
    for name, st in per_linear.items():
        if name in input_keys:  # not lm_head (its own scheme); q/k/v (gate/up) saw the same input
            act.setdefault(input_keys[name], st["abs_max"])
    if not act:
        raise BessemerError("nvidia-modelopt calibrated no linear layer of this model; use --calib-backend native")
    rows = sum(len(w) for w in wins)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, __rows__=np.int64(rows), **act)
    os.replace(tmp, path)
    return act, rows
