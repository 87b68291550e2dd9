"""Reads a HF checkpoint directory without loading it: config, tensor index, mmap'd tensors.

safetensors is parsed here directly (8-byte header length, JSON header, raw data) so that
shapes are known without touching tensor data, every offset is bounds-checked with an
error naming the file, and a tensor is materialised only while it is being packed: read
with pread into the fp32 array the builder uses (no mmap'd pages left resident, so the
build's memory does not grow to the checkpoint's size).
"""

from __future__ import annotations

import json
import mmap
import threading
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bessemer.builder.hf_config_fields import check_field_types
from bessemer.errors import BessemerError

SAFETENSORS_DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2),
                      "F64": (np.float64, 8), "U8": (np.uint8, 1)}  # U8: MXFP4 blocks and scales


@dataclass(frozen=True)
class TensorLocation:
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    end: int


def load_hf_config(model_dir: Path) -> dict:
    if not model_dir.exists():
        raise BessemerError(f"model directory {model_dir} does not exist; pass a HF checkpoint directory")
    if not model_dir.is_dir():
        raise BessemerError(f"{model_dir} is not a directory; pass a HF checkpoint directory")
    path = model_dir / "config.json"
    if not path.exists():
        raise BessemerError(f"{path} is missing; a HF checkpoint needs config.json (save it with save_pretrained)")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BessemerError(f"{path} is not valid JSON ({e.msg if hasattr(e, 'msg') else e}); re-export the checkpoint") from None
    check_field_types(hf, path)
    return hf


def _read_safetensors_header(path: Path) -> dict[str, TensorLocation]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise BessemerError(f"{path} is truncated ({size} bytes); re-download or re-save the checkpoint")
        (header_len,) = struct.unpack("<Q", raw)
        if header_len > size - 8 or header_len > 100 << 20:
            raise BessemerError(f"{path} is corrupt (header length {header_len} exceeds the file); re-download the checkpoint")
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BessemerError(f"{path} is corrupt (unreadable header); re-download the checkpoint") from None
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = info.get("dtype")
        if dtype not in SAFETENSORS_DTYPES:
            raise BessemerError(f"{path}: tensor {name} has dtype {dtype}; only F32/F16/BF16 checkpoints (and MXFP4 "
                                "U8 block/scale pairs) are supported")
        start, end = info["data_offsets"]
        shape = tuple(int(s) for s in info["shape"])
        nbytes = int(np.prod(shape, dtype=np.int64)) * SAFETENSORS_DTYPES[dtype][1]
        if end - start != nbytes or base + end > size:
            raise BessemerError(f"{path} is truncated or corrupt (tensor {name} runs past the end); re-download the checkpoint")
        out[name] = TensorLocation(path, dtype, shape, base + start, base + end)
    return out


def _pread_into(fd: int, out: np.ndarray, offset: int) -> None:
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise BessemerError(f"checkpoint read failed at byte {offset + done}; re-download the checkpoint")
        done += n


class Checkpoint:
    """Tensor index over all safetensors files of a checkpoint; `get` returns fp32 numpy.
    An MXFP4 pair `<name>_blocks` + `<name>_scales` (gpt-oss experts) is one tensor `<name>`,
    dequantized when it is read (quantization/mxfp4.py)."""

    def __init__(self, model_dir: Path):
        self.dir = Path(model_dir)
        self.config = load_hf_config(self.dir)
        files = sorted(self.dir.glob("*.safetensors"))
        if not files:
            raise BessemerError(f"no *.safetensors weights in {self.dir}; save the model with save_pretrained(safe_serialization=True)")
        self.index: dict[str, TensorLocation] = {}
        for f in files:
            self.index.update(_read_safetensors_header(f))
        self.mxfp4 = {n[:-len("_blocks")]: (n, n[:-len("_blocks")] + "_scales") for n in self.index
                      if n.endswith("_blocks") and n[:-len("_blocks")] + "_scales" in self.index}
        for blocks, scales in self.mxfp4.values():
            if self.index[blocks].dtype != "U8" or self.index[scales].dtype != "U8":
                raise BessemerError(f"{blocks} / {scales} are not an MXFP4 pair (uint8); re-export the checkpoint")
        self._maps: dict[Path, mmap.mmap] = {}
        self._fds: dict[Path, int] = {}
        self._open_lock = threading.Lock()

    def shapes(self) -> dict[str, tuple[int, ...]]:
        from bessemer.quantization.mxfp4 import dequantized_shape

        pairs = {n for pair in self.mxfp4.values() for n in pair}
        out = {k: v.shape for k, v in self.index.items() if k not in pairs}
        out.update({name: dequantized_shape(self.index[blocks].shape) for name, (blocks, _) in self.mxfp4.items()})
        return out

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape `get(name)` returns (an MXFP4 pair's dequantized shape)."""
        if name in self.mxfp4:
            from bessemer.quantization.mxfp4 import dequantized_shape

            return dequantized_shape(self.index[self.mxfp4[name][0]].shape)
        return self.index[name].shape

    def get(self, name: str, sl: tuple | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """The tensor as fp32; with `sl` = (row_start, row_stop, col_start, col_stop) only
        that block (cols ignored for 1-D) is read, with pread: a tensor-parallel rank's
        build touches (and counts in its RSS) only its shard's bytes, not mmap'd neighbours.
        `out`: a C-contiguous fp32 array of the tensor's shape to read a whole tensor into
        (the rows of a fused weight: no concatenation copy); returned."""
        if name in self.mxfp4:
            from bessemer.quantization.mxfp4 import decode_mxfp4

            blocks, scales = self.mxfp4[name]
            if sl is not None:  # a rank's experts (rows of the stacked tensor): decode only those
                return decode_mxfp4(self._raw(blocks)[sl[0]:sl[1]], self._raw(scales)[sl[0]:sl[1]])
            return decode_mxfp4(self._raw(blocks), self._raw(scales))
        loc = self.index[name]
        if sl is None:
            return self._read_whole(loc, out)
        np_dtype, size = SAFETENSORS_DTYPES[loc.dtype]
        raw = self._read_block(loc, np_dtype, size, sl)
        if loc.dtype == "BF16":
            return _bf16_to_float32(raw)
        return raw.astype(np.float32)

    def _fd(self, file: Path) -> int:
        with self._open_lock:  # quantizing threads read tensors at once (pread itself is positional)
            if file not in self._fds:
                self._fds[file] = os.open(file, os.O_RDONLY)
            return self._fds[file]

    def _read_whole(self, loc: TensorLocation, out: np.ndarray | None = None) -> np.ndarray:
        """A whole tensor as fp32, read with pread straight into its fp32 array (F32) or in
        blocks converted as they arrive: the checkpoint is read once, and neither a mmap'd
        copy of it (which an 8B build would keep resident, 16 GB) nor a whole-tensor bf16
        temporary stays in the build's memory."""
        fd = self._fd(loc.file)
        if out is None:
            out = np.empty(loc.shape, dtype=np.float32)
        elif out.shape != loc.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
            raise ValueError(f"out must be C-contiguous float32 {loc.shape}, not {out.dtype} {out.shape}")
        flat = out.reshape(-1)
        if loc.dtype == "F32":
            _pread_into(fd, flat, loc.start)
            return out
        np_dtype, size = SAFETENSORS_DTYPES[loc.dtype]
        buf = np.empty(min(BF16_CHUNK, flat.size), dtype=np_dtype)
        for i in range(0, flat.size, BF16_CHUNK):
            chunk = buf[:min(BF16_CHUNK, flat.size - i)]
            _pread_into(fd, chunk, loc.start + i * size)
            if loc.dtype == "BF16":
                dst = flat[i:i + chunk.size].view(np.uint32)
                dst[...] = chunk
                dst <<= 16
            else:
                flat[i:i + chunk.size] = chunk
        return out

    def mxfp4_pair(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """The MXFP4 tensor `name`'s blocks and scales as stored (uint8 views of the mapped file)."""
        blocks, scales = self.mxfp4[name]
        return self._raw(blocks), self._raw(scales)

    def _raw(self, name: str) -> np.ndarray:
        """A tensor as stored (no conversion): the uint8 blocks and scales of MXFP4."""
        loc = self.index[name]
        with self._open_lock:
            if loc.file not in self._maps:
                with open(loc.file, "rb") as f:
                    self._maps[loc.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        np_dtype, size = SAFETENSORS_DTYPES[loc.dtype]
        return np.frombuffer(self._maps[loc.file], dtype=np_dtype, count=(loc.end - loc.start) // size,
                             offset=loc.start).reshape(loc.shape)

    def _read_block(self, loc: TensorLocation, np_dtype, size: int, sl: tuple) -> np.ndarray:
        fd = self._fd(loc.file)
        r0, r1 = sl[0], sl[1]
        row = int(np.prod(loc.shape[1:], dtype=np.int64)) if len(loc.shape) > 1 else 1
        c0, c1 = (sl[2], sl[3]) if len(loc.shape) == 2 else (0, row)
        out = np.empty((r1 - r0, c1 - c0), dtype=np_dtype)
        if c1 - c0 == row:  # whole rows: one contiguous read
            _pread_into(fd, out, loc.start + r0 * row * size)
        else:
            for i in range(r1 - r0):  # a column block: its bytes of each row
                _pread_into(fd, out[i], loc.start + ((r0 + i) * row + c0) * size)
        return out if len(loc.shape) == 2 else out.reshape((r1 - r0,) + tuple(loc.shape[1:]))

    def close(self) -> None:
        for m in self._maps.values():
            m.close()
        self._maps.clear()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


BF16_CHUNK = 1 << 20  # elements per pass: no whole-tensor uint32 temporary


def _bf16_to_float32(raw: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) -> fp32, exactly, in chunks."""
    out = np.empty(raw.shape, dtype=np.float32)
    src, dst = raw.reshape(-1), out.reshape(-1).view(np.uint32)
    for i in range(0, src.size, BF16_CHUNK):
        d = dst[i:i + BF16_CHUNK]
        d[...] = src[i:i + BF16_CHUNK]
        d <<= 16
    return out
