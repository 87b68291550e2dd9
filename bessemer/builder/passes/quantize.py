"""quantize: marks every linear weight that is not excluded for quantized storage.

The pass only annotates: WeightRef.quant becomes the weight's stored format
(quantization/formats.py, chosen by formats.weight_format from the QuantConfig); the
weights are quantized by that format while they are packed (builder/weights.py) and the
target's lowering picks the kernel that reads it. Exclusions are fnmatch patterns on node
names (HF module paths). A w8a8 (SmoothQuant) linear whose input comes from attention (no
producer to fold 1/s into, quantization/smoothquant.py) gets the kernel-applied 1/s.
A MoE router (the linear feeding a moe op's router logits) stays in floating point; the
experts themselves are stored float32 by the cpu target (no quantized moe kernel yet).

lm_head (the linear whose output is the graph's logits) follows QuantConfig.lm_head, not
the mode's scheme (see quantization/config.py). A table the embedding gathers from (tied
lm_head) is stored once: when lm_head is quantized, the embedding node gets the same
annotation and lowering gives it the kernel that gathers and dequantizes quantized rows.
"""

from dataclasses import replace
from fnmatch import fnmatch

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph
from bessemer.quantization.formats import Int8PerChannel, weight_format


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
    for n in graph.nodes:
        excluded = any(fnmatch(n.name, pat) or fnmatch(n.name, pat + ".*") for pat in q.exclude_modules)
        if n.op != "linear" or excluded or n.outputs[0] in router_logits:
            nodes.append(n)
            continue
        w = n.weights[0]
        if graph.output in n.outputs:  # lm_head
            if q.lm_head == "none":
                nodes.append(n)
                continue
            quant = Int8PerChannel()
        elif w.name in gathered:  # only lm_head may share the embedding's table
            nodes.append(n)
            continue
        else:
            smooth = q.act_bits == 8 and q.o_proj_smoothing == "kernel" and producer.get(n.inputs[0]) == "attention"
            quant = weight_format(q, w.shape[1], smooth)
        if w.name in gathered:
            table_quant[w.name] = quant
        nodes.append(replace(n, weights=(replace(w, quant=quant),) + n.weights[1:]))
    nodes = [replace(n, weights=tuple(replace(w, quant=table_quant[w.name]) for w in n.weights))
             if n.op == "embedding" and n.weights[0].name in table_quant else n for n in nodes]
    return replace(graph, nodes=tuple(nodes), values={})
