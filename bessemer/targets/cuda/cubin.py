"""Reading a cubin without a GPU: what the launcher and the checks need to know about it.

From the ELF itself (pure Python): the arch (ELF flags: the SM number, and bit 0x800 for
the "a" arch-specific features of sm_90a), and from the .nv.info sections the kernel's
parameter table (EIATTR_KPARAM_INFO: ordinal, offset, size), its required block size
(EIATTR_REQNTID, the PTX .reqntid), registers (EIATTR_REGCOUNT), stack frame
(EIATTR_FRAME_SIZE) and the instructions ptxas marked as spills or refills
(EIATTR_ANNOTATIONS, kind 1). From the SASS (cuobjdump, shipped in the triton wheel): the
instruction mix, e.g. HGMMA (Hopper warpgroup MMA) and HMMA (mma.sync) tensor-core ops;
for many cubins at once, one nvdisasm run over their code (what the build stores).

check_kernel() compares a cubin with the kernel metadata the engine stores for it.
"""

from __future__ import annotations

import bisect
import re
import struct
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

EM_CUDA = 190
ELFOSABI_CUDA = 0x33
EF_CUDA_SM_MASK = 0xFF
EF_CUDA_ARCH_SPECIFIC = 0x800  # the "a" in sm_90a (ELF ABI version 7)
# .nv.info attribute ids (format EIFMT_SVAL = 4 carries a u16 size and a payload)
EIFMT_SVAL = 4
EIATTR_FRAME_SIZE = 0x11
EIATTR_REQNTID = 0x10
EIATTR_KPARAM_INFO = 0x17
EIATTR_REGCOUNT = 0x2F
EIATTR_ANNOTATIONS = 0x55
ANNOTATION_SPILL_REFILL = 1
TENSOR_CORE_OPS = ("HGMMA", "HMMA", "QGMMA")


class CubinError(ValueError):
    pass


@dataclass(frozen=True)
class CubinInfo:
    arch: str  # "sm_90a"
    entry: str  # the kernel's symbol
    params: tuple[tuple[int, int], ...]  # (offset, size) by ordinal
    reqntid: tuple[int, int, int]
    registers: int
    frame_bytes: int
    spill_instructions: int  # instructions ptxas annotated as spill stores / refills


def _sections(data: bytes) -> dict[str, bytes]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise CubinError("not a little-endian ELF64 file")
    if struct.unpack_from("<H", data, 0x12)[0] != EM_CUDA or data[7] != ELFOSABI_CUDA:
        raise CubinError("not a CUDA ELF (machine/OS ABI)")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff + shnum * shentsize > len(data):
        raise CubinError("section table runs past the end of the file")
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names_off = headers[shstrndx][4]
    out = {}
    for name, typ, _flags, _addr, off, size, *_ in headers:
        label = data[names_off + name: data.index(b"\0", names_off + name)].decode()
        if typ != 8:  # SHT_NOBITS has no bytes in the file
            if off + size > len(data):
                raise CubinError(f"section {label} runs past the end of the file")
            out[label] = data[off: off + size]
    return out


def _attributes(section: bytes) -> list[tuple[int, bytes]]:
    """(attribute id, payload) of each .nv.info entry; non-SVAL entries carry 2 value bytes."""
    out, p = [], 0
    while p + 4 <= len(section):
        fmt, attr = section[p], section[p + 1]
        if fmt == EIFMT_SVAL:
            size = struct.unpack_from("<H", section, p + 2)[0]
            out.append((attr, section[p + 4: p + 4 + size]))
            p += 4 + size
        else:
            out.append((attr, section[p + 2: p + 4]))
            p += 4
    return out


def arch_of(data: bytes) -> str:
    flags = struct.unpack_from("<I", data, 0x30)[0]
    if data[8] != 7:
        raise CubinError(f"CUDA ELF ABI version {data[8]} is not the one this reader knows (7)")
    return f"sm_{flags & EF_CUDA_SM_MASK}{'a' if flags & EF_CUDA_ARCH_SPECIFIC else ''}"


def read_cubin(data: bytes) -> CubinInfo:
    sections = _sections(data)
    infos = [name for name in sections if name.startswith(".nv.info.")]
    if len(infos) != 1:
        raise CubinError(f"expected one kernel in the cubin, found {len(infos)}")
    entry = infos[0][len(".nv.info."):]
    params: dict[int, tuple[int, int]] = {}
    reqntid, spills = (0, 0, 0), 0
    for attr, payload in _attributes(sections[infos[0]]):
        if attr == EIATTR_KPARAM_INFO:
            _index, ordinal, offset, packed = struct.unpack_from("<IHHI", payload)
            params[ordinal] = (offset, (packed >> 18) & 0x3FFF)
        elif attr == EIATTR_REQNTID:
            reqntid = struct.unpack_from("<III", payload)
        elif attr == EIATTR_ANNOTATIONS:
            pairs = struct.iter_unpack("<II", payload[: len(payload) // 8 * 8])
            spills += sum(1 for kind, _offset in pairs if kind == ANNOTATION_SPILL_REFILL)
    registers = frame = 0
    for attr, payload in _attributes(sections.get(".nv.info", b"")):
        if attr == EIATTR_REGCOUNT:
            registers = struct.unpack_from("<II", payload)[1]
        elif attr == EIATTR_FRAME_SIZE:
            frame = struct.unpack_from("<II", payload)[1]
    if sorted(params) != list(range(len(params))):
        raise CubinError(f"{entry}: parameter ordinals {sorted(params)} are not 0..n-1")
    return CubinInfo(arch_of(data), entry, tuple(params[i] for i in range(len(params))), tuple(reqntid),
                     registers, frame, spills)


# an instruction of nvdisasm's listing: /*offset*/, an optional predicate, the opcode
_SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def _nvidia_tool(name: str) -> Path:
    import triton

    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def sass_opcodes(data: bytes) -> Counter:
    """Opcode counts of the cubin's SASS (cuobjdump -sass from the triton wheel)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(data)
        f.flush()
        text = subprocess.run([str(_nvidia_tool("cuobjdump")), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    return Counter(m.group(2) for m in _SASS_INSTRUCTION.finditer(text))


def sass_opcodes_of(cubins: list[bytes]) -> list[Counter]:
    """sass_opcodes() of many cubins from one nvdisasm run per arch. cuobjdump -sass starts
    nvdisasm once per cubin, and its start-up (about 0.5 s of CPU) is most of what a small
    kernel's disassembly costs. The cubins' code sections (.text.*), concatenated, are
    disassembled as one raw instruction stream of their arch; each instruction counts for
    the cubin whose code holds its offset."""
    counts = [Counter() for _ in cubins]
    by_arch: dict[str, list[int]] = {}
    for i, data in enumerate(cubins):
        by_arch.setdefault(arch_of(data), []).append(i)
    for arch, indices in by_arch.items():
        stream, starts = bytearray(), []
        for i in indices:
            starts.append(len(stream))
            for name, code in _sections(cubins[i]).items():
                if name.startswith(".text."):
                    if len(code) % 16:
                        raise CubinError(f"{name}: {len(code)} bytes, not whole 16-byte instructions")
                    stream += code
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(stream)
            f.flush()
            text = subprocess.run([str(_nvidia_tool("nvdisasm")), "--binary", "SM" + arch[len("sm_"):], "-hex",
                                   "-novliw", f.name], capture_output=True, text=True, check=True).stdout
        for m in _SASS_INSTRUCTION.finditer(text):
            counts[indices[bisect.bisect_right(starts, int(m.group(1), 16)) - 1]][m.group(2)] += 1
    return counts


def tensor_core_ops(ops: Counter) -> dict[str, int]:
    return {op: ops[op] for op in TENSOR_CORE_OPS if ops[op]}


def tensor_core_counts(data: bytes) -> dict[str, int]:
    return tensor_core_ops(sass_opcodes(data))


def check_kernel(data: bytes, metadata: dict, arch: str) -> list[str]:
    """Problems of one stored cubin against its metadata (empty = consistent): arch, entry,
    parameter table (offsets and sizes, scratch pointers included), .reqntid = 32 x the
    compiled num_warps, registers, and no spills."""
    import hashlib

    info = read_cubin(data)
    name = metadata.get("entry")
    problems = []
    if hashlib.sha256(data).hexdigest() != metadata.get("cubin_sha256"):
        problems.append(f"{name}: cubin sha256 differs from the stored one")
    if info.arch != arch:
        problems.append(f"{name}: cubin arch {info.arch}, engine arch {arch}")
    if info.entry != name:
        problems.append(f"{name}: cubin kernel symbol is {info.entry}")
    table = tuple((p["offset"], p["size"]) for p in metadata["params"])
    if info.params != table:
        problems.append(f"{name}: cubin parameters {info.params} != stored {table}")
    if info.reqntid != (32 * metadata["num_warps"], 1, 1):
        problems.append(f"{name}: .reqntid {info.reqntid} != 32 x num_warps {metadata['num_warps']}")
    if info.registers != metadata["ptxas"]["registers"] or info.frame_bytes != metadata["ptxas"]["stack_frame_bytes"]:
        problems.append(f"{name}: cubin registers/frame {info.registers}/{info.frame_bytes} != ptxas report "
                        f"{metadata['ptxas']['registers']}/{metadata['ptxas']['stack_frame_bytes']}")
    spilled = metadata["ptxas"]["spill_store_bytes"] + metadata["ptxas"]["spill_load_bytes"]
    if info.spill_instructions or spilled:
        problems.append(f"{name}: register spills ({spilled} bytes, {info.spill_instructions} instructions)")
    return problems
