"""Engine directory and rank-file format: the contract between builder and runtime.

Engine directory (written atomically: built in a sibling temp dir, then renamed)::

    config.json         format version, bessemer version, model/build/quant config, mapping,
                        target (and the target's own fields, e.g. isa_baseline), plugin@version
                        list, rank files with size and sha256
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

    {"rank": r, "tp_size": n, "target": "cpu", <the target's header fields, e.g.
     "isa_baseline": "avx2">, "data_size": bytes, "plan": {...see format/plan.py...},
     "tensors": [{"name", "dtype", "layout", "shape", "offset", "nbytes"}, ...]}

dtype and layout are the stable numeric ids of format/dtypes.py and format/layouts.py;
nbytes follows the layout's size rule. Every offset and size is bounds-checked by the
readers (the C++ rank-file reader of each target's executor, read_rank_header here).
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
from typing import Callable, Iterable

import numpy as np

from bessemer.format.dtypes import DTYPE_IDS
from bessemer.format.layouts import LAYOUT_IDS, align_up, packed_nbytes

MAGIC = b"BESSEMER"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1  # 1: layout panel16_int4_k8
PREAMBLE = struct.Struct("<8sHHIQ")  # magic, major, minor, flags, header_len
DATA_ALIGN = 4096
TENSOR_ALIGN = 64


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


def header_bytes(header: dict) -> bytes:
    """The header as stored: sorted keys, no whitespace (so equal headers are equal bytes)."""
    return json.dumps(header, sort_keys=True, separators=(",", ":")).encode()


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
    blob = header_bytes(dict(header, tensors=table, data_size=offset))
    data_offset = align_up(PREAMBLE.size + len(blob), DATA_ALIGN)

    digest = hashlib.sha256()
    with open(path, "wb") as f:
        def write(b) -> None:
            digest.update(b)
            f.write(b)

        write(PREAMBLE.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(blob)))
        write(blob)
        write(b"\0" * (data_offset - PREAMBLE.size - len(blob)))
        pos = 0
        for t, entry in zip(tensors, table):
            write(b"\0" * (entry["offset"] - pos))
            data = t.produce()
            raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
            if len(raw) != entry["nbytes"]:
                raise ValueError(f"tensor {t.name}: produced {len(raw)} bytes, expected {entry['nbytes']}")
            write(raw)
            pos = entry["offset"] + entry["nbytes"]
            if on_tensor is not None:
                on_tensor(t.name, len(raw))
        f.flush()
        os.fsync(f.fileno())
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


def rewrite_header(src: Path, dst: Path, edit: Callable[[dict], None]) -> Path:
    """Copies rank file `src` to `dst` with its header changed by `edit` (in place on the
    parsed dict) and the tensor data unchanged: for tools and tests that need a plan
    without some steps, or a damaged table, without rebuilding. data_size is kept as is."""
    major, minor, header, data_offset = read_rank_header(Path(src))
    edit(header)
    with open(src, "rb") as f:
        f.seek(data_offset)
        data = f.read()
    blob = header_bytes(header)
    with open(dst, "wb") as f:
        f.write(PREAMBLE.pack(MAGIC, major, minor, 0, len(blob)))
        f.write(blob)
        f.write(b"\0" * (align_up(PREAMBLE.size + len(blob), DATA_ALIGN) - PREAMBLE.size - len(blob)))
        f.write(data)
    return Path(dst)
