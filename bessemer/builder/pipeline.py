"""The pass pipeline: numbered phases of pure (Graph, BuildConfig) -> Graph passes.

verify() runs after every pass; `dump_dir` receives the graph after each phase as text
(`00-input.txt`, `01-fusion.txt`, ...), the view `--dump-ir DIR` gives of a build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError, format_graph, verify
from bessemer.builder.passes.fuse_add_rmsnorm import fuse_add_rmsnorm
from bessemer.builder.passes.fuse_gate_up import fuse_gate_up
from bessemer.builder.passes.fuse_qkv import fuse_qkv
from bessemer.builder.passes.quantize import quantize
from bessemer.builder.passes.shard_tensor_parallel import shard_tensor_parallel
from bessemer.errors import UnsupportedModelError
from bessemer.targets import get_target

Pass = Callable[[Graph, BuildConfig], Graph]


def phases(build: BuildConfig) -> list[tuple[str, list[Pass]]]:
    fusion = [fuse_qkv, fuse_gate_up, fuse_add_rmsnorm] if build.fuse else []
    # quantize after fusion: a fused qkv weight gets one set of per-channel/group scales
    # shard last: quant params (group size) are chosen on the whole matrix, then each rank
    # takes its slice of it
    return [("fusion", fusion), ("quantization", [quantize] if build.quant else []),
            ("parallelism", [shard_tensor_parallel] if build.tp_size > 1 else [])]


def check_target(graph: Graph, target: str) -> None:
    """Refuses a graph with an op that `target` has no kernel for yet (declared with its
    reference in plugins/ops.py, so ir/interpret.py already runs such graphs)."""
    has_kernel = get_target(target).has_kernel
    missing = sorted({n.op for n in graph.nodes if not has_kernel(n.op)})
    if missing:
        raise UnsupportedModelError(
            f"this model needs op{'s' if len(missing) > 1 else ''} {', '.join(missing)}, which the {target} target "
            "has no kernel for yet (the graph is checked against HF with the reference interpreter only)")


def run_passes(graph: Graph, build: BuildConfig, dump_dir: Path | None = None,
               lowered: bool = True) -> tuple[Graph, list[str]]:
    """lowered=False: the graph is only interpreted (ir/interpret.py), so ops without a
    kernel on build.target are fine."""
    graph = verify(graph)
    applied: list[str] = []
    if dump_dir is not None:
        dump_dir.mkdir(parents=True, exist_ok=True)
        (dump_dir / "00-input.txt").write_text(format_graph(graph))
    for number, (phase, passes) in enumerate(phases(build), start=1):
        for p in passes:
            try:
                graph = verify(p(graph, build))
            except GraphError as e:
                raise GraphError(f"after pass {p.__name__}: {e}") from None
            applied.append(p.__name__)
        if dump_dir is not None:
            (dump_dir / f"{number:02d}-{phase}.txt").write_text(format_graph(graph))
    if lowered:
        check_target(graph, build.target)
    return graph, applied
