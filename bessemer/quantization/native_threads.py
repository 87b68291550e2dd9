"""How many threads the build's native quantization helpers run on: the int4 scale searches
(scale_search, superblock), AWQ's candidate weights (awq.fake_quant_int4) and GPTQ's column
loop (gptq.gptq_block_columns). Decided here for all of them, so that a process told to use
fewer cores (OMP_NUM_THREADS=1 beside other busy processes, or torch.set_num_threads) keeps
to them in every helper. Each helper's result does not depend on its thread count (their
tests compare 1 thread with several, bit for bit).
"""

from __future__ import annotations

import os
import sys


def native_threads() -> int:
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
