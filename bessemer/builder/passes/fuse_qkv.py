"""fuse_qkv: the linears of one attention's qkv fusion group (q, k, v projections reading
one input; their role says so, ir/roles.py) -> one linear + split.

One GEMM instead of three: the activations are read once and the kernel runs on a wider N,
which matters most at decode where each GEMV is short.
"""

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph
from bessemer.ir.rewrite import fuse_sibling_linears
from bessemer.ir.roles import QKV


def fuse_qkv(graph: Graph, build: BuildConfig) -> Graph:
    return fuse_sibling_linears(graph, QKV)
