"""How many threads the build's native quantization helpers run on: the int4 scale searches
(scale_search, superblock), AWQ's candidate weights (awq.fake_quant_int4) and GPTQ's column
loop (gptq.gptq_block_columns). Decided here for all of them, so that a process told to use
fewer cores (OMP_NUM_THREADS=1 beside other busy processes, or torch.set_num_threads) keeps
to them in every helper. Each helper's result does not depend on its thread count (their
tests compare 1 thread with several, bit for bit).

The build's pool of weights quantized ahead of the writer (builder/weights.py) splits the
same budget: `thread_budget()` threads in all, each weight in flight running its helpers
on its share (`thread_share`), so W weights at once never run W x budget threads.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

# The share of the budget that the code running in this context (one pool thread's weight)
# may use; None outside a pool. A context variable because the helpers are called deep
# inside each format's quantizer, and a share set by one pool thread must not reach another.
_SHARE: ContextVar[int | None] = ContextVar("bessemer_native_thread_share", default=None)


def native_threads() -> int:
    """The threads a native helper runs on now: the share of the pool thread it runs in,
    else the whole budget."""
    share = _SHARE.get()
    return share if share is not None else thread_budget()


@contextmanager
def thread_share(threads: int) -> Iterator[None]:
    """Within the block, native_threads() is `threads` (at least 1)."""
    token = _SHARE.set(max(1, threads))
    try:
        yield
    finally:
        _SHARE.reset(token)


def thread_budget() -> int:
    """torch's intra-op thread count when torch is loaded (the calibrated quantizers run the
    rest of their work in its pool, so the native helpers take the same share); otherwise the
    cores this process may run on, capped by a positive OMP_NUM_THREADS (which torch reads
    too). An uncalibrated build does not load torch for this."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return max(1, torch.get_num_threads())
    cores = len(os.sched_getaffinity(0))
    requested = os.environ.get("OMP_NUM_THREADS", "")
    return max(1, min(cores, int(requested))) if requested.isdigit() and int(requested) > 0 else max(1, cores)
