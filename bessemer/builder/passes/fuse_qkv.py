"""fuse_qkv: q_proj, k_proj, v_proj reading one input -> one qkv_proj linear + split.

One GEMM instead of three: the activations are read once and the kernel runs on a wider N,
which matters most at decode where each GEMV is short.
"""

from bessemer.builder.config import BuildConfig
from bessemer.builder.graph import Graph
from bessemer.builder.rewrite import fuse_sibling_linears


def fuse_qkv(graph: Graph, build: BuildConfig) -> Graph:
    return fuse_sibling_linears(graph, ("q_proj", "k_proj", "v_proj"), "qkv_proj")
