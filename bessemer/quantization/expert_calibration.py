"""Per-expert calibration of a mixture of experts: what each expert's matrices read on the
calibration tokens the router sends to it, for GPTQ (the Hessian sum x^T x of each expert)
and AWQ (the scales of each expert's down, awq_down_scales, and the rows each expert's grid
is searched on).

Calibration (calibration.collect, keep_rows) keeps every row of a moe layer's input x
(T, H) in a file beside its cached statistics; nothing per expert is held for the whole
model. When a layer's experts are quantized, the routing is recomputed from those rows with
the checkpoint's router (ops.ref_moe_routing: the rule of the engine and of transformers),
and, one expert at a time:

    gate_up of expert e  reads x[rows_e]                                  (R_e, H)
    down of expert e     reads act(gate_e, up_e) of those rows            (R_e, I)
                         through expert e's own fp32 weights (as GPTQ of a dense
                         down_proj reads the fp32 model's activations)

so memory holds one expert's (K, K) Hessian (or its rows) at a time, not 2 x E x layers of them.

w4a16-awq and the experts' gate/up. Every expert's gate/up reads the layer's normed input,
which the router (and Qwen2-MoE's shared expert and its gate) read too, so a per-input-channel
scale of one expert has nowhere to fold: the format would need a per-expert 1/s applied to
the input in the kernel (AutoAWQ tried such a block; it needs the inference code changed).
The one exact fold is a single s for the layer into the norm's weight, with every expert's
gate/up, the router's and the shared expert's columns times s (AutoAWQ's Mixtral recipe, to
which llm-compressor added the router). That router is equal only up to rounding (W diag(s)
(x / s) is not W x in floating point: a near tie in the top-k flips), and one s serves all
the experts, whose salient channels differ. Measured on the Qwen3-30B-A3B widths (random
weights, norms 1, layer 0, 4-bit g32; the error of each expert's gate_up output on the tokens
routed to it vs RTN's): that shared scale, searched on every expert's routed tokens, 0.998
on held-out tokens (median over the 102 experts with 16 or more of 2048 calibration tokens;
0.96-1.05). So -awq keeps every fold as it is and chooses each expert's grid from its routed
tokens instead: each group's scale is searched for that group's share of the expert's output
error on them, (w - q)^T X_g^T X_g (w - q) (scale_search.int4_symmetric_scales_for_inputs;
the format stores the same one bf16 scale per group as RTN). The diagonal of X_g^T X_g alone
(mean x^2 per channel, llama.cpp's imatrix weighting) did nothing on these inputs, whose
channels share a large mean: 1.001 (0.97-1.07) by the same measure. The (g, g) blocks, on 9
sampled experts with 16 or more of 1024 calibration tokens, the next 1024 held out: 0.61
(0.30-0.98) on the calibration tokens, 0.82 (0.73-1.08) held out; the whole expert, its down
searched too, 0.63 and 0.86 (0.68-1.12); the experts above 1 held out are those with 17-19
tokens (from fewer rows than a group's 32 the blocks are their diagonal: group_second_moments).
On the tiny test families (held out: the next 256 tokens) the diagonal 0.87-1.19, the blocks
0.30-0.72. The
down is searched the same way on act(gate, up) / s of its tokens (after its AWQ scales where
they fold), and gpt-oss's gate_up and down (interleaved, biased, clamped: no AWQ scale folds
there) are too: the search reads only the matrix's own input rows. Only the symmetric grid
has a scale search: with --zero-point (min/max per group) the grids stay RTN. Its cost on the
Qwen3-30B-A3B widths, one layer (128 experts, 32768 calibration tokens, one BLAS thread), with
the search in NumPy: gate_up 121 CPU-s against RTN's 14, down 78 against 7 (its input
recomputed through each expert's fp32 gate/up included), +178 CPU-s a layer, most of it the
search's 20 products with the (g, g) blocks per expert matrix (scale_search.
OUTPUT_SEARCH_DIVISORS). The search now runs in native code (scale_search.
int4_symmetric_scales_for_inputs): per expert gate_up 0.21 CPU-s against NumPy's 0.89, down
0.11 against 0.41 (half of it the plain search it starts from), so about 40 CPU-s a layer
instead of 166 (from those per-expert timings; not measured on a whole build).

An expert that fewer than MIN_EXPERT_TOKENS calibration tokens reach is stored RTN. With
none, its Hessian is zero and GPTQ would zero every weight (it drops the input channels no
token reads); with a few, the grid's scale search weights each input channel by its energy
on those tokens (the Hessian's diagonal), an estimate whose relative spread is sqrt(2 / R)
for Gaussian-like inputs: 35% at R = 16, 100% at R = 2. Past that, whether GPTQ beats RTN on
tokens calibration never saw depends on the inputs' spectrum, not on a count (gptq_int4 g32
act-order on random 96 x 512 weights, output error on 2048 held-out rows of the same
distribution, GPTQ / RTN, from R calibration rows, two seeds; rows with 4 salient channels and
singular values j^-0.5, a decaying spectrum as real activations have: 0.51-0.65 at R = 4,
0.49-0.57 at R = 64, 0.28-0.33 at R = 1024; a flat spectrum: 0.66-0.67 at R = 4, 0.97-1.01
at R = 64, 1.54-1.57 at R = 256, 1.37-1.46 at R = 512, 0.79-0.82 at R = 1024). So the threshold
catches starved experts; it does not promise that every calibrated expert gains, and more
calibration text (--calib-samples) is the remedy for experts with few tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from bessemer.quantization.formats import WeightCalibration

MIN_EXPERT_TOKENS = 16

# read(name, sl) -> a checkpoint tensor as fp32, or its block sl = (r0, r1, c0, c1) (a 3-D
# tensor's rows [r0, r1) of its first axis, flattened after it)
Reader = Callable[[str, tuple | None], np.ndarray]


@dataclass(frozen=True)
class MoeLayer:
    """A moe node of the model's unpassed graph, by checkpoint tensor names (ops.py `moe`)."""

    node: str
    input_key: str  # the calibration key its input rows are kept under (its router's input group)
    router: str  # (E, H) weight
    router_bias: str | None
    gate_up: tuple[str, ...]  # layout 0: gate_0, up_0, gate_1, ... (I, H) each; layout 1: one (E, H, 2I)
    down: tuple[str, ...]  # layout 0: down_0, ... (H, I) each; layout 1: one (E, I, H)
    gate_up_bias: str | None  # layout 1: (E, 2I)
    num_experts: int
    top_k: int
    expert_size: int
    softmax_after_topk: int
    norm_topk_prob: int
    layout: int
    activation: int


class ExpertInputs:
    """One moe layer's calibration rows and, once computed, their routing."""

    def __init__(self, layer: MoeLayer, rows: np.ndarray):
        self.layer = layer
        self.rows = rows  # (T, H) fp32, memory-mapped: every calibration token's input to the layer
        self._routes: np.ndarray | None = None  # (T, top_k) experts of each row

    def routes(self, read: Reader) -> np.ndarray:
        if self._routes is None:
            from bessemer.plugins.ops import ref_moe_routing

            lay = self.layer
            w = read(lay.router, None)  # (E, H)
            bias = read(lay.router_bias, None) if lay.router_bias is not None else 0.0  # (E,)
            chunks = []
            for t0 in range(0, len(self.rows), 4096):  # (4096, E) logits at a time
                logits = np.asarray(self.rows[t0:t0 + 4096], np.float32) @ w.T + bias
                chunks.append(ref_moe_routing(logits, lay.top_k, lay.softmax_after_topk, lay.norm_topk_prob)[0])
            self._routes = np.concatenate(chunks) if chunks else np.zeros((0, lay.top_k), np.int64)
        return self._routes

    def token_counts(self, read: Reader) -> np.ndarray:
        """(E,) how many calibration tokens each expert receives."""
        return np.bincount(self.routes(read).reshape(-1), minlength=self.layer.num_experts)

    def gate_up_input(self, e: int, read: Reader) -> np.ndarray:
        """(R_e, H): the rows routed to expert e."""
        return np.asarray(self.rows[np.nonzero((self.routes(read) == e).any(axis=1))[0]], np.float32)

    def down_input(self, e: int, read: Reader) -> np.ndarray:
        """(R_e, I): expert e's act(gate, up) of the rows routed to it, from its fp32 weights."""
        from bessemer.plugins.ops import ref_expert_hidden

        lay = self.layer
        x = self.gate_up_input(e, read)
        if lay.layout == 1:
            h = x.shape[1]
            w = read(lay.gate_up[0], (e, e + 1, 0, h)).reshape(h, 2 * lay.expert_size)  # (H, 2I) input-major
            gu = x @ w
            if lay.gate_up_bias is not None:
                gu = gu + read(lay.gate_up_bias, (e, e + 1, 0, 2 * lay.expert_size)).reshape(-1)
        else:
            w = np.concatenate([read(lay.gate_up[2 * e], None), read(lay.gate_up[2 * e + 1], None)])  # (2I, H)
            gu = x @ w.T
        return ref_expert_hidden(gu.astype(np.float64), lay.activation, lay.layout == 1).astype(np.float32)


@dataclass(frozen=True)
class ExpertCalibration:
    """What an ExpertStack (formats.py) uses to quantize each of its experts when enough tokens
    reach it: GPTQ from the expert's own Hessian (algorithm "gptq"), or the grid searched for
    the output error on those tokens (algorithm "awq"); else RTN."""

    inputs: ExpertInputs
    matrix: str  # "gate_up" | "down"
    read: Reader
    first_expert: int = 0  # global index of the stack's expert 0 (a tensor-parallel rank's whole experts)
    act_order: bool = False
    algorithm: str = "gptq"  # "gptq" | "awq"

    def token_counts(self, local_experts: int) -> np.ndarray:
        """(local_experts,) tokens routed to each of the stack's experts."""
        counts = self.inputs.token_counts(self.read)
        return counts[self.first_expert:self.first_expert + local_experts]

    def for_expert(self, i: int) -> WeightCalibration:
        """The calibration of the stack's expert i: its Hessian or its input rows (R_e, K), or
        none (RTN) below MIN_EXPERT_TOKENS."""
        e = self.first_expert + i
        if self.inputs.token_counts(self.read)[e] < MIN_EXPERT_TOKENS:
            return WeightCalibration()
        get = self.inputs.gate_up_input if self.matrix == "gate_up" else self.inputs.down_input
        x = get(e, self.read)  # (R_e, K)
        if self.algorithm == "awq":
            return WeightCalibration(input_rows=x)
        return WeightCalibration(hessian=(x.T @ x).astype(np.float64), act_order=self.act_order)


def awq_down_scales(inputs: ExpertInputs, read: Reader, scales, group_size: int, zero_point: bool) -> dict:
    """AWQ for each expert's down (awq.search_scale on the expert's own act(gate, up) of its
    routed tokens), the 1/s folded into the expert's up rows: h = act(gate) * up, so scaling
    up's row j scales h's channel j exactly. Layout 0 with silu only (gpt-oss clamps up before
    the product: no exact fold). gate/up get no scale: their input is the layer's, shared by
    every expert and the router, so a per-expert factor has nowhere to fold (their grids are
    searched per expert instead: ExpertCalibration, algorithm "awq"). scales: the build's
    channel_scales.ChannelScales. Returns the layer's report (experts searched, RTN
    fallbacks with their tokens, each searched expert's loss vs RTN)."""
    from bessemer.quantization import primitives as prim
    from bessemer.quantization.awq import search_scale
    from bessemer.quantization.calibration import SAMPLE_ROWS

    lay = inputs.layer
    counts = inputs.token_counts(read)
    rng = np.random.default_rng(0)
    fallback, loss = {}, {}
    for e in range(lay.num_experts):
        if counts[e] < MIN_EXPERT_TOKENS:
            fallback[e] = int(counts[e])
            continue
        h = inputs.down_input(e, read)  # (R_e, I)
        sample = h[np.sort(rng.choice(len(h), min(SAMPLE_ROWS, len(h)), replace=False))]
        w = read(lay.down[e], None)  # (H, I)
        s, _, ratio = search_scale([w], np.abs(h).mean(axis=0), sample,
                                   prim.effective_group_size(w.shape[1], group_size), zero_point)
        scales.scale(lay.down[e], col=s)
        scales.scale(lay.gate_up[2 * e + 1], row=(1.0 / s).astype(np.float32))
        loss[e] = round(float(ratio), 4)
    return {"experts_awq": len(loss), "rtn_fallback": fallback, "expert_tokens": [int(c) for c in counts],
            "loss_vs_rtn": loss}


def awq_folds_exactly(layer: MoeLayer) -> bool:
    """Whether awq_down_scales applies: per-expert matrices and silu(gate) * up."""
    return layer.layout == 0 and layer.activation == 0
