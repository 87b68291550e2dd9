"""`bessemer diff`: every node of an engine against HF transformers on the same tokens.

The engine's own kernels compute each node: for plan step i, an executor runs the steps up
to i and returns that step's output (its plan truncated there, the output view as its
"logits"). HF's values are captured by forward hooks and matched by module path, which node
names keep: a node is compared with its HF module's output, or with the input of the HF
module that reads it (attention -> o_proj's input, the gated activation -> down_proj's
input, a residual add -> the next norm's input), or, for a linear the fusion passes made,
with its parts' modules' outputs side by side. The first node over the tolerance is where a
new family, a wrong checkpoint or a kernel goes wrong.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bessemer.errors import BessemerError
from bessemer.format import container
from bessemer.format.kv import blocks_needed
from bessemer.format.step import StepBatch

# ops whose HF module output is the node's value (other ops are matched through consumers)
OWN_OUTPUT_OPS = ("embedding", "linear", "rms_norm", "add_rms_norm", "rms_norm_heads")
# ops whose input 0 is their HF module's input (not add_rms_norm: HF's norm reads the sum)
SAME_INPUT_OPS = ("linear", "rms_norm", "rms_norm_heads")


@dataclass
class NodeDiff:
    step: int
    node: str
    op: str
    max_error: float | None  # None: no HF counterpart
    max_ref: float
    rel_error: float | None
    ok: bool


def default_rtol(config: dict) -> float:
    """fp32 engines: summation order only; bf16 weights or quantization: their own error."""
    if config.get("quant"):
        return 0.1
    return 1e-4 if config["build"]["dtype"] == "float32" else 3e-2


def reference_graph(model_dir: Path, fuse: bool):
    """The graph the engine was lowered from (same family, same fusion), for node structure."""
    from bessemer.builder.checkpoint import Checkpoint
    from bessemer.builder.config import BuildConfig
    from bessemer.builder.pipeline import run_passes
    from bessemer.models.registry import family_for

    ckpt = Checkpoint(model_dir)
    family = family_for(ckpt.config)
    graph = family.build_graph(family.config_from_hf(ckpt.config), ckpt.shapes())
    ckpt.close()
    return run_passes(graph, BuildConfig(fuse=fuse), lowered=False)[0]


def capture_hf(model_dir: Path, ids: list[int], vocab_size: int | None = None) -> dict:
    """{module path: (input 0, output)} of every HF module, (T, width) float32; the model's
    vocabulary must be `vocab_size` (the engine's) when given."""
    import torch

    from bessemer.builder.hf_loader import load_hf_model

    model = load_hf_model(model_dir, "bessemer diff --reference", vocab_size=vocab_size)
    seen: dict[str, tuple] = {}

    def flat(t):
        if isinstance(t, (tuple, list)):
            t = t[0] if t else None
        if not isinstance(t, torch.Tensor) or t.dim() < 2:
            return None
        return t.detach().float().reshape(len(ids), -1).numpy() if t.numel() % len(ids) == 0 else None

    def hook(name):
        def record(module, args, output):
            seen[name] = (flat(args[0]) if args else None, flat(output))
        return record

    handles = [m.register_forward_hook(hook(name)) for name, m in model.named_modules() if name]
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return seen


def reference_value(node, graph, hf: dict) -> np.ndarray | None:
    users = graph.consumers().get(node.outputs[0], [])
    if any(u.op == "scale" for u in users):
        return None  # HF's module output already holds the scaling that follows here
    for u in users:  # the input of an HF module that reads this value
        if (u.op in SAME_INPUT_OPS and u.name in hf and u.inputs[0] == node.outputs[0]
                and hf[u.name][0] is not None):
            return hf[u.name][0]
    if node.op in OWN_OUTPUT_OPS and node.name in hf and hf[node.name][1] is not None:
        return hf[node.name][1]
    if node.op == "linear":  # fused: its parts' modules side by side
        pieces = []
        ref = node.weights[0]
        for i, part in enumerate(ref.parts):
            out = hf.get(part.rsplit(".", 1)[0], (None, None))[1]
            if out is None:
                return None
            pieces.append(out[:, ref.slices[i][0]:ref.slices[i][1]] if ref.slices else out)
        return np.concatenate(pieces, axis=1)
    return None


def run_prefix(engine, step: int, ids: list[int], workdir: Path) -> np.ndarray:
    """The output of plan step `step` for one prompt, computed by the engine's kernels (see
    prefix_executor)."""
    blocks = blocks_needed(len(ids), int(engine.build["kv_block_size"]))
    made = prefix_executor(engine, step, blocks + 1, workdir)
    if made is None:
        return None
    executor, width = made
    t = len(ids)
    doubled = executor.step(StepBatch.of(ids, np.arange(t), [0, t], [t], np.arange(blocks)[None, :], np.arange(t)))
    return doubled[:, :width] / np.float32(2)


def prefix_executor(engine, step: int, num_kv_blocks: int, workdir: Path, num_threads: int = 1):
    """(executor, width): an executor whose "logits" are plan step `step`'s output doubled
    (None if that output is wider than the vocabulary): the plan cut after that step, plus
    one `add` of the output to itself into a fresh buffer as wide as the vocabulary (the
    executor returns vocab_size columns and checks token ids against it); the caller keeps
    columns [0, width) and halves them (x + x and / 2 are exact). A step without outputs
    (rope works in place) gives its first input as it is after the step."""
    plan = engine.header["plan"]
    s = plan["steps"][step]
    buf, col, width = (s["outs"] or s["ins"])[0]
    vocab = plan["vocab_size"]
    if width > vocab:
        return None
    rows = plan["buffers"][buf]["rows"]
    out = len(plan["buffers"])
    # x + x into columns [0, width); the rest of the vocabulary-wide view is filled the same way
    # (ignored here) because the loader refuses a plan whose logits are not all written
    doubles = [{"op": "add", "version": 1, "node": "diff.capture", "ins": [[buf, col, w], [buf, col, w]],
                "outs": [[out, c, w]], "weights": [], "attrs": {}}
               for c in range(0, vocab, width) for w in [min(width, vocab - c)]]
    steps = plan["steps"][:step + 1] + doubles
    # the cache holds the layers the kept steps read (the loader refuses unread layers)
    layers = max((int(s["attrs"]["layer"]) + 1 for s in steps if "layer" in s["attrs"]), default=0)
    truncated = dict(plan, steps=steps, logits=[out, 0, vocab], kv_cache=dict(plan["kv_cache"], num_layers=layers),
                     buffers=plan["buffers"] + [{"id": out, "width": vocab, "rows": rows}])
    header = dict(engine.header, plan=truncated)
    # the executor reads the plan from its rank file: a copy with this plan in its header
    rank = workdir / engine.rank_path.name
    if not rank.exists() or not container.write_header_in_place(rank, header):
        container.rewrite_header(engine.rank_path, rank, lambda h: h.update(plan=truncated))
    return replace(engine, header=header, rank_path=rank).create_executor(num_threads, num_kv_blocks), width


def load_diffable(engine_dir: str | Path):
    """The engine, if diff can run it: its plan's steps one prefix at a time, on the cpu
    target's executor, one rank (a cuda plan has no `steps`; TP ranks hold slices)."""
    from bessemer.runtime.engine import Engine

    target = Engine.read_config(engine_dir)["target"]
    if target != "cpu":
        raise BessemerError(f"bessemer diff runs the plan of a cpu engine step by step; {engine_dir} is a {target} "
                            "engine: build a cpu engine of the same checkpoint (build-engine MODEL_DIR --target cpu) "
                            "and diff that")
    engine = Engine.load(engine_dir)
    if engine.config["mapping"]["tp_size"] != 1:
        raise BessemerError("bessemer diff compares single-rank engines; build the engine again with --tp 1")
    return engine


def check_prompt(engine, ids: list[int]) -> None:
    """The whole prompt runs as one prefill step of every plan prefix: its ids must be in the
    vocabulary and it must fit one step and one sequence of the engine (a longer prompt ran
    for an hour, past the engine's positions)."""
    vocab = int(engine.header["plan"]["vocab_size"])
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise BessemerError(f"token id {bad} is outside the engine's vocabulary of {vocab} tokens; "
                            f"pass ids from 0 to {vocab - 1}")
    max_seq_len, max_num_tokens = int(engine.build["max_seq_len"]), int(engine.build["max_num_tokens"])
    if len(ids) > min(max_seq_len, max_num_tokens):
        raise BessemerError(f"the prompt has {len(ids)} tokens and {engine.dir} runs at most "
                            f"{min(max_seq_len, max_num_tokens)} in one step (max_seq_len {max_seq_len}, "
                            f"max_num_tokens {max_num_tokens}); pass a shorter prompt")


def diff_engine(engine_dir: str | Path, model_dir: str | Path, ids: list[int], rtol: float | None = None,
                progress=lambda m: None) -> tuple[list[NodeDiff], float]:
    from bessemer.builder.hf_loader import require_hf_checkpoint

    engine = load_diffable(engine_dir)
    check_prompt(engine, ids)
    vocab = int(engine.header["plan"]["vocab_size"])
    model_dir = require_hf_checkpoint(model_dir, "bessemer diff --reference", vocab)
    rtol = default_rtol(engine.config) if rtol is None else rtol
    graph = reference_graph(model_dir, bool(engine.build.get("fuse", True)))
    nodes = {n.name: n for n in graph.nodes}
    progress(f"running {model_dir} with transformers")
    hf = capture_hf(model_dir, ids, vocab)
    rows = []
    steps = engine.header["plan"]["steps"]
    with tempfile.TemporaryDirectory(prefix="bessemer-diff-") as workdir:
        rows = _diff_steps(engine, steps, nodes, graph, hf, ids, rtol, Path(workdir), progress)
    return rows, rtol


def _diff_steps(engine, steps, nodes, graph, hf, ids, rtol, workdir: Path, progress) -> list[NodeDiff]:
    rows = []
    for i, step in enumerate(steps):
        node = nodes.get(step["node"])
        if not step["outs"] or node is None:
            continue
        ref = reference_value(node, graph, hf)
        got = run_prefix(engine, i, ids, workdir)
        if ref is None or got is None or ref.shape != got.shape:
            rows.append(NodeDiff(i, node.name, step["op"], None, 0.0, None, True))
            continue
        err, scale = float(np.abs(got - ref).max()), float(np.abs(ref).max())
        rel = err / max(scale, 1e-30)
        rows.append(NodeDiff(i, node.name, step["op"], err, scale, rel, rel <= rtol))
        if (i + 1) % 20 == 0:
            progress(f"diff: {i + 1}/{len(steps)} plan steps")
    return rows


def format_diff(rows: list[NodeDiff], rtol: float) -> str:
    first = next((r for r in rows if not r.ok), None)
    lines = [f"{'step':>4}  {'node':<48} {'op':<16} {'max|err|':>10} {'max|HF|':>10} {'rel':>9}  (tolerance {rtol:g})"]
    for r in rows:
        if r.max_error is None:
            lines.append(f"{r.step:>4}  {r.node:<48} {r.op:<16} {'-':>10} {'-':>10} {'-':>9}  no HF counterpart")
            continue
        mark = "  <- first divergence" if r is first else ("" if r.ok else "  over")
        lines.append(f"{r.step:>4}  {r.node:<48} {r.op:<16} {r.max_error:>10.3g} {r.max_ref:>10.3g} "
                     f"{r.rel_error:>9.2e}{mark}")
    compared = sum(r.max_error is not None for r in rows)
    lines.append(f"first diverging node: {first.node} (step {first.step})" if first else
                 f"all {compared} compared nodes within tolerance")
    return "\n".join(lines)
