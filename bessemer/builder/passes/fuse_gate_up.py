"""fuse_gate_up: the gate and up projections of one gated MLP (their gate_up fusion group,
ir/roles.py) reading one input -> one linear + split."""

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph
from bessemer.ir.rewrite import fuse_sibling_linears
from bessemer.ir.roles import GATE_UP


def fuse_gate_up(graph: Graph, build: BuildConfig) -> Graph:
    return fuse_sibling_linears(graph, GATE_UP)
