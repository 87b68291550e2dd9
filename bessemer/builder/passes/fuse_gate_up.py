"""fuse_gate_up: the gate and up projections of one gated MLP (their gate_up fusion group,
builder/roles.py) reading one input -> one linear + split."""

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph
from bessemer.builder.rewrite import fuse_sibling_linears
from bessemer.builder.roles import GATE_UP


def fuse_gate_up(graph: Graph, build: BuildConfig) -> Graph:
    return fuse_sibling_linears(graph, GATE_UP)
