"""shard_tensor_parallel: rewrites the graph into what rank `build.tp_rank` of `build.tp_size`
computes (Megatron-style tensor parallelism, applied to an unchanged model as a transform).
Each linear's role (ir/roles.py, set by the model file) says how it splits; names are
never read. For a Llama-like layer:

- Column split (output rows) of q/k/v (fused or not) by heads (rank_heads): whole KV
  groups per rank, evenly when N divides Hkv, else by shard_range (SmolLM2: 3 KV heads
  over 2 ranks = 2 + 1, query heads 6 + 3); of gate/up by intermediate rows (evenly). Each HF part of
  a fused weight becomes a row slice of that part (WeightRef.slices), so the weight source
  reads only the rank's bytes. rope/attention attrs become per-rank head counts and the
  split after a fused linear gets the per-rank sizes.
- KV heads fewer than ranks (N a multiple of Hkv) are replicated: rank r reads the one KV
  head its Hq/N query heads use.
- Row split (input columns, K) of o_proj (by query heads) and down_proj (features),
  followed by an `all_reduce`; a bias of a row-split linear stays on rank 0 only (it must
  be added once).
- The vocab split (lm_head): vocab-parallel rows (shard_range), then `all_gather` of the
  logits, so rank 0 samples from the full vocabulary as with one rank.
- Embedding and norms: replicated (every rank gathers the full table: exact, no extra
  communication; the table costs V*H per rank).
- Quantized weights keep the whole matrix's quant params (group size chosen on the full K
  by the quantize pass, which runs first); a K split must cut on group boundaries. The
  same holds for quantized experts (down's K cut), which the format is asked about.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable

from bessemer.builder.config import BuildConfig
from bessemer.ir.graph import Graph, GraphError, Node, WeightRef
from bessemer.ir.roles import COLUMN, FEATURES, KV_HEADS, QUERY_HEADS, ROW, VOCAB, WHOLE
from bessemer.errors import InvalidOptionError
from bessemer.plugins.ops import shard_range
from bessemer.quantization.formats import ExpertStack, StoredFormat

HEAD_OPS = ("rope", "attention", "attention_sinks")


def _heads_ok(hq: int, hkv: int, n: int) -> bool:
    # KV heads split (evenly or by shard_range when there are more than ranks), or each KV
    # head replicated over n / hkv ranks that share its query heads evenly
    return hkv % n == 0 or hkv > n or (n % hkv == 0 and hq % n == 0)


def _valid_tp(hq: int, hkv: int, features: list[int]) -> list[int]:
    return [n for n in range(1, hq + 1) if all(f % n == 0 for f in features) and _heads_ok(hq, hkv, n)]


def _feature_sizes(graph: Graph) -> list[int]:
    """Every length an even FEATURES split cuts: rows of column-split parts, K of row splits."""
    sizes: dict[int, None] = {}
    for x in graph.nodes:
        if x.role is None or x.role.split not in (COLUMN, ROW):
            continue
        w = x.weights[0]
        shapes = w.part_shapes(graph.weight_shapes)
        for shard, shape in zip(x.role.shards, shapes):
            if shard == FEATURES:
                sizes.setdefault(shape[0] if x.role.split == COLUMN else w.shape[1])
    for x in graph.nodes:
        if x.op == "moe" and int(x.attrs.get("layout", 0)) == 0:  # stacked experts split whole
            sizes.setdefault(int(x.attrs["expert_size"]))
    return list(sizes)


def _check_sizes(graph: Graph, n: int) -> dict:
    attn = [x for x in graph.nodes if x.op in ("attention", "attention_sinks")]
    hq, hkv = int(attn[0].attrs["num_heads"]), int(attn[0].attrs["num_kv_heads"])
    features = _feature_sizes(graph)
    uneven = [f for f in features if f % n]
    if uneven or not _heads_ok(hq, hkv, n):
        ok = _valid_tp(hq, hkv, features)
        why = (f"num_attention_heads {hq} / num_key_value_heads {hkv}" if not _heads_ok(hq, hkv, n)
               else f"intermediate_size {uneven[0]}")
        raise InvalidOptionError(f"--tp {n} cannot split {why} across ranks; use --tp {' or '.join(map(str, ok))}")
    return dict(hq=hq, hkv=hkv, head_dim=int(attn[0].attrs["head_dim"]))


def rank_heads(hq: int, hkv: int, n: int, r: int) -> tuple[int, int, int, int]:
    """(q_start, q_stop, kv_start, kv_stop): the heads rank r computes. Query heads go with
    their KV head's group (h uses KV head h // (hq/hkv)), so each rank's attention has whole
    groups: SmolLM2's 3 KV heads of 3 query heads over 2 ranks give 6+3 query heads."""
    group = hq // hkv
    if hkv % n == 0 or hkv > n:
        kv0, kv1 = shard_range(hkv, n, r)
        return kv0 * group, kv1 * group, kv0, kv1
    per = hq // n  # replicated KV head: n / hkv ranks share one group
    q0 = r * per
    return q0, q0 + per, q0 // group, q0 // group + 1


def _rows(shard: str, full_rows: int, heads: dict, n: int, r: int) -> tuple[int, int]:
    """Row range rank r holds of a column-split HF part (weight or bias) that cuts `shard`."""
    d = heads["head_dim"]
    q0, q1, kv0, kv1 = rank_heads(heads["hq"], heads["hkv"], n, r)
    if shard == QUERY_HEADS:
        return q0 * d, q1 * d
    if shard == KV_HEADS:
        return kv0 * d, kv1 * d
    if shard == WHOLE:
        return 0, full_rows
    per = full_rows // n  # FEATURES
    return r * per, (r + 1) * per


def _part_blocks(ref: WeightRef, shapes: dict) -> list[tuple[int, int, int, int]]:
    """(r0, r1, c0, c1) each part covers: its slice (rows of a packed tensor) or all of it."""
    if ref.slices:
        return list(ref.slices)
    return [(0, shapes[p][0], 0, shapes[p][1] if len(shapes[p]) > 1 else 0) for p in ref.parts]


def _slice_rows(ref: WeightRef, shards: tuple[str, ...], shapes: dict, heads: dict, n: int, r: int) -> WeightRef:
    slices = []
    for (b0, b1, c0, c1), shard in zip(_part_blocks(ref, shapes), shards):
        r0, r1 = _rows(shard, b1 - b0, heads, n, r)
        slices.append((b0 + r0, b0 + r1, c0, c1))
    rows = sum(s[1] - s[0] for s in slices)
    return replace(ref, shape=(rows,) + tuple(ref.shape[1:]), slices=tuple(slices))


def _check_k_cut(what: str, quant: StoredFormat | None, k: int, cuts: Callable[[int], list[tuple[int, int]]],
                 n: int, r: int, candidates: Iterable[int]) -> None:
    """Refuse rank r's input columns cuts(n)[r] of a quantized K-column weight where its format
    cannot store them on their own (a 4-bit group straddling two ranks), naming the format's
    fix and the --tp values among `candidates` (each with its cuts(m)) that the format accepts."""
    problem = quant.column_split_error(k, cuts(n), r) if quant is not None else None
    if not problem:
        return
    ok = [str(m) for m in candidates
          if m < n and all(quant.column_split_error(k, cuts(m), q) is None for q in range(m))]
    fixes = "" if not ok else f" or --tp {' or '.join(ok)}" if "; use " in problem else f"; use --tp {' or '.join(ok)}"
    raise InvalidOptionError(f"{what}: --tp {n} {problem}{fixes}")


def _slice_cols(node: Node, ref: WeightRef, shapes: dict, heads: dict, n: int, r: int) -> WeightRef:
    ((b0, b1, k0, k1),) = _part_blocks(ref, shapes)
    rows, k = b1 - b0, k1 - k0
    c0, c1 = _cuts(node, k, heads, n, r)
    candidates = [m for m in range(1, n) if k % m == 0 and _heads_ok(heads["hq"], heads["hkv"], m)]
    _check_k_cut(node.name, ref.quant, k, lambda m: [_cuts(node, k, heads, m, q) for q in range(m)], n, r, candidates)
    return replace(ref, shape=(rows, c1 - c0), slices=((b0, b1, k0 + c0, k0 + c1),))


def _cuts(node: Node, k: int, heads: dict, n: int, r: int) -> tuple[int, int]:
    """Input columns [c0, c1) of a row-split linear on rank r: one that reads attention
    (QUERY_HEADS, o_proj) takes this rank's heads, a FEATURES one an even share."""
    if node.role.shards[0] == QUERY_HEADS:
        q0, q1, _, _ = rank_heads(heads["hq"], heads["hkv"], n, r)
        return q0 * heads["head_dim"], q1 * heads["head_dim"]
    return r * (k // n), (r + 1) * (k // n)


def _take_rank_heads(node: Node, whole: set[str], heads: dict, n: int, r: int) -> list[Node]:
    """Before rope/attention: a split that takes this rank's heads out of each input that
    holds all of them (a WHOLE q or k after its cross-head norm), then the node reading it.
    Inputs are (q, k[, v]): the first holds query heads, the others KV heads."""
    q0, q1, kv0, kv1 = rank_heads(heads["hq"], heads["hkv"], n, r)
    d, out, inputs = heads["head_dim"], [], list(node.inputs)
    for i, value in enumerate(node.inputs):
        if value not in whole:
            continue
        (a, b), full = ((q0, q1), heads["hq"]) if i == 0 else ((kv0, kv1), heads["hkv"])
        pieces = [(f"{value}.{name}", (hi - lo) * d) for name, lo, hi in
                  (("heads_before", 0, a), ("rank_heads", a, b), ("heads_after", b, full)) if hi > lo]
        out.append(Node(f"{node.name}.input{i}.rank_heads", "split", (value,), tuple(v for v, _ in pieces), (),
                        {"sizes": [w for _, w in pieces]}))
        inputs[i] = f"{value}.rank_heads"
    return out + [replace(node, inputs=tuple(inputs))]


def rank_expert_size(node: Node, n: int) -> int:
    """The intermediate size of each expert a rank of n holds (moe node): stacked experts
    (layout 1) go whole, the others are split evenly (_check_sizes refuses an uneven split)."""
    size = int(node.attrs["expert_size"])
    return size if int(node.attrs.get("layout", 0)) == 1 else size // n


def _whole_experts(w: WeightRef, e0: int, e1: int) -> WeightRef:
    """Experts [e0, e1) of a stacked (E, ...) weight; a quantized stack counts the experts it holds."""
    quant = replace(w.quant, experts=e1 - e0) if isinstance(w.quant, ExpertStack) else w.quant
    return replace(w, shape=(e1 - e0,) + tuple(w.shape[1:]), slices=((e0, e1, 0, w.shape[1]),), quant=quant)


def _shard_experts(node: Node, shapes: dict, n: int, r: int) -> Node:
    """Rank r's share of the experts; the ranks' partial outputs are summed by an all_reduce
    after the node. Experts stored one matrix each: rows [r I/n, (r+1) I/n) of every gate and
    up, the same columns of every down. Stacked (gpt-oss): whole experts, shard_range of them.
    Quantized experts keep the format the quantize pass chose on the full matrices (group size
    on the full K); down's K cut must fall on its group boundaries, as a dense row split's."""
    if int(node.attrs.get("layout", 0)) == 1:
        e0, e1 = shard_range(int(node.attrs["num_experts"]), n, r)
        if e1 <= e0:
            raise InvalidOptionError(f"{node.name}: --tp {n} leaves rank {r} no experts; use a smaller --tp")
        ws = tuple(_whole_experts(w, e0, e1) if w is not None else None for w in node.weights)
        return replace(node, weights=ws, attrs=dict(node.attrs, first_expert=e0, local_experts=e1 - e0))
    full = int(node.attrs["expert_size"])
    size = rank_expert_size(node, n)
    gate_up, down = node.weights
    _check_k_cut(f"{node.name} experts' down", down.quant, full,
                lambda m: [(q * (full // m), (q + 1) * (full // m)) for q in range(m)], n, r,
                [m for m in range(1, n) if full % m == 0])
    rows = tuple((r * size, (r + 1) * size, 0, shapes[p][1]) for p in gate_up.parts)
    cols = tuple((0, shapes[p][0], r * size, (r + 1) * size) for p in down.parts)
    return replace(node, weights=(replace(gate_up, shape=(len(rows) * size, gate_up.shape[1]), slices=rows),
                                  replace(down, shape=(down.shape[0], size), slices=cols)),
                   attrs=dict(node.attrs, expert_size=size))


def _rename(node: Node, old: str, new: str) -> Node:
    if old not in node.inputs:
        return node
    return replace(node, inputs=tuple(new if i == old else i for i in node.inputs))


def shard_tensor_parallel(graph: Graph, build: BuildConfig) -> Graph:
    n, r = build.tp_size, build.tp_rank
    if n == 1:
        return graph
    heads = _check_sizes(graph, n)
    shapes = graph.weight_shapes
    comm = dict(tp_size=n, tp_rank=r)
    new_widths: dict[str, list[int]] = {}  # fused linear output -> per-part rows (for its split)
    whole_parts: dict[str, list[bool]] = {}  # column-split linear output -> which parts are WHOLE
    whole: set[str] = set()  # values holding every head (WHOLE parts, and norms of them)
    renames: dict[str, str] = {}  # value -> the collective's output that replaces it
    nodes: list[Node] = []
    for node in graph.nodes:
        for old, new in renames.items():
            node = _rename(node, old, new)
        split = node.role.split if node.role is not None else None
        if node.op == "linear" and split == COLUMN:
            ws = tuple(_slice_rows(w, node.role.shards, shapes, heads, n, r) if w is not None else None
                       for w in node.weights)
            new_widths[node.outputs[0]] = [s[1] - s[0] for s in ws[0].slices]
            whole_parts[node.outputs[0]] = [s == WHOLE for s in node.role.shards]
            if whole_parts[node.outputs[0]] == [True]:
                whole.add(node.outputs[0])
            nodes.append(replace(node, weights=ws))
        elif node.op == "linear" and split == ROW:
            w = _slice_cols(node, node.weights[0], shapes, heads, n, r)
            bias = node.weights[1:] if r == 0 else ()  # the bias is added once, on rank 0
            out, reduced = node.outputs[0], f"{node.outputs[0]}.all_reduce"
            nodes.append(replace(node, weights=(w,) + tuple(bias)))
            nodes.append(Node(f"{node.name}.all_reduce", "all_reduce", (out,), (reduced,), (), dict(comm)))
            renames[out] = reduced
        elif node.op == "linear" and split == VOCAB:
            vocab = node.weights[0].shape[0]
            start, stop = shard_range(vocab, n, r)
            if stop <= start:
                raise InvalidOptionError(f"--tp {n} leaves rank {r} no vocabulary rows (vocab {vocab}); use a smaller --tp")
            ws = []
            for w in node.weights:
                if w is None:
                    ws.append(None)
                    continue
                full = shapes[w.parts[0]]
                # its own name: a tied table is also read whole by the (replicated) embedding
                ws.append(WeightRef(f"{node.name}.{w.name.rsplit('.', 1)[-1]}.tp_shard", w.parts,
                                    (stop - start,) + tuple(full[1:]), w.quant,
                                    ((start, stop, 0, full[1] if len(full) > 1 else 0),)))
            out, gathered = node.outputs[0], f"{node.outputs[0]}.all_gather"
            nodes.append(replace(node, weights=tuple(ws)))
            nodes.append(Node(f"{node.name}.all_gather", "all_gather", (out,), (gathered,), (),
                              dict(comm, full_width=vocab)))
            renames[out] = gathered
        elif node.op == "linear":
            raise GraphError(f"{node.name}: this linear has no role saying how tensor parallelism splits it "
                             "(set one in its model file, ir/roles.py)")
        elif node.op == "split" and node.inputs[0] in new_widths:
            nodes.append(replace(node, attrs=dict(node.attrs, sizes=new_widths[node.inputs[0]])))
            whole.update(o for o, w in zip(node.outputs, whole_parts[node.inputs[0]]) if w)
        elif node.op in HEAD_OPS:
            q0, q1, kv0, kv1 = rank_heads(heads["hq"], heads["hkv"], n, r)
            # attention_sinks: one sink per query head, the rank's rows of it
            ws = tuple(replace(w, shape=(q1 - q0,), slices=((q0, q1, 0, 0),)) for w in node.weights
                       if node.op == "attention_sinks")
            nodes.extend(_take_rank_heads(replace(node, weights=ws or node.weights, attrs=dict(
                node.attrs, num_heads=q1 - q0, num_kv_heads=kv1 - kv0)), whole, heads, n, r))
        elif node.op == "rms_norm_heads":  # per head: the rank's q (or KV) heads
            q0, q1, kv0, kv1 = rank_heads(heads["hq"], heads["hkv"], n, r)
            nodes.append(replace(node, attrs=dict(node.attrs, num_heads=kv1 - kv0 if node.attrs["kv_heads"] else q1 - q0)))
        elif node.op == "moe":  # every expert's intermediate features split evenly, like an MLP
            nodes.append(_shard_experts(node, shapes, n, r))
            out, reduced = node.outputs[0], f"{node.outputs[0]}.all_reduce"
            nodes.append(Node(f"{node.name}.all_reduce", "all_reduce", (out,), (reduced,), (), dict(comm)))
            renames[out] = reduced
        elif node.op == "rms_norm" and node.inputs[0] in whole:  # a norm across heads keeps them all
            whole.add(node.outputs[0])
            nodes.append(node)
        else:
            nodes.append(node)
    output = renames.get(graph.output, graph.output)
    return replace(graph, nodes=tuple(nodes), output=output, values={})
