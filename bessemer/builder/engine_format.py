"""Engine directory and rank-file format: the contract between builder and runtime.

Engine directory (written atomically: built in a sibling temp dir, then renamed)::

    config.json         format version, bessemer version, model/build/quant config, mapping,
                        target, plugin@version list, rank files with size and sha256
    rank{r}.engine      one per tensor-parallel rank (layout below)
    tokenizer files     copied verbatim from the checkpoint
    build_report.json   timings, peak memory, passes, per-tensor notes (not part of the
                        byte-identical contract: it holds wall-clock numbers)

rank{r}.engine, all integers little-endian::

    offset  size  field
    0       8     magic  b"BESSEMER"
    8       2     format_major (u16)   -- a reader refuses any other major
    10      2     format_minor (u16)   -- additive changes only; readers accept any minor
    12      4     flags (u32, 0)
    16      8     header_len (u64)
    24      H     header: UTF-8 JSON, keys sorted, no whitespace
    24+H    pad   zeros up to data_offset = align_up(24 + H, 4096)
    data    ...   tensor data; tensor i lives at data_offset + tensors[i].offset,
                  every offset a multiple of 64 (AVX-512 loads, mmap friendly),
                  zeros between tensors; file size = data_offset + data_size

Header JSON::

    {"rank": r, "tp_size": n, "target": "cpu", "isa_baseline": "avx2",
     "data_size": bytes, "plan": {...see builder/plan.py...},
     "tensors": [{"name", "dtype", "layout", "shape", "offset", "nbytes"}, ...]}

dtype and layout are the stable numeric ids below; an id is never reused for another meaning.
Every offset and size is bounds-checked by the reader (C++ EngineFile and Executor).
The writer emits identical bytes for identical inputs: no timestamps, sorted JSON keys,
tensors in plan order.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable

import numpy as np

MAGIC = b"BESSEMER"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # 1: layout panel16_int4_k8
PREAMBLE = struct.Struct("<8sHHIQ")  # magic, major, minor, flags, header_len
DATA_ALIGN = 4096
TENSOR_ALIGN = 64

# Stable dtype ids (never reuse a number).
DTYPE_IDS = {
    "float32": 0,
    "float16": 1,
    "bfloat16": 2,
    "int8": 3,
    "uint8": 4,
    "int32": 5,
    "float8_e4m3": 6,
    "int4": 7,
}
DTYPE_SIZES = {"int4": 1,  # only in panel16_int4(_k8), whose size rule halves it
               "float32": 4, "float16": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int32": 4,
               "float8_e4m3": 1}

# Stable layout ids (never reuse a number).
#   row_major: C order over `shape`.
#   panel16:   a [N, K] matrix (out_features, in_features) stored as ceil(N/16) panels of
#              16 output rows; element W[16p + j, k] lives at index (p*K + k)*16 + j;
#              rows past N are zero. Lets a GEMM/GEMV kernel read 16 outputs' weights
#              for one k with a single vector load.
#   panel16_int4: 4-bit codes (dtype int4) of a [N, K] matrix, panel16 order, 8 bytes per
#              (panel p, k): byte j holds the code of row 16p+j in its low nibble and of
#              row 16p+8+j in its high nibble (one byte load + mask/shift yields 16 lanes).
#   vnni16:    int8 [N, K] for the int8 x int8 kernel (linear_w8a8): ceil(N/16) panels of
#              16 rows, K padded with zeros to Kp = a multiple of 4, k in groups of 4:
#              W[16p + j, 4g + i] at byte ((p*Kp/4 + g)*16 + j)*4 + i. One 64-byte load is
#              16 rows x 4 k, the operand of one vpdpbusd (16 int32 lanes).
#   panel16_int4_k8: 4-bit codes (dtype int4) of a [N, K] matrix, K a multiple of 8, for
#              the bf16 dot-product kernel (linear_w4a16@2): ceil(N/16) panels of 16 rows,
#              each K/8 blocks of 64 bytes (8 k); in block b of panel p, byte 4r + 2e + h
#              holds the code of row 16p + r at k = 8b + 4h + e in its low nibble and at
#              k = 8b + 4h + 2 + e in its high nibble. So 16-bit word 2r + e holds k =
#              8b + 2j + e in nibble j: one shift per k pair j lines up 16 rows x 2 k.
LAYOUT_IDS = {"row_major": 0, "panel16": 1, "panel16_int4": 2, "vnni16": 3, "panel16_int4_k8": 4}
PANEL = 16


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


def packed_nbytes(shape: tuple[int, ...], dtype: str, layout: str) -> int:
    elem = DTYPE_SIZES[dtype]
    if layout == "row_major":
        return int(np.prod(shape, dtype=np.int64)) * elem
    if layout == "panel16":
        n, k = shape
        return align_up(n, PANEL) * k * elem
    if layout in ("panel16_int4", "panel16_int4_k8"):
        n, k = shape
        return align_up(n, PANEL) * k // 2
    if layout == "vnni16":
        n, k = shape
        return align_up(n, PANEL) * align_up(k, 4) * elem
    raise ValueError(f"unknown layout {layout!r}")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a rank file; `produce` returns its packed bytes (streamed at write time)."""

    name: str
    dtype: str
    layout: str
    shape: tuple[int, ...]
    produce: Callable[[], bytes | np.ndarray]

    @property
    def nbytes(self) -> int:
        return packed_nbytes(self.shape, self.dtype, self.layout)


def _write_padding(f: BinaryIO, count: int) -> None:
    if count:
        f.write(b"\0" * count)


def write_rank_file(path: Path, header: dict, tensors: Iterable[TensorEntry],
                    on_tensor: Callable[[str, int], None] | None = None) -> str:
    """Writes one rank file and returns its sha256 hex digest.

    Tensor data is produced one tensor at a time, so peak memory is one packed tensor,
    never the whole model.
    """
    tensors = list(tensors)
    table, offset = [], 0
    for t in tensors:
        offset = align_up(offset, TENSOR_ALIGN)
        table.append({"name": t.name, "dtype": DTYPE_IDS[t.dtype], "layout": LAYOUT_IDS[t.layout],
                      "shape": list(t.shape), "offset": offset, "nbytes": t.nbytes})
        offset += t.nbytes
    header = dict(header, tensors=table, data_size=offset)
    header_bytes = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    data_offset = align_up(PREAMBLE.size + len(header_bytes), DATA_ALIGN)

    digest = hashlib.sha256()

    class _HashingWriter:
        def __init__(self, f: BinaryIO):
            self.f = f

        def write(self, b) -> None:
            digest.update(b)
            self.f.write(b)

    with open(path, "wb") as raw:
        f = _HashingWriter(raw)
        f.write(PREAMBLE.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(header_bytes)))
        f.write(header_bytes)
        _write_padding(f, data_offset - PREAMBLE.size - len(header_bytes))
        pos = 0
        for t, entry in zip(tensors, table):
            _write_padding(f, entry["offset"] - pos)
            data = t.produce()
            blob = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
            if len(blob) != entry["nbytes"]:
                raise ValueError(f"tensor {t.name}: produced {len(blob)} bytes, expected {entry['nbytes']}")
            f.write(blob)
            pos = entry["offset"] + entry["nbytes"]
            if on_tensor is not None:
                on_tensor(t.name, len(blob))
        raw.flush()
        os.fsync(raw.fileno())
    return digest.hexdigest()


def read_rank_header(path: Path) -> tuple[int, int, dict, int]:
    """Returns (major, minor, header, data_offset) after checking magic and bounds."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        pre = f.read(PREAMBLE.size)
        if len(pre) < PREAMBLE.size:
            raise ValueError(f"{path}: file too short ({size} bytes) to be an engine")
        magic, major, minor, _flags, header_len = PREAMBLE.unpack(pre)
        if magic != MAGIC:
            raise ValueError(f"{path}: not a Bessemer engine file (bad magic)")
        if header_len > size - PREAMBLE.size:
            raise ValueError(f"{path}: header length {header_len} runs past the end of the file")
        header = json.loads(f.read(header_len))
    return major, minor, header, align_up(PREAMBLE.size + header_len, DATA_ALIGN)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


# ---- packing of numpy weights into the stored layouts ----

BF16_CHUNK = 1 << 20  # elements per pass: the temporaries stay in cache, never page-faulted in


def to_bfloat16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns (uint16), round to nearest even; NaN stays NaN. Chunked
    and in place: a multi-GB weight converts at memory speed (whole-array temporaries made
    an 8B model's build spend most of its time faulting in fresh pages)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    flat = x.reshape(-1)
    bits = flat.view(np.uint32)
    out = np.empty(bits.shape, dtype=np.uint16)
    tmp = np.empty(min(BF16_CHUNK, bits.size), dtype=np.uint32)
    for i in range(0, bits.size, BF16_CHUNK):
        b = bits[i:i + BF16_CHUNK]
        t = tmp[:b.size]
        np.right_shift(b, 16, out=t)
        np.bitwise_and(t, 1, out=t)
        t += 0x7FFF  # + the rounding bias: 0x7FFF, or 0x8000 when the kept part is odd
        t += b
        t >>= 16
        out[i:i + b.size] = t
        nan = np.isnan(flat[i:i + BF16_CHUNK])
        if nan.any():
            out[i:i + b.size][nan] = 0x7FC0
    return out.reshape(x.shape)


def bfloat16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def pack_panel16(w: np.ndarray) -> np.ndarray:
    """[N, K] -> panel16 order (flat), zero-padding N up to a multiple of 16."""
    n, k = w.shape
    n_pad = align_up(n, PANEL)
    if n_pad != n:
        w = np.concatenate([w, np.zeros((n_pad - n, k), dtype=w.dtype)], axis=0)
    # [P, 16, K] -> [P, K, 16]
    return np.ascontiguousarray(w.reshape(n_pad // PANEL, PANEL, k).transpose(0, 2, 1)).reshape(-1)


def encode(w: np.ndarray, dtype: str, layout: str) -> np.ndarray:
    """fp32 array -> bytes-ready array in the given stored dtype and layout."""
    w = np.asarray(w, dtype=np.float32)
    if dtype == "float32":
        v = w
    elif dtype == "bfloat16":
        v = to_bfloat16_bits(w)
    elif dtype == "float16":
        v = w.astype(np.float16)
    else:
        raise ValueError(f"encode: unsupported dtype {dtype!r}")
    if layout == "panel16":
        return pack_panel16(v)
    return np.ascontiguousarray(v).reshape(-1)
