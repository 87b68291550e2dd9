"""A cuda engine's executor for the runtime: the C++ executor (bessemer._cuda.Executor) on one
GPU, behind the Executor protocol (runtime/executor.py), with a device sampler.

Loading: the GPU is checked for the engine's arch, the weights go up through bounded
pinned staging (progress through `say`), then the paged KV cache gets
    --kv-cache-gib G         G GiB, or
    --gpu-memory-utilization U (default 0.9): U x the GPU's memory, minus what this and
                             every other process already use (as vLLM users know it),
capped at what max_batch_size full-length sequences can use, and leaving GRAPH_RESERVE_BYTES
free when graphs are captured; then one CUDA graph per decode batch size (1, 2, 4, ... max) is
captured, unless enforce_eager or BESSEMER_CUDA_SYNC=1 (every step eager, the stream
synchronized after every launch so that a fault names its node, op and kernel: for finding a
faulting kernel, not for speed).

Logits come back into a pinned host buffer for up to max_batch_size rows (the array a step
returns is a view that holds it; a step that finds it still held copies into new memory).

No torch and no Triton are imported here: the engine's kernels are cubins.
"""

from __future__ import annotations

import math

import numpy as np

from bessemer.errors import DeviceError, InvalidOptionError, RequestError
from bessemer.format.kv import blocks_needed
from bessemer.format.step import StepBatch
from bessemer.runtime.executor import ExecutorInfo, SamplingRows
from bessemer.targets.cuda.device import native, open_device, translate

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
UPLOAD_CHUNK_BYTES = 64 << 20  # each of the two pinned staging buffers
UNIFORM_MAX = np.float32(1.0) - np.finfo(np.float32).epsneg  # largest float32 below 1
# Device memory kept free after the KV cache for instantiating the decode graphs (the driver
# allocates their launch parameters and its own bookkeeping then). Declared, not measured:
# a generous figure for ~10 graphs of a few hundred kernels; the GPU check can measure it.
GRAPH_RESERVE_BYTES = 256 << 20


def graph_buckets(max_batch_size: int, max_num_tokens: int) -> list[int]:
    """Decode batch sizes that get a CUDA graph: powers of two up to the engine's limit, and
    the limit itself (a decode batch is padded to the smallest bucket that holds it; powers
    of two keep a padded batch in the same GEMM row bucket as the unpadded one)."""
    top = min(max_batch_size, max_num_tokens)
    sizes, b = [], 1
    while b < top:
        sizes.append(b)
        b *= 2
    return sizes + [top]


def kv_cache_blocks(bytes_per_block: int, free: int, total: int, kv_cache_gib: float | None,
                    gpu_memory_utilization: float | None, min_blocks: int, max_useful_blocks: int,
                    reserve: int = 0) -> int:
    """Number of KV blocks for the budget (see the module docstring); --kv-cache-gib 0 gives
    the minimum, `min_blocks` (one full-length sequence). free/total: the GPU's memory now,
    after the weights and activations are allocated; `reserve`: bytes to leave free after the
    cache (graph instantiation). A --kv-cache-gib that leaves less is refused, naming the
    size that fits."""
    if kv_cache_gib is not None and gpu_memory_utilization is not None:
        raise InvalidOptionError("give --kv-cache-gib or --gpu-memory-utilization, not both")
    if kv_cache_gib is not None:
        if kv_cache_gib < 0:
            raise InvalidOptionError(f"--kv-cache-gib must be >= 0, got {kv_cache_gib}")
        budget = max(int(kv_cache_gib * 2**30), min_blocks * bytes_per_block)
        source = f"--kv-cache-gib {kv_cache_gib}"
    else:
        util = DEFAULT_GPU_MEMORY_UTILIZATION if gpu_memory_utilization is None else gpu_memory_utilization
        if not 0 < util <= 1:
            raise InvalidOptionError(f"--gpu-memory-utilization must be in (0, 1], got {util}")
        budget = int(util * total) - (total - free)
        source = f"--gpu-memory-utilization {util}"
    # the executor adds one padding block (decode graphs' padding rows write there)
    fits = (free - reserve) // bytes_per_block - 1
    kept = f", {reserve / 2**30:.2f} GiB of it kept for CUDA graphs" if reserve else ""
    if kv_cache_gib is not None and fits >= min_blocks and min(budget // bytes_per_block, max_useful_blocks) > fits:
        fits_gib = fits * bytes_per_block / 2**30
        digits = 2 if fits_gib >= 1 else 4
        fitting = math.floor(fits_gib * 10**digits) / 10**digits  # rounded down: it fits
        raise InvalidOptionError(
            f"--kv-cache-gib {kv_cache_gib} does not fit: {free / 2**30:.2f} GiB is free after the weights{kept}; "
            f"give --kv-cache-gib {fitting:.{digits}f} or less" + (" (or --enforce-eager)" if reserve else ""))
    blocks = min(max_useful_blocks, budget // bytes_per_block, fits)
    if blocks < min_blocks:
        raise InvalidOptionError(
            f"the KV cache gets {max(blocks, 0)} blocks from {source} ({free / 2**30:.2f} GiB of "
            f"{total / 2**30:.2f} GiB free after the weights{kept}), fewer than one full-length sequence needs "
            f"({min_blocks} x {bytes_per_block / 2**20:.2f} MiB); give it more memory or rebuild with a "
            "smaller --max-seq-len")
    return int(blocks)


class CudaExecutor:
    """Runs one cuda engine on one GPU."""

    def __init__(self, engine, device: int = 0, kv_cache_gib: float | None = None,
                 gpu_memory_utilization: float | None = None, enforce_eager: bool = False, say=None,
                 upload_chunk_bytes: int = UPLOAD_CHUNK_BYTES):
        header, build = engine.header, engine.build
        self.device = open_device(device, engine.config.get("gpu_arch") or header.get("gpu_arch"))
        info = self.device.info()
        self.device_name = info["name"]
        rank_file = engine.rank_path

        def progress(done: int, total: int) -> None:
            if say and (done == total or done // upload_chunk_bytes % 16 == 0):
                say(f"uploading weights to GPU {device}: {done / 2**20:.1f}/{total / 2**20:.1f} MiB")

        try:
            # the rank file is read and checked by the engine contract's reader (format/csrc);
            # $BESSEMER_CUDA_SYNC is read there too
            self._ex = native().Executor(self.device, str(rank_file), upload_chunk_bytes, progress)
            graphs = not enforce_eager and not self._ex.sync_launches
            if self._ex.sync_launches and say:
                say(f"{native().SYNC_ENV}=1: every step eager, the stream synchronized after every launch (slow)")
            free = self.device.info()["free_bytes"]
            per_seq = blocks_needed(int(build["max_seq_len"]), int(build["kv_block_size"]))
            self.num_kv_blocks = kv_cache_blocks(self._ex.kv_bytes_per_block, free, info["total_bytes"], kv_cache_gib,
                                                 gpu_memory_utilization, per_seq,
                                                 per_seq * int(build["max_batch_size"]),
                                                 reserve=GRAPH_RESERVE_BYTES if graphs else 0)
            self._ex.allocate_kv_cache(self.num_kv_blocks)
            if graphs:
                self._ex.capture_graphs(graph_buckets(int(build["max_batch_size"]), int(build["max_num_tokens"])))
        except (InvalidOptionError, DeviceError):
            raise
        except Exception as e:  # noqa: BLE001 - the executor's errors, as one-line user errors
            raise translate(e) from None
        self.kv_block_size = int(build["kv_block_size"])
        self.vocab_size = int(self._ex.vocab_size)
        self.info = ExecutorInfo(isa=f"cuda {header.get('gpu_arch')} on GPU {device} ({self.device_name})",
                                 num_threads=1, num_kv_blocks=self.num_kv_blocks,
                                 kernels=tuple(sorted({k["function"] for k in header["kernels"]})))
        self.sampler = CudaSampler(self._ex)

    @property
    def kv_cache_bytes(self) -> int:
        return int(self._ex.kv_cache_bytes)

    @property
    def use_graphs(self) -> bool:
        return self._ex.use_graphs

    @use_graphs.setter
    def use_graphs(self, on: bool) -> None:
        self._ex.use_graphs = bool(on)

    @property
    def graph_buckets(self) -> list[int]:
        return list(self._ex.graph_buckets)

    def stats(self) -> dict:
        return dict(self._ex.stats(), weight_bytes=int(self._ex.weight_bytes),
                    activation_bytes=int(self._ex.activation_bytes), kv_cache_bytes=self.kv_cache_bytes)

    def memory_map(self) -> dict:
        """name -> (device pointer, bytes) of every region: weight:<name>, buffer:<id>,
        workspace:<name>, step, kv:k:<layer>, kv:v:<layer>."""
        return self._ex.memory_map()

    def step_layout(self, counts: dict) -> dict:
        """step array name -> (byte offset in the step region, elements) for these counts."""
        return self._ex.step_layout(counts)

    def read_device(self, ptr: int, nbytes: int) -> bytes:
        return self._ex.read_device(ptr, nbytes)

    def step(self, batch: StepBatch) -> np.ndarray:
        """Logits [L, vocab] float32 of the selected rows (a view of pinned memory while it
        lasts: see the module docstring)."""
        _, logits = _run(self._ex, batch)
        return logits

    def failure(self) -> str | None:
        """Set once the GPU failed during a step (a device fault: the context is lost); a step
        that failed otherwise raised DeviceError and the next one runs."""
        return self._ex.failure

    def close(self) -> None:
        """Nothing to stop: device memory and graphs are freed with the native executor."""


class CudaSampler:
    """Sampling on the GPU (the plan's sample launch after the step): the logits stay there.
    It holds the native executor, not the CudaExecutor (no reference cycle: the device
    memory is freed as soon as the executor goes)."""

    def __init__(self, native_executor):
        self._ex = native_executor

    def sample(self, batch: StepBatch, rows: SamplingRows,
               want_logits: bool = False) -> tuple[np.ndarray, np.ndarray | None]:
        """Token ids [L] (argmax where temperature is 0, else a draw with `uniform` from what
        top_k/top_p keep), and the logits [L, vocab] when asked."""
        return _run(self._ex, batch, temperature=np.asarray(rows.temperature, np.float32),
                    top_k=np.asarray(rows.top_k, np.int32), top_p=np.asarray(rows.top_p, np.float32),
                    uniform=np.minimum(np.asarray(rows.uniform, dtype=np.float32), UNIFORM_MAX),
                    want_tokens=True, want_logits=want_logits)


def _run(native_executor, batch: StepBatch, **sampling) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The native step (token ids, logits), its errors as one-line user errors."""
    try:
        return native_executor.step(*batch.arrays(), **sampling)
    except ValueError as e:
        raise RequestError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - the driver's and launcher's errors
        raise translate(e) from None
