"""quantize: marks every linear weight that is not excluded for quantized storage.

The pass only annotates: WeightRef.quant becomes the weight's stored format
(quantization/formats.py, chosen by formats.weight_format from the QuantConfig); the
weights are quantized by that format while they are packed (builder/weights.py) and the
target's lowering picks the kernel that reads it. Exclusions are fnmatch patterns on node
names (HF module paths). A w8a8 (SmoothQuant) linear whose input comes from attention (no
producer to fold 1/s into, quantization/smoothquant.py) gets the kernel-applied 1/s.
A MoE router (the linear feeding a moe op's router logits) stays in floating point. A moe
node's experts (gate_up, down) are stored ExpertStack(the mode's int8 / int4 / E4M3 format:
formats.expert_format) when the target has a kernel for them: w4a16-gptq chooses each expert's
codes by GPTQ from the tokens routed to it (so does fp8 with its default --fp8-rounding gptq),
w4a16-awq searches each expert's gate/up and down grids for their output error on them and
scales its down from them (all RTN for an expert too few reach:
quantization/expert_calibration.py), the rest is round to nearest (fp8 experts scale their
activations per token: a static scale is the linears' only); otherwise (w8a8-sq, which has no
expert kernel; a target without a kernel for the format; rows, per tensor-parallel rank, that
are not whole panels of 16; a shape the target's expert kernel refuses, such as cuda's 4-bit
groups that are not a multiple of 32) they stay float32.
expert_notes() says which, for the build log.

An untied embedding table follows QuantConfig.embedding (none by default; a tied one is
lm_head's). lm_head (the linear whose output is the graph's logits) follows QuantConfig.lm_head, not
the mode's scheme (see quantization/config.py). A precision plan (QuantConfig.precision,
chosen by measurement: quantization/mixed_precision.py) names the scheme of each linear it
lists, lm_head included; linears it does not list follow the mode. A table the embedding gathers from (tied
lm_head) is stored once: when lm_head is quantized, the embedding node gets the same
annotation and lowering gives it the kernel that gathers and dequantizes quantized rows.
"""

from dataclasses import replace
from fnmatch import fnmatch

from bessemer.builder.config import BuildConfig
from bessemer.builder.passes.shard_tensor_parallel import rank_expert_size
from bessemer.ir.graph import Graph, Node
from bessemer.errors import InvalidOptionError
from bessemer.quantization.expert_calibration import MIN_EXPERT_TOKENS
from bessemer.quantization.formats import (ExpertStack, Fp8E4M3, Int4Group, Int8PerChannel, expert_format,
                                          scheme_format, weight_format)
from bessemer.targets import get_target


def quantize(graph: Graph, build: BuildConfig) -> Graph:
    q = build.quant
    if q is None:
        return graph
    gathered = {w.name for n in graph.nodes if n.op == "embedding" for w in n.weights}
    producer = {out: m.op for m in graph.nodes for out in m.outputs}
    # a MoE router's logits pick experts: a quantization error there changes which experts a
    # token reads (a discontinuity, for a weight of only num_experts rows), so routers stay
    # in floating point, as quantized MoE checkpoints keep them
    router_logits = {m.inputs[1] for m in graph.nodes if m.op == "moe"}
    nodes, table_quant = [], {}
    plan = dict(q.precision)
    for n in graph.nodes:
        excluded = any(fnmatch(n.name, pat) or fnmatch(n.name, pat + ".*") for pat in q.exclude_modules)
        if n.op == "moe" and not excluded:
            nodes.append(_quantize_experts(n, build))
            continue
        if n.op != "linear" or excluded or n.outputs[0] in router_logits:
            nodes.append(n)
            continue
        w = n.weights[0]
        if graph.output in n.outputs:  # lm_head
            scheme = plan.get(n.name, q.lm_head)
            if scheme == "none":
                nodes.append(n)
                continue
            quant = scheme_format(scheme, w.shape[1])
        elif w.name in gathered:  # only lm_head may share the embedding's table
            nodes.append(n)
            continue
        elif n.name in plan:
            quant = scheme_format(plan[n.name], w.shape[1])
        else:
            smooth = q.act_bits == 8 and q.o_proj_smoothing == "kernel" and producer.get(n.inputs[0]) == "attention"
            try:
                quant = weight_format(q, w.shape[1], smooth)
            except InvalidOptionError as e:  # a K the mode's format cannot store (w4k: not whole sub-blocks)
                raise InvalidOptionError(f"{n.name}: {e}") from None
        if w.name in gathered:
            table_quant[w.name] = quant
        nodes.append(replace(n, weights=(replace(w, quant=quant),) + n.weights[1:]))
    for n in (n for n in graph.nodes if n.op == "embedding" and q.embedding != "none"):
        table = n.weights[0]
        if table.name in table_quant or table.name in {w.name for m in graph.nodes if m.op == "linear" for w in m.weights}:
            raise InvalidOptionError(f"--embedding {q.embedding} applies to an untied embedding table; this "
                                     "model ties its table to lm_head, which --lm-head stores: drop --embedding")
        table_quant[table.name] = scheme_format(q.embedding, table.shape[1])
    nodes = [replace(n, weights=tuple(replace(w, quant=table_quant[w.name]) for w in n.weights))
             if n.op == "embedding" and n.weights[0].name in table_quant else n for n in nodes]
    return replace(graph, nodes=tuple(nodes), values={})


def _float32_experts_reason(node: Node, build: BuildConfig) -> str | None:
    """Why node's experts stay float32 under build.quant, or None: they are quantized."""
    q = build.quant
    if not isinstance(expert_format(q, node.weights[0].shape[1]), (Int8PerChannel, Int4Group, Fp8E4M3)):
        return f"no {q.mode} expert kernel; w8a16, w4a16 and fp8 quantize experts"
    try:
        kernel = get_target(build.target).quant_kernel("moe", ExpertStack)
    except InvalidOptionError:
        return f"the {build.target} target has no quantized expert kernel yet"
    # the size each rank's experts keep (tensor parallelism splits it after this pass)
    size = rank_expert_size(node, build.tp_size)
    if (2 * size) % 16 or node.weights[0].shape[1] % 16:  # K of gate_up: hidden
        per_rank = f" (per rank at --tp {build.tp_size}: {size})" if build.tp_size > 1 else ""
        return f"2 * expert_size{per_rank} and hidden_size must be multiples of 16 for quantized experts"
    for w in node.weights[:2]:  # the target's own limits (cuda: 4-bit groups of a multiple of 32)
        try:
            kernel(_expert_format(node, w, build), w.shape)
        except InvalidOptionError as e:
            return str(e)
    return None


def _expert_format(node: Node, w, build: BuildConfig) -> ExpertStack:
    """The stored format of one of node's expert matrices (gate_up or down) under build.quant."""
    stacked = int(node.attrs.get("layout", 0)) == 1
    experts = int(node.attrs.get("local_experts", node.attrs["num_experts"]))
    return ExpertStack(expert_format(build.quant, w.shape[1]), experts, stacked)


def _quantize_experts(node: Node, build: BuildConfig) -> Node:
    """node's gate_up and down as ExpertStacks of the mode's format (each with its own K's
    group size), requantized from the dequantized values when the checkpoint ships MXFP4;
    unchanged where they stay float32 (a shipped MXFP4 then stays MXFP4 where the target
    keeps it: targets/cpu/lowering.py)."""
    if _float32_experts_reason(node, build) is not None:
        return node
    weights = tuple(replace(w, quant=_expert_format(node, w, build)) for w in node.weights[:2])
    return replace(node, weights=weights + node.weights[2:],
                   attrs={k: v for k, v in node.attrs.items() if k != "mxfp4_experts"})


def expert_notes(graph: Graph, build: BuildConfig) -> list[str]:
    """One build-log line per distinct way the experts are stored (never silent: what an AWQ
    build leaves RTN; a calibrated build's per-expert outcome follows the packing, in
    expert_calibration_lines)."""
    if build.quant is None:
        return []
    notes = set()
    for n in (n for n in graph.nodes if n.op == "moe"):
        why = _float32_experts_reason(n, build)
        q = build.quant
        if why is None and isinstance(expert_format(q, n.weights[0].shape[1]), Fp8E4M3):
            codes = (f"E4M3 codes by GPTQ per expert from the calibration tokens routed to it (round to nearest for "
                     f"an expert fewer than {MIN_EXPERT_TOKENS} reach)" if q.fp8_rounding == "gptq"
                     else "E4M3 round to nearest")
            static = " (static scales are the linears' only)" if q.fp8_activations == "static" else ""
            notes.add(f"{codes}, activation scales dynamic per token{static}")
        elif why is None and q.algorithm == "gptq":
            notes.add(f"GPTQ per expert from the calibration tokens routed to it (RTN for an expert fewer than "
                      f"{MIN_EXPERT_TOKENS} reach)")
        elif why is None and q.algorithm == "awq":
            notes.add(_awq_expert_note(n, q))
        elif why is None:
            notes.add("RTN" if q.algorithm == "rtn" else f"RTN ({q.algorithm} calibrates linears only)")
        else:
            shipped = "; MXFP4 as shipped where the target keeps it" if n.attrs.get("mxfp4_experts") else ""
            notes.add(f"float32 ({why}){shipped}")
    return [f"experts: {note}" for note in sorted(notes)]


def _awq_expert_note(node: Node, q) -> str:
    """What w4a16-awq does to a moe node's experts (quantization/expert_calibration.py)."""
    searched = ("grids RTN (--zero-point's min/max grid has no scale search)" if q.zero_point else
                "gate/up and down grids searched per expert for their output error on the calibration tokens "
                "routed to it")
    if int(node.attrs.get("layout", 0)) == 0 and not node.attrs.get("activation"):
        scales = "down scaled per expert from those tokens (folded into its up rows)"
    else:
        scales = "no down scales (gpt-oss's clamped activation takes no exact per-expert fold)"
    return f"AWQ: {searched}; {scales}; RTN for an expert fewer than {MIN_EXPERT_TOKENS} calibration tokens reach"


# how expert_calibration_lines names each ExpertCalibration.algorithm
CALIBRATED_BY = {"gptq": "GPTQ", "awq": "AWQ grid searched on the output error"}


def expert_calibration_lines(quant_error: dict, shown: int = 8) -> list[str]:
    """One build-log line per expert weight quantized per expert (the build report's
    quant_error entries with experts_calibrated): how many experts calibration chose the
    codes of, and which fell back to RTN with their calibration tokens."""
    lines = []
    for name, v in quant_error.items():
        if "experts_calibrated" not in v:
            continue
        fallback = v["rtn_fallback"]
        listed = ", ".join(f"{e} ({t} tokens)" for e, t in list(fallback.items())[:shown])
        more = f" and {len(fallback) - shown} more" if len(fallback) > shown else ""
        tokens = v["expert_tokens"]
        by = CALIBRATED_BY[v["calibrated_by"]]
        lines.append(f"{name}: {by} for {v['experts_calibrated']}/{v['experts']} experts "
                     f"({min(tokens)}-{max(tokens)} tokens each)"
                     + (f"; RTN for {len(fallback)}: {listed}{more}" if fallback else ""))
    return lines
