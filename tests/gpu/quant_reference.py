"""The reference a quantized engine is compared with in the GPU check: the HF model of the
same checkpoint with the engine's own quantization applied, as the cpu-side tests build it
(tests/cuda_interpreter/test_quantized.py, test_fp8.py, test_kv_codes.py):

- every quantized linear holds the dequantized weights the engine stores: its codes and
  scales are read back from the engine file and dequantized on the model's device (int4
  groups: code * scale + offset, offset -8 * scale when symmetric; two-level int4 (w4k): the
  same, with each sub-block's scale and offset from quantization/superblock.expand; E4M3 and
  int8: value * per-row scale), so the reference is exact without requantizing 7 billion
  weights on one CPU core (the numpy quantizers take minutes per engine at the 8B shape);
- an fp8 linear's input is rounded to E4M3 with its token's own scale, max |x| / 448 (or the
  engine's static input scale), as linear_fp8 does (quantization/fp8.py quantize_activation);
- with a one-byte KV cache, attention reads K (after RoPE) and V through the cache's
  quantize + dequantize (tests/hf_kv_quant.py).

Fused engine weights (qkv_proj, gate_up_proj) are split back into HF's modules by rows.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: hf_kv_quant, the cpu tests' oracle
from hf_kv_quant import register_hf_kvq  # noqa: E402

from bessemer.quantization import superblock  # noqa: E402

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
E4M3_MAX = 448.0
KV_KINDS = {"float8_e4m3": "fp8", "int8": "int8"}


class EngineTensors:
    """The tensors of an engine's rank0.engine by name, read (not copied) from the file."""

    def __init__(self, engine_dir: Path):
        from bessemer.format.container import read_rank_header
        from bessemer.format.dtypes import DTYPES

        path = Path(engine_dir) / "rank0.engine"
        _, _, self.header, data_offset = read_rank_header(path)
        self.names = {d.id: d.name for d in DTYPES}
        self.entries = {t["name"]: t for t in self.header["tensors"]}
        self._data = np.memmap(path, np.uint8, "r")
        self._offset = data_offset

    def dtype(self, name: str) -> str:
        return self.names[self.entries[name]["dtype"]]

    def raw(self, name: str) -> np.ndarray:
        t = self.entries[name]
        start = self._offset + t["offset"]
        return self._data[start:start + t["nbytes"]]

    def tensor(self, name: str, device):
        """The stored values as a torch tensor on `device`: float32 (bf16 / fp32 parts), or
        the raw codes (uint8 bytes: int4 pairs, E4M3, int8 as uint8)."""
        import torch

        raw = torch.from_numpy(np.array(self.raw(name))).to(device)
        dtype = self.dtype(name)
        if dtype == "bfloat16":
            return raw.view(torch.bfloat16).float()
        if dtype == "float32":
            return raw.view(torch.float32)
        return raw

    def array(self, name: str) -> np.ndarray:
        """A uint8 or float16 part as a NumPy array of its stored shape (w4k's sub-block
        codes and super-parameters, which superblock.expand reads on the host)."""
        kinds = {"uint8": np.uint8, "float16": np.float16}
        dtype = self.dtype(name)
        if dtype not in kinds:
            raise ValueError(f"{name}: stored as {dtype}, not a w4k sub-block or super-block part")
        return np.array(self.raw(name)).view(kinds[dtype]).reshape(self.entries[name]["shape"])


def _superblock_parameters(tensors: EngineTensors, name: str, device):
    """The fp32 scale and offset (N, K / SUB) of every sub-block of a two-level int4 weight,
    by the format's own rule (superblock.expand: d * sc and -(dmin * m), each rounded once)."""
    import torch

    part = {role: tensors.array(f"{name}.{role}") for role in ("scales", "offsets", "super_scales", "super_offsets")}
    scales, offsets = superblock.expand(part["super_scales"], part["scales"], part["super_offsets"], part["offsets"])
    return torch.from_numpy(scales).to(device), torch.from_numpy(offsets).to(device)


def dequantized(tensors: EngineTensors, name: str, device):
    """The fp32 weight [N, K] an engine's quantized linear computes with."""
    import torch

    n, k = tensors.entries[name]["shape"]
    dtype = tensors.dtype(name)
    codes = tensors.tensor(name, device)
    if dtype == "int4":  # row-major, two codes a byte, the even column in the low nibble
        values = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(n, k).float()
        if name + ".super_scales" in tensors.entries:  # two-level (w4k): uint8 sub-block codes
            scales, offsets = _superblock_parameters(tensors, name, device)
        else:
            scales = tensors.tensor(name + ".scales", device)
            offsets = tensors.tensor(name + ".offsets", device) if name + ".offsets" in tensors.entries else None
        groups = scales.shape[-1] if scales.dim() == 2 else scales.numel() // n
        scales = scales.reshape(n, groups, 1)
        offsets = -8.0 * scales if offsets is None else offsets.reshape(n, groups, 1)
        # multiply, then add: two fp32 roundings, as primitives.dequantize_int4
        return (values.reshape(n, groups, k // groups) * scales + offsets).reshape(n, k)
    scales = tensors.tensor(name + ".scales", device)
    if dtype == "float8_e4m3":
        return codes.view(torch.float8_e4m3fn).float().reshape(n, k) * scales.reshape(n, 1)
    if dtype == "int8":
        return codes.view(torch.int8).float().reshape(n, k) * scales.reshape(n, 1)
    raise ValueError(f"{name}: stored as {dtype}, which the GPU check's reference cannot dequantize")


def _round_input_to_e4m3(static_scale: float | None):
    """A forward pre-hook: the linear's input rounded to E4M3 with each token's scale
    max |x| / 448 (1 for a zero row) or the static one, in fp32 (x / s, saturating)."""
    import torch

    def hook(_module, args):
        x = args[0]
        rows = x.float().reshape(-1, x.shape[-1])  # (tokens, K)
        if static_scale is None:
            amax = rows.abs().amax(dim=1, keepdim=True)
            scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
        else:
            scale = torch.tensor(static_scale, dtype=torch.float32, device=x.device)
        q = (rows / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * scale
        return (q.reshape(x.shape).to(x.dtype),) + tuple(args[1:])

    return hook


def _modules_of(model, engine_name: str) -> list[tuple[str, object]]:
    """(HF module path, module) of the linears an engine weight holds, in row order."""
    path = engine_name.removesuffix(".weight")
    parent, _, leaf = path.rpartition(".")
    modules = dict(model.named_modules())
    names = [f"{parent}.{part}" for part in FUSED[leaf]] if leaf in FUSED else [path]
    missing = [n for n in names if n not in modules]
    if missing:
        raise ValueError(f"engine weight {engine_name}: no HF module {missing[0]} to hold it")
    return [(n, modules[n]) for n in names]


def fake_quantized_hf(model, engine_dir: Path):
    """An fp32 copy of `model` (an HF causal LM on its device) computing what the engine's
    quantization makes of it. Returns (model, notes): what was applied, for results.json."""
    import torch

    tensors = EngineTensors(engine_dir)
    device = next(model.parameters()).device
    ref = copy.deepcopy(model).float()  # a parameter at a time: bf16 + fp32 copies at peak
    notes = {"weights": {}, "fp8_inputs": 0, "kv": None}
    with torch.no_grad():
        for name, entry in tensors.entries.items():
            dtype = tensors.dtype(name)
            if name.startswith("cubin/") or dtype not in ("int4", "float8_e4m3", "int8") or name.endswith(".scales"):
                continue
            weight = dequantized(tensors, name, device)
            row = 0
            for _, module in _modules_of(ref, name):
                rows = module.weight.shape[0]
                module.weight.copy_(weight[row:row + rows])
                row += rows
                if dtype == "float8_e4m3":
                    scale = name + ".input_scale"
                    static = float(tensors.tensor(scale, "cpu")[0]) if scale in tensors.entries else None
                    module.register_forward_pre_hook(_round_input_to_e4m3(static))
                    notes["fp8_inputs"] += 1
            if row != entry["shape"][0]:
                raise ValueError(f"engine weight {name}: {entry['shape'][0]} rows, HF's modules hold {row}")
            stored = "int4_superblock" if name + ".super_scales" in tensors.entries else dtype
            notes["weights"][stored] = notes["weights"].get(stored, 0) + 1
            del weight
    kind = KV_KINDS.get(tensors.header["plan"]["kv_cache"]["dtype"])
    if kind:
        attn = register_hf_kvq(kind)
        if hasattr(ref, "set_attn_implementation"):
            ref.set_attn_implementation(attn)
        else:
            ref.config._attn_implementation = attn
        notes["kv"] = kind
    return ref, notes
