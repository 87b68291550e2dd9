"""Layer roles: passes and calibration read what the model file states about each linear,
never module names. Oracles: a Llama layer's structure written out by hand (conftest's
llama_input_key), and the same graph with every module renamed (GPT-NeoX/Phi-style names),
which must shard, fuse and calibrate exactly like the original."""

import re
from dataclasses import replace

import numpy as np
import pytest
from conftest import llama_input_key, model_graph
from tolerances import INTERPRETER_ATOL

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError, Node, verify
from bessemer.builder.input_groups import input_groups, linear_input_keys
from bessemer.ir.interpret import interpret, interpret_ranks
from bessemer.builder.pipeline import run_passes
from bessemer.ir.roles import Fusion
from bessemer.quantization.channel_scales import Fold

OTHER_NAMES = [  # HF Llama module names -> names another family might use
    (r"\.self_attn\.q_proj", ".attention.query"), (r"\.self_attn\.k_proj", ".attention.key"),
    (r"\.self_attn\.v_proj", ".attention.value"), (r"\.self_attn\.o_proj", ".attention.dense"),
    (r"\.self_attn\.qkv_proj", ".attention.query_key_value"), (r"\.mlp\.gate_proj", ".mlp.w1"),
    (r"\.mlp\.up_proj", ".mlp.w3"), (r"\.mlp\.down_proj", ".mlp.w2"), (r"\.mlp\.gate_up_proj", ".mlp.w13"),
    (r"input_layernorm", "ln_1"), (r"post_attention_layernorm", "ln_2"), (r"^lm_head", "embed_out"),
    (r"^model\.norm", "final_layer_norm"), (r"^model\.layers", "gpt.h"), (r"^model\.embed_tokens", "gpt.wte"),
    (r"^model\.", "gpt."),
]


def _rename(name: str) -> str:
    for pattern, new in OTHER_NAMES:
        name = re.sub(pattern, new, name)
    return name


def _renamed_weight(w):
    if w is None:
        return None
    return replace(w, name=_rename(w.name), parts=tuple(_rename(p) for p in w.parts))


def _renamed_graph(graph: Graph) -> Graph:
    """The same model as a family with other module names would define it."""
    def node(n: Node) -> Node:
        role = n.role
        if role is not None and role.fusion is not None:
            role = replace(role, fusion=Fusion(role.fusion.kind, _rename(role.fusion.name)))
        return replace(n, name=_rename(n.name), inputs=tuple(map(_rename, n.inputs)),
                       outputs=tuple(map(_rename, n.outputs)), weights=tuple(map(_renamed_weight, n.weights)),
                       role=role)
    return Graph(tuple(map(node, graph.nodes)), _rename(graph.output),
                 constants={_rename(k): v for k, v in graph.constants.items()},
                 weight_shapes={_rename(k): v for k, v in graph.weight_shapes.items()})


@pytest.mark.parametrize("kind", ["llama-untied", "qwen2", "mistral", "llama-tied"])
def test_input_groups_match_the_llama_layer(kind, tiny_checkpoint):
    graph, _ = model_graph(tiny_checkpoint(kind))
    groups = input_groups(graph)
    keys = linear_input_keys(groups)
    linears = [n.name for n in graph.nodes if n.op == "linear" and n.name != "lm_head"]
    assert keys == {n: llama_input_key(n) for n in linears}
    p = "model.layers.1"
    folds = {g.key: g.fold for g in groups}
    assert folds[f"{p}.self_attn.q_proj"] == Fold((f"{p}.input_layernorm.weight",))
    assert folds[f"{p}.self_attn.o_proj"] is None  # attention: no per-channel producer
    assert folds[f"{p}.mlp.gate_proj"] == Fold((f"{p}.post_attention_layernorm.weight",))
    assert folds[f"{p}.mlp.down_proj"] == Fold((f"{p}.mlp.up_proj.weight",))  # through silu_mul
    qkv = next(g for g in groups if g.key == f"{p}.self_attn.q_proj")
    assert qkv.weights == tuple(f"{p}.self_attn.{m}_proj.weight" for m in "qkv")


@pytest.mark.parametrize("kind", ["llama-untied", "qwen2", "llama-tied"])
@pytest.mark.parametrize("tp", [1, 2])
def test_other_module_names_pass_identically(kind, tp, tiny_checkpoint):
    """Renaming every module changes nothing but names: the fused, sharded graphs of each
    rank and the calibration groups are the renamed originals, and compute the same logits."""
    graph, ckpt = model_graph(tiny_checkpoint(kind))
    other = verify(_renamed_graph(graph))
    assert {n.name for n in other.nodes}.isdisjoint(n.name for n in graph.nodes if "." in n.name)
    originals, renamed = [], []
    for r in range(tp):
        build = BuildConfig(tp_size=tp, tp_rank=r)
        originals.append(run_passes(graph, build)[0])
        renamed.append(run_passes(other, build)[0])
        assert renamed[-1].nodes == verify(_renamed_graph(originals[-1])).nodes
        assert renamed[-1].output == _rename(originals[-1].output)
    assert input_groups(other) == [
        replace(g, key=_rename(g.key), linears=tuple(map(_rename, g.linears)), weights=tuple(map(_rename, g.weights)),
                fold=g.fold and replace(g.fold, tensors=tuple(map(_rename, g.fold.tensors))))
        for g in input_groups(graph)]
    inverse = {_rename(k): k for k in graph.weight_shapes}
    ids = list(np.random.default_rng(1).integers(0, 250, 17))
    expected = interpret(graph, ckpt.get, ids)
    got = interpret_ranks(renamed, lambda name: ckpt.get(inverse[name]), ids)
    assert np.abs(got - expected).max() <= INTERPRETER_ATOL


def test_a_linear_without_a_role_is_refused_by_tensor_parallelism(tiny_checkpoint):
    graph, _ = model_graph(tiny_checkpoint("llama-untied"))
    bare = replace(graph, nodes=tuple(replace(n, role=None) if n.name.endswith("o_proj") else n
                                      for n in graph.nodes))
    with pytest.raises(GraphError, match="o_proj: this linear has no role"):
        run_passes(bare, BuildConfig(tp_size=2, tp_rank=0))
    # without fusion roles nothing is fused, and the graph still computes the same
    unfused = replace(graph, nodes=tuple(replace(n, role=replace(n.role, fusion=None)) if n.role else n
                                         for n in graph.nodes))
    assert not any(n.op == "split" for n in run_passes(unfused, BuildConfig())[0].nodes)


def test_verifier_checks_roles_against_weight_parts(tiny_checkpoint):
    graph, _ = model_graph(tiny_checkpoint("llama-untied"))
    q = next(n for n in graph.nodes if n.name.endswith("q_proj"))
    bad = replace(q.role, shards=q.role.shards * 2)  # two shard kinds for one weight part
    with pytest.raises(GraphError, match="q_proj: role column"):
        verify(replace(graph, nodes=tuple(replace(n, role=bad) if n is q else n for n in graph.nodes)))
