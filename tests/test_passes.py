"""Passes as before/after graphs, and by the reference interpreter on both."""

import numpy as np
import pytest

from bessemer.builder.checkpoint import Checkpoint
from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError, Node, WeightRef, verify
from bessemer.ir.interpret import interpret
from bessemer.targets.cpu.lowering import lower
from bessemer.builder.passes.fuse_add_rmsnorm import fuse_add_rmsnorm
from bessemer.builder.passes.fuse_gate_up import fuse_gate_up
from bessemer.builder.passes.fuse_qkv import fuse_qkv
from bessemer.builder.pipeline import run_passes
from bessemer.models.registry import family_for
from tolerances import INTERPRETER_ATOL


def _graph(ckpt_dir):
    ckpt = Checkpoint(ckpt_dir)
    family = family_for(ckpt.config)
    return family.build_graph(family.config_from_hf(ckpt.config), ckpt.shapes()), ckpt


def _ops(graph):
    return [n.op for n in graph.nodes]


def test_fuse_qkv_structure(tiny_checkpoint):
    before, _ = _graph(tiny_checkpoint("qwen2"))
    after = verify(fuse_qkv(before, BuildConfig()))
    assert _ops(before).count("linear") - _ops(after).count("linear") == 2 * 2  # 2 layers
    fused = next(n for n in after.nodes if n.name == "model.layers.0.self_attn.qkv_proj")
    assert [p.rsplit(".", 2)[1] for p in fused.weights[0].parts] == ["q_proj", "k_proj", "v_proj"]
    assert fused.weights[1].name.endswith("qkv_proj.bias")  # qwen2 biases are fused too
    split = next(n for n in after.nodes if n.op == "split")
    assert split.attrs["sizes"] == [64, 32, 32]
    assert split.outputs == ("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                             "model.layers.0.self_attn.v_proj")


def test_fuse_gate_up_and_add_rmsnorm_structure(tiny_checkpoint):
    before, _ = _graph(tiny_checkpoint("llama-untied"))
    g = verify(fuse_gate_up(before, BuildConfig()))
    assert sum(n.name.endswith("gate_up_proj") for n in g.nodes) == 2
    g = verify(fuse_add_rmsnorm(g, BuildConfig()))
    # per layer: attn residual + next layer's input norm fuse; the last mlp add stays an add
    assert _ops(g).count("add_rms_norm") == 3 and _ops(g).count("add") == 1
    fused = next(n for n in g.nodes if n.op == "add_rms_norm")
    assert fused.name == "model.layers.0.post_attention_layernorm"
    assert fused.outputs == ("model.layers.0.post_attention_layernorm", "model.layers.0.attn_residual")


@pytest.mark.parametrize("kind", ["llama-tied", "mistral", "qwen2"])
def test_passes_preserve_interpreter_output(kind, tiny_checkpoint):
    before, ckpt = _graph(tiny_checkpoint(kind))
    after, applied = run_passes(before, BuildConfig())
    assert applied == ["fuse_qkv", "fuse_gate_up", "fuse_add_rmsnorm"]
    ids = list(np.random.default_rng(0).integers(0, 250, 21))
    a, b = interpret(before, ckpt.get, ids), interpret(after, ckpt.get, ids)
    assert np.abs(a - b).max() <= INTERPRETER_ATOL


def test_interpreter_matches_hf(tiny_checkpoint):
    from conftest import hf_logits

    graph, ckpt = _graph(tiny_checkpoint("llama3-rope"))
    ids = list(range(3, 40))
    assert np.abs(interpret(graph, ckpt.get, ids) - hf_logits(tiny_checkpoint("llama3-rope"), ids)).max() <= INTERPRETER_ATOL


def test_verifier_rejects_bad_graphs():
    w = WeightRef.single("w", (8, 4))
    shapes = {"w": (8, 4), "t": (10, 4)}
    emb = Node("emb", "embedding", (), ("x",), (WeightRef.single("t", (10, 4)),))
    ok = Graph((emb, Node("lin", "linear", ("x",), ("y",), (w,))), "y", weight_shapes=shapes)
    verify(ok)
    with pytest.raises(GraphError, match="not defined"):
        verify(Graph((Node("lin", "linear", ("x",), ("y",), (w,)),), "y", weight_shapes=shapes))
    with pytest.raises(GraphError, match="closed op set"):
        verify(Graph((emb, Node("g", "gelu", ("x",), ("y",))), "y", weight_shapes=shapes))
    bad = WeightRef.single("w", (8, 5))
    with pytest.raises(GraphError, match="in_features"):
        verify(Graph((emb, Node("lin", "linear", ("x",), ("y",), (bad,))), "y", weight_shapes={**shapes, "w": (8, 5)}))
    with pytest.raises(GraphError, match="dead node"):
        verify(Graph((emb, Node("lin", "linear", ("x",), ("y",), (w,)), Node("n", "add", ("x", "x"), ("z",))), "y",
                     weight_shapes=shapes))


def test_memory_plan_reuses_buffers_and_views(tiny_checkpoint):
    graph, _ = _graph(tiny_checkpoint("llama-untied"))
    graph, _ = run_passes(graph, BuildConfig())
    plan, specs = lower(graph, BuildConfig(), {"num_layers": 2, "num_kv_heads": 2, "head_dim": 16})
    assert len(plan.buffers) <= 8  # independent of the number of layers
    rope = next(s for s in plan.steps if s.op == "rope")
    qkv = next(s for s in plan.steps if s.node.endswith("qkv_proj"))
    # rope rotates q and k in place inside the fused qkv output: views, no copies
    assert [v.buffer for v in rope.ins] == [qkv.outs[0].buffer] * 2
    assert [v.col for v in rope.ins] == [0, 64] and rope.outs == ()
    assert {s.layout for s in specs if s.name.endswith("proj.weight")} == {"panel16"}
