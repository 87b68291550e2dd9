"""fuse_gate_up: gate_proj and up_proj reading one input -> one gate_up_proj linear + split."""

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph
from bessemer.builder.rewrite import fuse_sibling_linears


def fuse_gate_up(graph: Graph, build: BuildConfig) -> Graph:
    return fuse_sibling_linears(graph, ("gate_proj", "up_proj"), "gate_up_proj")
