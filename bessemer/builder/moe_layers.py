"""moe_layers: each moe node of a model's unpassed graph as the per-expert calibration reads
it (quantization/expert_calibration.MoeLayer): its router and expert tensors by checkpoint
name, its routing attrs, and the calibration key its input rows are kept under, which is
that of the input group its router belongs to (the router is a linear of the moe node's
input, so its hook sees every row the experts are routed from)."""

from __future__ import annotations

from bessemer.builder.input_groups import linear_input_keys
from bessemer.ir.graph import Graph
from bessemer.quantization.channel_scales import InputGroup
from bessemer.quantization.expert_calibration import MoeLayer


def moe_layers(graph: Graph, groups: list[InputGroup]) -> list[MoeLayer]:
    keys = linear_input_keys(groups)
    producers = graph.producers()
    layers = []
    for n in (n for n in graph.nodes if n.op == "moe"):
        router = producers[n.inputs[1]]
        if router.op != "linear" or router.inputs[0] != n.inputs[0]:
            raise ValueError(f"{n.name}: its router logits do not come from a linear of its input")
        a = n.attrs
        layout = int(a.get("layout", 0))
        gate_up_bias = n.weights[2] if len(n.weights) > 2 else None
        layers.append(MoeLayer(
            node=n.name, input_key=keys[router.weights[0].parts[0].rsplit(".", 1)[0]],
            router=router.weights[0].parts[0],
            router_bias=router.weights[1].parts[0] if len(router.weights) > 1 and router.weights[1] else None,
            gate_up=n.weights[0].parts, down=n.weights[1].parts,
            gate_up_bias=gate_up_bias.parts[0] if gate_up_bias is not None else None,
            num_experts=int(a["num_experts"]), top_k=int(a["top_k"]), expert_size=int(a["expert_size"]),
            softmax_after_topk=int(a["softmax_after_topk"]), norm_topk_prob=int(a["norm_topk_prob"]),
            layout=layout, activation=int(a.get("activation", 0))))
    return layers
