"""quantize: marks every linear weight that is not excluded for quantized storage.

The pass only annotates (WeightRef.quant); the weights are quantized while they are
packed (builder/quantize_weights.py) and lowering picks the kernel that reads the stored
format. Exclusions are fnmatch patterns on node names (HF module paths).
w8a8 (SmoothQuant) linears also get act_bits 8, and `smooth` when their input comes from
attention (no producer to fold 1/s into, quantization/smoothquant.py): the kernel then
applies a stored per-channel multiplier.

lm_head (the linear whose output is the graph's logits) follows QuantConfig.lm_head, not
the mode's scheme (see quantization/config.py). A table the embedding gathers from (tied
lm_head) is stored once: when lm_head is quantized, the embedding node gets the same
annotation and lowering gives it the kernel that gathers and dequantizes quantized rows.
"""

from dataclasses import replace
from fnmatch import fnmatch

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph
from bessemer.quantization.primitives import effective_group_size

INT8 = (("bits", 8),)


def quantize(graph: Graph, build: BuildConfig) -> Graph:
    q = build.quant
    if q is None:
        return graph
    gathered = {w.name for n in graph.nodes if n.op == "embedding" for w in n.weights}
    producer = {out: m.op for m in graph.nodes for out in m.outputs}
    nodes, table_quant = [], {}
    for n in graph.nodes:
        excluded = any(fnmatch(n.name, pat) or fnmatch(n.name, pat + ".*") for pat in q.exclude_modules)
        if n.op != "linear" or excluded:
            nodes.append(n)
            continue
        w = n.weights[0]
        if graph.output in n.outputs:  # lm_head
            if q.lm_head == "none":
                nodes.append(n)
                continue
            quant = INT8
        elif w.name in gathered:  # only lm_head may share the embedding's table
            nodes.append(n)
            continue
        elif q.act_bits == 8:
            smooth = q.o_proj_smoothing == "kernel" and producer.get(n.inputs[0]) == "attention"
            quant = (("bits", 8), ("act_bits", 8), ("smooth", smooth))
        elif q.mode == "fp8":
            quant = (("bits", 8), ("dtype", q.weight_dtype))
        elif q.bits == 8:
            quant = INT8
        else:
            quant = (("bits", 4), ("group_size", effective_group_size(w.shape[1], q.group_size)),
                     ("zero_point", q.zero_point))
        if w.name in gathered:
            table_quant[w.name] = quant
        nodes.append(replace(n, weights=(replace(w, quant=quant),) + n.weights[1:]))
    nodes = [replace(n, weights=tuple(replace(w, quant=table_quant[w.name]) for w in n.weights))
             if n.op == "embedding" and n.weights[0].name in table_quant else n for n in nodes]
    return replace(graph, nodes=tuple(nodes), values={})
