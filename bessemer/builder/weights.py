"""WeightSource: produces each engine tensor from the checkpoint when the writer asks for it.

A quantized weight is quantized once, by its stored format (quantization/formats.py), when
its first part (the codes) is asked for; its other parts follow it in the tensor order,
then the cache is dropped. Every part is packed into the layout the target chose for it.
A tensor-parallel shard (TensorSpec.slices) reads only its rows/columns of each HF part,
except where the format needs whole rows (per-channel scales, GPTQ's error propagation):
then it reads the full rows of the shard, quantizes them and keeps the shard's columns.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

import numpy as np

from bessemer.builder.calibrate import CalibrationResult
from bessemer.builder.checkpoint import Checkpoint
from bessemer.builder.lower import TensorSpec
from bessemer.errors import BessemerError
from bessemer.format.layouts import encode
from bessemer.quantization.formats import WeightCalibration
from bessemer.quantization.native_threads import thread_budget, thread_share


class WeightSource:
    """`threads` > 1 quantizes the next weights (in the writer's order) on that many threads
    while the writer packs the current one: NumPy releases the GIL in the quantizers' array
    work, and each weight is quantized alone, so the bytes do not depend on the threads. At
    most `threads` weights are in flight (each an fp32 copy and its quantizer's temporaries),
    each running its native helpers on an equal share of their thread budget."""

    def __init__(self, ckpt: Checkpoint, constants: dict, calibration: CalibrationResult | None = None,
                 threads: int = 1):
        self.ckpt, self.constants = ckpt, constants
        self.calibration = calibration
        self.quant_stats: dict[str, dict] = {}  # weight -> its format's error line (build report)
        self._cached: tuple[str, dict] | None = None
        self.threads = threads
        self._order: list[TensorSpec] = []  # quantized weights, one spec per source, in write order
        self._position: dict[str, int] = {}  # source -> its index in _order
        self._pending: dict[str, Future] = {}  # source -> its quantization, submitted ahead
        self._pool: ThreadPoolExecutor | None = None

    def write_order(self, specs: list[TensorSpec]) -> None:
        """The order the writer will ask for the tensors in (what the threads quantize ahead)."""
        first: dict[str, TensorSpec] = {}
        for s in specs:
            if s.quant is not None:
                first.setdefault(s.source, s)
        self._order = list(first.values())
        self._position = {source: i for i, source in enumerate(first)}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def part(self, name: str, sl: tuple | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """A checkpoint tensor (or its block `sl`), with the AWQ scaling folded in where there
        is one; written into `out` (rows of a fused weight) when given."""
        whole = sl is None and name in self.ckpt.index
        arr = self.ckpt.get(name, sl, out if whole else None)
        if not _all_finite(arr):  # an engine of NaN weights emits token 0 forever: refuse it here
            raise BessemerError(f"checkpoint tensor {name} has NaN or infinite values; the checkpoint is damaged "
                                "(re-download or re-export it)")
        if self.calibration and name in self.calibration.transforms:
            arr = self.calibration.transforms[name].apply(arr, sl)
        if out is not None and arr is not out:
            out[...] = arr
        return arr if out is None else out

    def fp32(self, spec: TensorSpec, full_rows: bool = False) -> np.ndarray:
        if spec.name in self.constants:
            return self.constants[spec.name]
        slices = spec.slices or (None,) * len(spec.parts)
        if full_rows:
            slices = [(s[0], s[1], 0, self.ckpt.index[p].shape[1]) for p, s in zip(spec.parts, slices)]
        if len(spec.parts) == 1:
            return self.part(spec.parts[0], slices[0])
        # a fused weight (q|k|v, gate|up): each part read straight into its rows
        shapes = [_block_shape(self.ckpt.shape(p), sl) for p, sl in zip(spec.parts, slices)]
        out = np.empty((sum(s[0] for s in shapes),) + shapes[0][1:], dtype=np.float32)
        row = 0
        for p, sl, shape in zip(spec.parts, slices, shapes):
            self.part(p, sl, out[row:row + shape[0]])
            row += shape[0]
        return out

    def _quantize(self, spec: TensorSpec) -> dict[str, np.ndarray]:
        fmt = spec.quant
        shipped = fmt.shipped_parts(self.ckpt, spec.parts, spec.slices)
        if shipped is not None:  # the checkpoint stores this format (MXFP4 experts): its bytes, not requantized
            return shipped
        calib = (self.calibration.for_weight(spec.parts, fmt, spec.slices, self.part) if self.calibration
                 else WeightCalibration())
        k_split = [s for p, s in zip(spec.parts, spec.slices) if s[3] - s[2] != self.ckpt.index[p].shape[1]]
        if k_split and fmt.full_rows_for_k_shard(calib):
            q, w = fmt.store(self.fp32(spec, full_rows=True), calib, cut=(k_split[0][2], k_split[0][3]))
        else:
            q, w = fmt.store(self.fp32(spec), calib)
        self.quant_stats[spec.source] = fmt.stats(w, q)
        return q

    def producer(self, spec: TensorSpec) -> Callable[[], np.ndarray]:
        def produce() -> np.ndarray:
            if spec.quant is None:
                return encode(self.fp32(spec), spec.dtype, spec.layout)
            if self._cached is None or self._cached[0] != spec.source:
                self._cached = (spec.source, self._quantized(spec))
            return spec.quant.pack(spec.role, self._cached[1][spec.role], spec.layout)
        return produce

    def _quantized(self, spec: TensorSpec) -> dict[str, np.ndarray]:
        """spec's quantized parts: from its thread when one quantized it ahead; before
        returning, the next weights in write order are handed to the threads."""
        if self.threads <= 1 or not self._order:
            return self._quantize(spec)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="quantize")
        at = self._position.get(spec.source)
        if at is None:
            return self._quantize(spec)
        share = thread_budget() // self.threads
        for ahead in self._order[at:at + self.threads]:
            if ahead.source not in self._pending:
                self._pending[ahead.source] = self._pool.submit(self._quantize_on_share, ahead, share)
        return self._pending.pop(spec.source).result()

    def _quantize_on_share(self, spec: TensorSpec, share: int) -> dict[str, np.ndarray]:
        with thread_share(share):
            return self._quantize(spec)


def _block_shape(shape: tuple[int, ...], sl: tuple | None) -> tuple[int, ...]:
    """The shape Checkpoint.get(name, sl) returns for a tensor of `shape`."""
    if sl is None:
        return tuple(shape)
    rows = (sl[1] - sl[0],)
    return rows + ((sl[3] - sl[2],) if len(shape) == 2 else tuple(shape[1:]))


def _all_finite(arr: np.ndarray, chunk: int = 1 << 22) -> bool:
    """Whether every element is finite, in chunks (no whole-tensor bool temporary)."""
    flat = arr.reshape(-1)
    return all(np.isfinite(flat[i:i + chunk]).all() for i in range(0, flat.size, chunk))
