"""Split-K for the GEMMs of a linear (dense, fp8, int8 and int4 codes): the parts of K a
program sums and the reduction of the decode tiles' partials.

With a few rows (decode) there are too few output tiles to keep every SM streaming weights,
so the K range is cut into K_PARTS equal parts (lower.py: split_k, from the linear's shape
alone). With SPLIT_K = K_PARTS (grid axis 1) each program sums its own part from zero and
stores its fp32 partial tile; the last program of a tile to arrive (a counter per tile) sums
the partials in part order and writes y. The order is fixed, so results do not depend on which
program finishes first (CUDA-graph replays and eager steps stay bit-equal). The counters
(int32, zero at load) are reset by that last program, ready for the next linear that uses them.

The instantiations for more rows (SPLIT_K = 1) sum the same parts, each from zero, one after
the other in one program and add them in the same order: a row's result does not depend on
the bucket its step falls in (batch invariance).
"""

import triton
import triton.language as tl


@triton.jit
def program_parts(SPLIT_K: tl.constexpr, K_PARTS: tl.constexpr):
    """[first, stop) of the parts of K this program sums: its own (grid axis 1) when each
    part has a program, else all of them in order."""
    if SPLIT_K == K_PARTS:
        first = tl.program_id(1)
        stop = first + 1
    else:
        first = 0
        stop = K_PARTS
    return first, stop


@triton.jit
def part_range(k_part, K: tl.constexpr, K_PARTS: tl.constexpr):
    """[k_start, k_stop) of part `k_part` of K; K_PARTS divides K."""
    size: tl.constexpr = K // K_PARTS
    return k_part * size, k_part * size + size


@triton.jit
def split_k_done(acc, partials_ptr, counters_ptr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 SPLIT_K: tl.constexpr):
    """SPLIT_K == 1: (acc, true). Else stores this program's partial tile acc and returns (the
    sum of every part's partial in part order, true) in the tile's last program to arrive,
    (zeros, false) in the others. partials: fp32 [tiles, SPLIT_K, BLOCK_M, BLOCK_N];
    counters: int32 [tiles]."""
    if SPLIT_K == 1:
        total = acc
        last = tl.program_id(1) == 0  # always: the one part
    else:
        tile = tl.program_id(0).to(tl.int64)
        cells = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        mine = partials_ptr + tile * (SPLIT_K * BLOCK_M * BLOCK_N)
        tl.store(mine + tl.program_id(1) * (BLOCK_M * BLOCK_N) + cells, acc)
        tl.debug_barrier()  # every thread's part of the tile is stored before the counter moves
        arrived = tl.atomic_add(counters_ptr + tile, 1, sem="acq_rel")
        last = arrived == SPLIT_K - 1
        total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        if last:
            for j in range(SPLIT_K):  # the same order whichever program arrives last
                total += tl.load(mine + j * (BLOCK_M * BLOCK_N) + cells, cache_modifier=".cg")
            tl.atomic_xchg(counters_ptr + tile, 0, sem="relaxed")
    return total, last
