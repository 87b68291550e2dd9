"""`bessemer diff`: every node of an engine against HF on the same tokens, through the CLI."""

import subprocess

import numpy as np
import pytest

from bessemer.artifacts.diff import diff_engine

IDS = "3,14,15,92,65,35,89,79,32,38,46,26"


def _diff(engine, reference, *extra):
    return subprocess.run(["bessemer", "diff", str(engine), "--reference", str(reference), "--ids", IDS, "-q", *extra],
                          capture_output=True, text=True)


@pytest.mark.slow
def test_engine_matches_its_checkpoint_node_by_node(tiny_checkpoint, tiny_engine):
    r = _diff(tiny_engine("qwen2"), tiny_checkpoint("qwen2"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("all ") and "within tolerance" in r.stdout
    rows, rtol = diff_engine(tiny_engine("qwen2"), tiny_checkpoint("qwen2"), [int(t) for t in IDS.split(",")])
    compared = [r for r in rows if r.max_error is not None]
    # every kind of node has an HF counterpart: fused qkv/gate_up, attention, activation, norms, logits
    assert {r.op for r in compared} >= {"embedding", "rms_norm", "add_rms_norm", "linear", "attention", "silu_mul",
                                        "gather_rows"}
    assert rtol == 1e-4 and max(r.rel_error for r in compared) <= rtol


@pytest.mark.slow
def test_first_diverging_node_is_the_wrong_tensor(tiny_checkpoint, tiny_engine, tmp_path):
    """The engine against a checkpoint that differs in one tensor: nodes before it agree, the
    first that reads it is named."""
    from safetensors.numpy import load_file, save_file

    ref = tmp_path / "other"
    ref.mkdir()
    for f in tiny_checkpoint("llama-untied").iterdir():
        (ref / f.name).write_bytes(f.read_bytes())
    tensors = load_file(ref / "model.safetensors")
    name = "model.layers.1.mlp.down_proj.weight"
    tensors[name] = (tensors[name] * np.float32(1.05)).astype(np.float32)
    save_file(tensors, ref / "model.safetensors", metadata={"format": "pt"})
    r = _diff(tiny_engine("llama-untied"), ref)
    assert r.returncode == 1
    assert r.stdout.strip().splitlines()[-1].startswith("first diverging node: model.layers.1.mlp.down_proj (step")
    before = r.stdout.split("model.layers.1.mlp.down_proj")[0]
    assert " over" not in before  # every earlier node within tolerance


def test_tensor_parallel_engine_is_refused(tiny_checkpoint, tiny_engine):
    r = _diff(tiny_engine("llama-untied", tp_size=2), tiny_checkpoint("llama-untied"))
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: bessemer diff compares single-rank engines; build the engine again with --tp 1"]
