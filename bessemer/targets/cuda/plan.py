"""The cuda plan and the kernel section: what a cuda rank file holds besides its weights, and
everything a launcher (C++, no Python) needs to run a step. targets/cuda/interpret.py
executes exactly this on CPU through the Triton interpreter.

A cuda rank file is the ordinary container (format/container.py) with header fields::

    "target": "cuda", "gpu_arch": "sm_90a",
    "plan":    {...the cuda plan, below...},
    "kernels": [{...one entry per distinct compiled kernel, below...}]

and tensors: the weights (activation dtype [N, K] row-major for every linear and the
embedding table; float32 norms, biases and RoPE inv_freq), then one uint8 tensor
"cubin/<sha256>" per distinct cubin (the bytes of an sm_90a ELF).

Plan JSON::

    {"schema": "cuda-launch", "version": 1, "act_dtype": "bfloat16" | "float16",
     "limits": {"max_num_tokens": T_max, "max_batch_size": S_max,
                "max_blocks_per_seq": B_max, "kv_block_size": BS},
     "buffers": [{"id", "rows": "tokens" | "selected", "width", "dtype"}, ...],
     "workspace": [{"name", "dtype", "elems"}, ...],
     "step_inputs": [{"name", "dtype", "elems"}, ...],
     "kv_cache": {"num_layers", "num_kv_heads", "head_dim", "dtype", "scales" (one-byte dtypes)},
     "attention": {"tile_tokens": TILE},
     "forward": [launch, ...],      # one step: token ids in, logits out
     "sample":  [launch, ...],      # optional, after forward: sampled token ids out
     "logits": {"buffer": id, "width": V}, "vocab_size": V}

Device memory the launcher allocates (its own offsets; every base 256-byte aligned):
- buffers: each [T_max, width] of dtype, row-major (row stride = width elements), whatever
  its rows kind ("selected" buffers hold the L <= T rows of logits_indices);
- workspace: scratch arrays, elems elements each (attn_partials: the decode rows' key-block partials);
- step_inputs: the per-step arrays of step_inputs.py, capacity elems each (int32 or
  float32); "sampled_tokens" is the one the sample launches write (read back: L tokens);
- the KV cache: per layer two arrays (K, V) [num_blocks, BS, num_kv_heads, head_dim] of
  kv_cache.dtype; num_blocks is the runtime's choice, block tables index into it; with
  one-byte codes (int8, float8_e4m3; "scales": "dynamic_per_token_head_float32") each block
  is its codes followed by their fp32 scales [BS, num_kv_heads] (kernels/__init__.py);
- weights: the rank file's tensors, each at a 64-byte aligned address.

A launch is one kernel launch::

    {"node": HF module path, "op": graph op, "kernel": id, "grid": [g0, g1, g2], "args": [...]}

or, for the GEMMs, a choice by the step's row count::

    {"node", "op", "by": "tokens" | "selected",
     "cases": [{"max_rows": 16, "kernel", "grid", "args"}, ..., {"max_rows": null, ...}]}

(the first case whose max_rows >= the count; null = any). A grid dimension is an integer or
{"count": name, "per": p, "times": t} = ceil(count / p) * t, where count is one of the
step's counts (step_inputs.COUNTS: tokens, selected, seqs, prefill_tiles, decode_seqs).
A launch whose grid has a zero dimension is skipped. Block = 32 x the kernel's compiled
num_warps; dynamic shared memory = its "shared" bytes (above 48 KiB after raising the
kernel's max dynamic shared size once).

args has one entry per runtime parameter of the kernel, in its order (the kernel entry's
"params" without the two trailing scratch pointers):

    {"buffer": id, "col": c}       pointer: buffer id's base + c * element size
    {"weight": name}               pointer: that tensor's device copy
    {"step": name}                 pointer: that step-input array
    {"kv": "k" | "v", "layer": l}  pointer: layer l's K or V cache
    {"workspace": name}            pointer: that workspace array
    {"null": true}                 pointer: 0 (a parameter this instantiation never reads)
    {"i32": n} | {"f32": x}        a literal scalar (f32: its IEEE bits)
    {"count": name}                i32: that count of the step

Kernel entry (header "kernels", id = index)::

    {"id", "function", "module", "constexprs": {...}, "options": {"num_warps", "num_stages"},
     "entry": symbol in the cubin, "cubin": tensor name, "cubin_sha256", "cubin_bytes",
     "arch": "sm_90a",
     "params": [{"name", "type", "offset", "size", "divisibility"}, ...],  # + the 2 scratch ptrs
     "num_warps": compiled (block = 32 x this), "num_ctas", "shared",
     "global_scratch_size", "global_scratch_align", "profile_scratch_size", "profile_scratch_align",
     "fp_fusion": false for the kernels compiled without FMA contraction (kernels/__init__.py),
     "launch_pdl", "launch_cooperative_grid", "triton_version", "ptx_version", "ptxas_version",
     "ptxas": {"registers", "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes"},
     "tensor_core_ops": {"HGMMA": n, ...}}

Parameters are packed at their offsets (8-byte pointers, 4-byte i32/f32); the two scratch
pointers get device buffers of (size x grid programs) bytes, or NULL when the size is 0.
divisibility 16 on a pointer is a promise the kernel was compiled on: the launcher checks
it. The rows of a GEMM's M come from the launch's count, never from the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from bessemer.targets.cuda.compile import KernelSpec

SCHEMA, VERSION = "cuda-launch", 1


@dataclass(frozen=True)
class Launch:
    node: str
    op: str
    kernel: KernelSpec
    grid: tuple  # 3 dims: int, or (count name, per, times)
    args: tuple  # one arg dict per runtime parameter of kernel

    def to_json(self, ids: dict) -> dict:
        return {"kernel": ids[self.kernel], "grid": [_grid_json(g) for g in self.grid],
                "args": [dict(a) for a in self.args]}


@dataclass(frozen=True)
class RowSwitch:
    """Kernels chosen by the step's row count: cases of (max_rows or None, Launch)."""

    node: str
    op: str
    by: str
    cases: tuple

    def launches(self) -> list[Launch]:
        return [launch for _, launch in self.cases]


def _grid_json(g):
    if isinstance(g, int):
        return g
    count, per, times = g
    return {"count": count, "per": per, "times": times}


@dataclass(frozen=True)
class CudaPlan:
    act_dtype: str
    limits: dict
    buffers: tuple  # dicts {"id", "rows", "width", "dtype"}
    workspace: tuple  # dicts {"name", "dtype", "elems"}
    step_inputs: tuple  # dicts {"name", "dtype", "elems"}
    kv_cache: dict
    attention: dict
    forward: tuple  # Launch | RowSwitch
    sample: tuple  # Launch
    logits: dict
    vocab_size: int

    @property
    def steps(self) -> tuple:
        return self.forward

    def all_launches(self) -> list[Launch]:
        out = []
        for item in self.forward + self.sample:
            out.extend(item.launches() if isinstance(item, RowSwitch) else [item])
        return out

    def kernel_specs(self) -> list[KernelSpec]:
        """Distinct kernels in order of first use: their ids in the engine."""
        return list(dict.fromkeys(launch.kernel for launch in self.all_launches()))

    def kernels(self) -> list[str]:
        return sorted({spec.function for spec in self.kernel_specs()})

    def to_json(self, ids: dict | None = None) -> dict:
        ids = ids or {spec: i for i, spec in enumerate(self.kernel_specs())}

        def launch_json(item) -> dict:
            head = {"node": item.node, "op": item.op}
            if isinstance(item, RowSwitch):
                return dict(head, by=item.by, cases=[dict(launch.to_json(ids), max_rows=m) for m, launch in item.cases])
            return dict(head, **item.to_json(ids))

        return {"schema": SCHEMA, "version": VERSION, "act_dtype": self.act_dtype, "limits": dict(self.limits),
                "buffers": [dict(b) for b in self.buffers], "workspace": [dict(w) for w in self.workspace],
                "step_inputs": [dict(s) for s in self.step_inputs], "kv_cache": dict(self.kv_cache),
                "attention": dict(self.attention), "forward": [launch_json(x) for x in self.forward],
                "sample": [launch_json(x) for x in self.sample], "logits": dict(self.logits),
                "vocab_size": self.vocab_size}


def kernel_entry(kernel_id: int, spec: KernelSpec, metadata: dict, arch: str) -> dict:
    """The header's entry for one compiled kernel (see the module docstring)."""
    return dict(metadata, id=kernel_id, function=spec.function, module=spec.module,
                constexprs=dict(spec.constexprs),
                options={"num_warps": spec.num_warps, "num_stages": spec.num_stages},
                cubin=f"cubin/{metadata['cubin_sha256']}", arch=arch, params=spec.param_table())
