"""A cuda engine's launch list executed on CPU through the Triton interpreter.

The proof, without a GPU, that a cuda engine computes its model: this executor follows
plan.py exactly as the C++ launcher must. It lays out device memory the same way (the
rank file's tensors at their offsets in one weights region; buffers, workspace, step
inputs and the KV cache in regions of 256-byte aligned arrays), derives the step arrays
with step_inputs.derive, resolves every grid rule and argument of every launch, checks
the alignment each pointer was compiled on, and calls the kernel named by the kernel
entry (its module and function, with its constexprs) over that grid. Only the kernel
body runs differently: the interpreter runs the Triton source instead of the cubin.

    executor = InterpretedExecutor(engine_dir, num_kv_blocks)     # TRITON_INTERPRET=1
    logits = executor.step(StepBatch.of(token_ids, positions, cu_seqlens, context_lens,
                                        block_tables, logits_indices))  # [L, V] float32
    tokens = executor.sample(temperature, top_k, top_p, uniform)   # [L] int32, same step

It implements the runtime's Executor protocol as the C++ executor does (step(StepBatch)), so
an LLM can serve a cuda engine with it on CPU (slowly: every kernel program is NumPy); the GPU check's
rehearsal does that (tests/gpu/rehearsal.py).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np

from bessemer.format.container import read_rank_header, sha256_file
from bessemer.format.engine_config import read_engine_config
from bessemer.errors import BessemerError, EngineLoadError
from bessemer.format.step import StepBatch
from bessemer.runtime.executor import ExecutorInfo
from bessemer.targets.cuda import interpreter, step_inputs
from bessemer.targets.cuda.compile import check_gpu_arch
from bessemer.targets.cuda.plan import SCHEMA, VERSION

ALIGN = 256
TORCH_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "int32": "int32",
                "int8": "int8", "uint8": "uint8", "float8_e4m3": "float8_e4m3fn"}
POINTER_DTYPES = {"*bf16": "bfloat16", "*fp16": "float16", "*fp32": "float32", "*i32": "int32", "*i8": "int8",
                  "*u8": "uint8", "*fp8e4nv": "float8_e4m3"}
ELEM = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "int8": 1, "uint8": 1, "float8_e4m3": 1}


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class _Region:
    """One device allocation: named arrays at 256-byte aligned offsets of a byte tensor."""

    def __init__(self, arrays: list[tuple[str, str, int]]):
        import torch

        self.offsets, self.dtypes, size = {}, {}, 0
        for name, dtype, elems in arrays:
            self.offsets[name], self.dtypes[name] = size, dtype
            size += _align(max(1, elems) * ELEM[dtype])
        self.mem = torch.zeros(max(size, ALIGN), dtype=torch.uint8)

    def pointer(self, name: str, byte_offset: int, dtype: str):
        """A tensor starting at the array's address + byte_offset (the kernel's pointer)."""
        import torch

        start = self.offsets[name] + byte_offset
        length = (self.mem.numel() - start) // ELEM[dtype] * ELEM[dtype]
        return self.mem[start:start + length].view(getattr(torch, TORCH_DTYPES[dtype]))

    def put(self, name: str, values: np.ndarray) -> None:
        import torch

        dst = self.pointer(name, 0, self.dtypes[name])
        src = torch.from_numpy(np.ascontiguousarray(values, dtype=np.dtype(self.dtypes[name])).ravel())
        dst[:src.numel()] = src


class InterpretedExecutor:
    def __init__(self, engine_dir: str | Path, num_kv_blocks: int, verify_checksum: bool = True,
                 device_arch: str | None = None):
        """device_arch: the GPU the launch list is checked against (the interpreter runs the
        kernels' source, so by default the engine's own arch)."""
        import torch

        interpreter.enable()
        from bessemer.targets import target_names

        d = Path(engine_dir)
        config = read_engine_config(d, target_names())
        if config.get("target") != "cuda":
            raise EngineLoadError(f"engine target {config.get('target')!r} is not a cuda engine; this executor runs "
                                  "engines built with --target cuda")
        check_gpu_arch(config["gpu_arch"], device_arch or config["gpu_arch"])
        entry = config["ranks"][0]
        path = d / entry["file"]
        if verify_checksum and sha256_file(path) != entry["sha256"]:
            raise EngineLoadError(f"rank file {path} is corrupt (sha256 differs from config.json); rebuild the engine")
        _major, _minor, header, data_offset = read_rank_header(path)
        plan = header["plan"]
        if (plan.get("schema"), plan.get("version")) != (SCHEMA, VERSION):
            raise EngineLoadError(f"cuda plan {plan.get('schema')} v{plan.get('version')} is not {SCHEMA} v{VERSION}; "
                                  "rebuild the engine")
        self.plan, self.kernels, self.gpu_arch = plan, header["kernels"], config["gpu_arch"]
        self.functions = [self._function(k) for k in self.kernels]
        # weights: the rank file's data region, tensors at their offsets
        data = bytearray(path.read_bytes()[data_offset:])
        self.weights = torch.zeros(len(data), dtype=torch.uint8)  # an aligned allocation, as on the device
        if data:
            self.weights.copy_(torch.frombuffer(data, dtype=torch.uint8))
        self.tensor_offsets = {t["name"]: t["offset"] for t in header["tensors"]}
        kv = plan["kv_cache"]
        self.num_kv_blocks = num_kv_blocks
        cache_rows = num_kv_blocks * plan["limits"]["kv_block_size"] * kv["num_kv_heads"]  # (token, head) rows
        # one-byte codes: each block's codes, then its fp32 scales (kernels/__init__.py)
        slots = cache_rows * (kv["head_dim"] + (4 if "scales" in kv else 0))
        rows = plan["limits"]["max_num_tokens"]
        self.buffers = _Region([(f"b{b['id']}", b["dtype"], rows * b["width"]) for b in plan["buffers"]])
        self.workspace = _Region([(w["name"], w["dtype"], w["elems"]) for w in plan["workspace"]])
        self.step_arrays = _Region([(s["name"], s["dtype"], s["elems"]) for s in plan["step_inputs"]])
        self.cache = _Region([(f"{kind}{layer}", kv["dtype"], slots)
                              for layer in range(kv["num_layers"]) for kind in "kv"])
        self.counts: dict | None = None
        self.launches = 0

    @staticmethod
    def _function(kernel: dict):
        fn = getattr(importlib.import_module(kernel["module"]), kernel["function"])
        if not hasattr(fn, "rewrite"):  # an InterpretedFunction
            raise BessemerError(f"{kernel['function']} was imported before TRITON_INTERPRET=1 was set; start Python "
                                "with it set to run cuda kernels on CPU")
        names = [n for n in fn.arg_names if n not in kernel["constexprs"]]
        if names != [p["name"] for p in kernel["params"][:-2]]:
            raise EngineLoadError(f"kernel {kernel['function']}: engine parameters {kernel['params'][:-2]} do not "
                                  f"match this version's kernel {names}; rebuild the engine")
        return fn

    # ---- the Executor protocol (runtime/executor.py) ----
    sampler = None  # the runtime samples on the host; sample() below is the plan's launch, for tests

    @property
    def info(self) -> ExecutorInfo:
        return ExecutorInfo(isa=f"cuda {self.gpu_arch} through the Triton interpreter (CPU)", num_threads=1,
                            num_kv_blocks=self.num_kv_blocks,
                            kernels=tuple(sorted({k["function"] for k in self.kernels})))

    def failure(self) -> str | None:
        return None

    def close(self) -> None:
        """Nothing to stop: every region is host memory."""

    # ---- one step ----
    def step(self, batch: StepBatch) -> np.ndarray:
        """As CudaExecutor.step: logits [L, V] float32 of the selected rows."""
        token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices = batch.arrays()
        limits = self.plan["limits"]
        if len(token_ids) > limits["max_num_tokens"] or len(context_lens) > limits["max_batch_size"]:
            raise BessemerError(f"step of {len(token_ids)} rows / {len(context_lens)} sequences exceeds the engine's "
                                f"max_num_tokens {limits['max_num_tokens']} / max_batch_size {limits['max_batch_size']}")
        arrays, counts = step_inputs.derive(
            token_ids, positions, cu_seqlens, context_lens, block_tables,
            logits_indices, block_size=limits["kv_block_size"], tile_tokens=self.plan["attention"]["tile_tokens"],
            max_blocks_per_seq=limits["max_blocks_per_seq"], num_blocks=self.num_kv_blocks)
        for name, values in arrays.items():
            self.step_arrays.put(name, values)
        self.counts = counts
        for launch in self.plan["forward"]:
            self._launch(launch, counts)
        logits = self.plan["logits"]
        out = self.buffers.pointer(f"b{logits['buffer']}", 0, "float32")
        return out[:counts["selected"] * logits["width"]].reshape(counts["selected"], logits["width"]).numpy().copy()

    def sample(self, temperature, top_k, top_p, uniform) -> np.ndarray:
        """Token per selected row of the last step, drawn on the device (plan "sample")."""
        if self.counts is None:
            raise BessemerError("sample() follows a step()")
        rows = self.counts["selected"]
        for name, values in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("uniform", uniform)):
            if len(values) != rows:
                raise BessemerError(f"{name} has {len(values)} entries for {rows} selected rows")
            self.step_arrays.put(name, np.asarray(values))
        for launch in self.plan["sample"]:
            self._launch(launch, self.counts)
        return self.step_arrays.pointer("sampled_tokens", 0, "int32")[:rows].numpy().copy()

    # ---- one launch, as plan.py specifies it ----
    def _launch(self, launch: dict, counts: dict) -> None:
        if "cases" in launch:
            rows = counts[launch["by"]]
            launch = next(c for c in launch["cases"] if c["max_rows"] is None or rows <= c["max_rows"])
        grid = tuple(g if isinstance(g, int) else -(-counts[g["count"]] // g["per"]) * g["times"]
                     for g in launch["grid"])
        if 0 in grid:
            return
        kernel = self.kernels[launch["kernel"]]
        args = {p["name"]: self._argument(p, a, counts) for p, a in zip(kernel["params"][:-2], launch["args"])}
        self.functions[launch["kernel"]][grid](**args, **kernel["constexprs"])
        self.launches += 1

    def _argument(self, param: dict, arg: dict, counts: dict):
        import torch

        if "count" in arg:
            return int(counts[arg["count"]])
        if "i32" in arg:
            return int(arg["i32"])
        if "f32" in arg:
            return float(np.float32(arg["f32"]))
        dtype = POINTER_DTYPES[param["type"]]
        if "null" in arg:
            return torch.empty(0, dtype=getattr(torch, TORCH_DTYPES[dtype]))
        if "buffer" in arg:
            buffer = self.plan["buffers"][arg["buffer"]]
            ptr = self.buffers.pointer(f"b{arg['buffer']}", arg["col"] * ELEM[buffer["dtype"]], dtype)
        elif "weight" in arg:
            start = self.tensor_offsets[arg["weight"]]
            length = (self.weights.numel() - start) // ELEM[dtype] * ELEM[dtype]
            ptr = self.weights[start:start + length].view(getattr(torch, TORCH_DTYPES[dtype]))
        elif "step" in arg:
            ptr = self.step_arrays.pointer(arg["step"], 0, dtype)
        elif "kv" in arg:
            ptr = self.cache.pointer(f"{arg['kv']}{arg['layer']}", 0, dtype)
        elif "workspace" in arg:
            ptr = self.workspace.pointer(arg["workspace"], 0, dtype)
        else:
            raise EngineLoadError(f"unknown launch argument {json.dumps(arg)}; rebuild the engine")
        if ptr.data_ptr() % param["divisibility"]:
            raise BessemerError(f"{param['name']} at {ptr.data_ptr():#x} breaks the {param['divisibility']}-byte "
                                "alignment its kernel was compiled for")
        return ptr
