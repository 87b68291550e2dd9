"""The mixed-precision step of a build (QuantConfig.bits_per_weight): the linears of the
fused graph, their sensitivity on the calibration text and the plan that fits the budget
(quantization/mixed_precision.py). It runs before the passes, which then follow the plan
(passes/quantize.py): the plan is a build input, recorded in config.json like any option.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatch

import numpy as np

from bessemer.builder.config import BuildConfig
from bessemer.builder.pipeline import run_passes
from bessemer.ir.graph import Graph
from bessemer.quantization.mixed_precision import Unit, allocate, measure


def linear_units(graph: Graph, quant, weight_keys: dict) -> tuple[list[Unit], tuple | None]:
    """The linears a plan decides (not excluded, not MoE routers, not lm_head) and lm_head's
    (node name, (N, K)) when it is quantized (None when it stays in floating point)."""
    gathered = {w.name for n in graph.nodes if n.op == "embedding" for w in n.weights}
    router_logits = {m.inputs[1] for m in graph.nodes if m.op == "moe"}
    units, lm_head = [], None
    for n in graph.nodes:
        if n.op != "linear" or any(fnmatch(n.name, p) or fnmatch(n.name, p + ".*") for p in quant.exclude_modules):
            continue
        w = n.weights[0]
        if graph.output in n.outputs:
            lm_head = None if quant.lm_head == "none" else (n.name, tuple(w.shape))
        elif w.name not in gathered and n.outputs[0] not in router_logits:
            units.append(Unit(n.name, tuple(w.parts), tuple(w.slices or ()), tuple(w.shape),
                              weight_keys.get(w.parts[0])))
    return units, lm_head


def plan_precision(graph: Graph, build: BuildConfig, ckpt, calibration, say) -> tuple[BuildConfig, dict]:
    """build with quant.precision filled in for `graph` (the model's unpassed graph), and the
    build report's section on what went where."""
    fused, _ = run_passes(graph, replace(build, quant=None, tp_size=1, tp_rank=0), lowered=False)
    units, lm_head = linear_units(fused, build.quant, calibration.weight_keys)
    hessians = {k: (s["hessian"], float(s["rows"])) for k, s in calibration.stats.items()}

    def weight(u: Unit) -> np.ndarray:
        slices = u.slices or (None,) * len(u.parts)
        return np.concatenate([ckpt.get(p, sl) for p, sl in zip(u.parts, slices)]).astype(np.float32)

    errors = measure(units, weight, hessians, say)
    plan, report = allocate(units, errors, build.quant.bits_per_weight, lm_head, build.quant, build.tp_size)
    say(f"mixed precision: {report['planned_bpw']:.3f} bits per weight planned (budget {build.quant.bits_per_weight}); "
        + ", ".join(f"{s}: {len(v)}" for s, v in report["schemes"].items()))
    return replace(build, quant=replace(build.quant, precision=plan)), report
