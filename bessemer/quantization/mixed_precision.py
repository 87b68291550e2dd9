"""Mixed precision by measurement: which linears keep more bits inside a bits-per-weight budget
(QuantConfig.bits_per_weight), as llama.cpp's _M types and modelopt's auto-quantize do.

Sensitivity. For each linear (after fusion: one q|k|v, one gate|up per layer) and each scheme
it may be stored in (config.PRECISION_SCHEMES), the output error the scheme's quantization
adds on the calibration text:

    E(scheme) = sum over calibration rows x of |x (W - Q(W))^T|^2 / rows = tr(dW H dW^T) / rows

with H = sum x^T x the input Hessian that GPTQ uses and Q(W) the weight on that scheme's
grid with codes rounded to nearest: the measurement ranks the linears, and GPTQ (which the
build then applies to the 4-bit ones of a w4a16-gptq plan) would cost four runs per linear.

Allocation. The schemes that minimize the sum of the linears' errors within the budget (a
knapsack with one choice per linear, solved by dynamic programming on bits). Errors are
compared relative to the linear's output energy tr(W H W^T): the absolute errors of layers
whose inputs differ in scale by orders of magnitude (the residual stream grows with depth)
are not comparable, while the relative error is what each layer's output loses. lm_head (no calibrated input: it reads the final
norm) is int8 when the budget holds it with every other linear at the mode's own scheme,
else symmetric int4 in groups of 32 (a small model's tied table is a fifth of its weights).

Measured on SmolLM2-135M (RTN, WikiText-2, 2048 tokens in windows of 512, fp32 18.51):
--bits-per-weight 4.85 gives 25.24 against 26.02 for uniform g32 with the same int4 table
(the plan spends its 0.35 bits on 33 attention matrices in int8, mostly o_proj), but
uniform g32 with the int8 table (5.25 bits) gives 23.37: on this model the int4 table
costs more than the plan wins back, and the budget leaves no room for an int8 table.

Bits are counted as the engine stores them (quantization/bits.py): codes and every
parameter tensor of the scheme's format, over the decoder's matrices and lm_head (the "all"
of the build report for a tied model; an untied embedding table, a gather kept in the build
dtype, is outside the budget). Linears that an exclusion keeps in floating point are outside
it too: the plan decides the linears it may quantize. The budget is the model's, one copy of
every matrix: tensor-parallel rank files that replicate a matrix (a single KV head, a tied
table) count it once per rank in the build report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from bessemer.errors import InvalidOptionError
from bessemer.format.dtypes import DTYPE_BITS
from bessemer.format.layouts import PANEL, align_up
from bessemer.quantization.config import PRECISION_SCHEMES, QuantConfig
from bessemer.quantization.formats import WeightCalibration, scheme_format


@dataclass(frozen=True)
class Unit:
    """One linear of the fused graph: its node name, HF tensors (row slices), (N, K) and the
    key of its input's calibration statistics."""

    name: str
    parts: tuple[str, ...]
    slices: tuple
    shape: tuple[int, int]
    key: str | None


def scheme_bits(scheme: str, shape: tuple[int, int]) -> int:
    """Stored bits of an (N, K) weight in `scheme`: codes and every parameter tensor, the rows
    of 2-D parts padded to whole panels of 16 as the cpu layouts store them (an upper bound
    for a target that pads less), so that the engine's count never exceeds the plan's."""
    def rows(p):
        return (align_up(p.shape[0], PANEL),) + tuple(p.shape[1:]) if len(p.shape) == 2 else p.shape
    return sum(math.prod(rows(p)) * DTYPE_BITS[p.dtype] for p in scheme_format(scheme, shape[1]).parts(shape))


def schemes_for(shape: tuple[int, int], tp_size: int = 1) -> tuple[str, ...]:
    """The schemes an (N, K) weight may be stored in: int4-k only where K is whole sub-blocks
    and an even K cut over tp_size ranks falls on its super-blocks (asked of every linear:
    the units do not say which are row-split, so a column-split one may lose int4-k at --tp)."""
    from bessemer.quantization.superblock import super_block_size

    k = shape[1]
    block = super_block_size(k)
    fits = block is not None and k % tp_size == 0 and (k // tp_size) % block == 0
    return tuple(s for s in PRECISION_SCHEMES if s != "int4-k" or fits)


def default_scheme(quant: QuantConfig) -> str:
    """The scheme the mode alone would store a linear in (the lm_head rule's yardstick)."""
    if quant.two_level:
        return "int4-k"
    if quant.group_size == 64 and not quant.zero_point:
        return "int4-g64"
    return "int4-g32-asym" if quant.zero_point else "int4-g32"


def measure(units: list[Unit], weight: Callable[[Unit], np.ndarray], hessians: dict,
            say: Callable[[str], None] = lambda m: None) -> dict[str, dict]:
    """{unit name: {"energy": tr(W H W^T)/rows, scheme: E(scheme), ...}}; hessians: input key
    -> (H (K, K) sum of x^T x, rows)."""
    out = {}
    for i, u in enumerate(units):
        w = weight(u)  # (N, K) fp32
        h, rows = hessians[u.key]
        hn = (np.asarray(h, np.float64) / rows).astype(np.float32)
        r = {"energy": _quadratic(w, hn)}
        for scheme in schemes_for(u.shape):
            fmt = scheme_format(scheme, u.shape[1])
            q = fmt.quantize(w, WeightCalibration())
            r[scheme] = _quadratic(fmt.dequantize(q) - w, hn)
        out[u.name] = r
        if (i + 1) % 10 == 0 or i + 1 == len(units):
            say(f"mixed precision: sensitivity of {i + 1}/{len(units)} linears")
    return out


def _quadratic(d: np.ndarray, h: np.ndarray) -> float:
    """tr(d h d^T) for d (N, K), h (K, K): the products in fp32 (the cost: N K^2 multiply-adds
    per scheme and linear), each row's sum and the total in fp64. The allocation compares
    these errors between linears and schemes, where fp32's relative error (~1e-6 at K 1536)
    is far below any gap that decides a choice."""
    dh = np.asarray(d, np.float32) @ np.asarray(h, np.float32)  # (N, K)
    return float(np.einsum("nk,nk->n", dh, d, dtype=np.float64).sum())


def allocate(units: list[Unit], errors: dict[str, dict], budget: float, lm_head: tuple[str, tuple[int, int]] | None,
             quant: QuantConfig, tp_size: int = 1) -> tuple[tuple[tuple[str, str], ...], dict]:
    """The plan ((node name, scheme) pairs, lm_head's included) with all matrices at most
    `budget` bits per weight, and the report of what went where.
    lm_head: (node name, (N, K)) of the logits' linear, or None when it is not quantized."""
    # the weights bits.py divides by: (N, K) of each matrix, unpadded
    weights = sum(math.prod(u.shape) for u in units) + (math.prod(lm_head[1]) if lm_head else 0)
    limit = budget * weights
    price = {u.name: {s: scheme_bits(s, u.shape) for s in schemes_for(u.shape, tp_size)} for u in units}
    plan: dict[str, str] = {}
    used = 0
    if lm_head is not None:
        name, shape = lm_head
        base = default_scheme(quant)
        body = sum(price[u.name].get(base, price[u.name]["int4-g32"]) for u in units)
        plan[name] = "int8" if body + scheme_bits("int8", shape) <= limit else "int4-g32"
        used += scheme_bits(plan[name], shape)
    cheapest = {u.name: min(price[u.name], key=lambda s: price[u.name][s]) for u in units}
    used += sum(price[u.name][cheapest[u.name]] for u in units)
    if used > limit:
        least = used / weights
        raise InvalidOptionError(f"--bits-per-weight {budget} is below what this model takes with every matrix in its "
                                 f"cheapest scheme ({least:.3f}); use --bits-per-weight {math.ceil(least * 100) / 100}")
    rel = {u.name: {s: errors[u.name][s] / errors[u.name]["energy"] for s in price[u.name]} for u in units}
    plan.update(_knapsack(units, price, rel, cheapest, limit - used))
    used = (scheme_bits(plan[lm_head[0]], lm_head[1]) if lm_head else 0) + sum(price[u.name][plan[u.name]]
                                                                                for u in units)
    report = {"budget_bpw": budget, "planned_bpw": round(used / weights, 4),
              "schemes": {s: sorted(n for n, v in plan.items() if v == s) for s in PRECISION_SCHEMES
                          if s in plan.values()},
              "linears": {u.name: {"scheme": plan[u.name], "bits": price[u.name][plan[u.name]],
                                   "relative_error": {s: round(errors[u.name][s] / errors[u.name]["energy"], 8)
                                                      for s in price[u.name]}} for u in units}}
    if lm_head is not None:
        report["lm_head"] = {"scheme": plan[lm_head[0]], "bits": scheme_bits(plan[lm_head[0]], lm_head[1]),
                             "rule": "int8 when the budget holds it with every other linear at "
                                     f"{default_scheme(quant)}, else int4-g32"}
    return tuple(sorted(plan.items())), report


def _knapsack(units: list[Unit], price: dict, rel: dict, cheapest: dict, spare: float,
              steps: int = 20000) -> dict[str, str]:
    """The schemes minimizing the sum of relative errors with at most `spare` bits above every
    linear's cheapest scheme: a 0/1 knapsack with one choice per linear, solved exactly by
    dynamic programming on bits in `steps` quanta (each price rounded up, so the result never
    exceeds `spare`). A greedy walk up each linear's schemes gets stuck where a linear's best
    step per bit (int4 asymmetric) blocks the step it needs (int8)."""
    quantum = max(1.0, spare / steps)
    cap = int(spare // quantum)
    best = np.full(cap + 1, 0.0)  # least error with at most c quanta spent, over the units so far
    choice = np.zeros((len(units), cap + 1), np.int8)
    for i, u in enumerate(units):
        nxt = np.full(cap + 1, np.inf)
        for j, s in enumerate(PRECISION_SCHEMES):
            if s not in price[u.name]:
                continue
            cost = math.ceil((price[u.name][s] - price[u.name][cheapest[u.name]]) / quantum)
            if cost > cap:
                continue
            cand = np.full(cap + 1, np.inf)
            cand[cost:] = best[:cap + 1 - cost] + rel[u.name][s]
            better = cand < nxt
            nxt[better] = cand[better]
            choice[i, better] = j
        best = nxt
    plan, c = {}, int(np.argmin(best))
    for i in range(len(units) - 1, -1, -1):
        u, s = units[i], PRECISION_SCHEMES[choice[i, c]]
        plan[u.name] = s
        c -= math.ceil((price[u.name][s] - price[u.name][cheapest[u.name]]) / quantum)
    return plan
