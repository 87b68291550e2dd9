"""Launches in a form two launchers can be compared in: kernel entry, grid, and each argument
as what it points at or holds, independent of where either launcher put its memory.

    ["weight", name, byte offset]   ["buffer", id, byte offset]    ["workspace", name, offset]
    ["step", array name, offset]    ["kv", "k"|"v", layer, offset] ["null"]
    ["i32", value]                  ["f32", value]

from_fake_log() reads the fake driver's records of the C++ executor (packed parameter bytes,
decoded by the kernel's parameter table); interpreted_launches.py produces the same from the
interpreted launcher of targets/cuda/interpret.py.
"""

from __future__ import annotations

import bisect
import struct

COUNT_NAMES = ("tokens", "selected", "seqs", "prefill_tiles", "decode_seqs")


class PointerMap:
    """Device pointer -> symbolic location, from the executor's memory map and step layout."""

    def __init__(self, memory_map: dict, step_layout: dict):
        self.regions = sorted((ptr, size, name) for name, (ptr, size) in memory_map.items() if name != "step")
        self.starts = [r[0] for r in self.regions]
        self.step_base, self.step_size = memory_map["step"]
        self.step_arrays = sorted((off, name) for name, value in step_layout.items()
                                  if name != "upload_bytes" for off in [value[0]])
        self.step_elems = {name: value[1] for name, value in step_layout.items() if name != "upload_bytes"}

    def symbol(self, ptr: int) -> list:
        if ptr == 0:
            return ["null"]
        if self.step_base <= ptr < self.step_base + self.step_size:
            off = ptr - self.step_base
            # the array holding this offset (an empty array shares its offset with the next one)
            hits = [(o, n) for o, n in self.step_arrays if o <= off < o + 4 * max(self.step_elems[n], 0)]
            if len(hits) != 1:
                raise AssertionError(f"step pointer +{off} is in {len(hits)} step arrays")
            start, name = hits[0]
            return ["step", name, off - start]
        i = bisect.bisect_right(self.starts, ptr) - 1
        base, size, name = self.regions[i]
        if not base <= ptr < base + max(size, 1):
            raise AssertionError(f"pointer {ptr:#x} is in no region")
        kind, _, rest = name.partition(":")
        if kind == "kv":
            k_or_v, layer = rest.split(":")
            return ["kv", k_or_v, int(layer), ptr - base]
        if kind == "buffer":
            return ["buffer", int(rest), ptr - base]
        return [kind, rest, ptr - base]


def decode_params(kernel: dict, packed: bytes, pointers: PointerMap) -> tuple[list, list]:
    """(runtime arguments, the two scratch pointers) of one launch's packed parameters."""
    args = []
    for p in kernel["params"]:
        raw = packed[p["offset"]: p["offset"] + p["size"]]
        if p["type"].startswith("*"):
            args.append(pointers.symbol(struct.unpack("<Q", raw)[0]))
        elif p["type"] == "i32":
            args.append(["i32", struct.unpack("<i", raw)[0]])
        elif p["type"] == "fp32":
            args.append(["f32", struct.unpack("<f", raw)[0]])
        else:
            raise AssertionError(f"parameter type {p['type']}")
    return args[:-2], args[-2:]


def from_fake_log(records: list[dict], header: dict, pointers: PointerMap, first_module: int) -> list[dict]:
    """The launches the device ran, in order: eager launches and graph replays (the
    recording made during capture is not an execution). The executor loads kernel i as the
    fake driver's module first_module + i."""
    out = []
    for r in records:
        if r["fn"] != "cuLaunchKernelEx" or r.get("capture"):
            continue
        kernel_id = r["module"] - first_module
        kernel = header["kernels"][kernel_id]
        assert kernel["entry"] == r["entry"]
        args, scratch = decode_params(kernel, bytes.fromhex(r["params"]), pointers)
        out.append({"kernel": kernel_id, "entry": r["entry"], "grid": r["grid"], "block": r["block"],
                    "shared": r["shared"], "args": args, "scratch": scratch, "replay": r.get("replay", 0)})
    return out
