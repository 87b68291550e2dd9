"""Compiles a small Triton kernel ahead of time for sm_90a and writes <out>.cubin and
<out>.json (its metadata with the parameter table the engine stores: pointers 8 bytes, i32
and fp32 4, then Triton's two scratch pointers). Run as a script in a fresh process, so
that the Triton interpreter (which some test processes turn on) is off.

    python compile_tiny_kernel.py OUT
"""
import json
import os
import sys

os.environ.pop("TRITON_INTERPRET", None)
os.environ["TRITON_DISABLE_LINE_INFO"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402


@triton.jit
def scale_rows(x_ptr, y_ptr, n_rows, scale, WIDTH: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = (cols < WIDTH) & (row < n_rows)
    x = tl.load(x_ptr + row * WIDTH + cols, mask=ok, other=0.0)
    tl.store(y_ptr + row * WIDTH + cols, x * scale, mask=ok)


signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n_rows": "i32", "scale": "fp32", "WIDTH": "constexpr", "BLOCK": "constexpr"}
src = ASTSource(fn=scale_rows, signature=signature, constexprs={"WIDTH": 96, "BLOCK": 128},
                attrs={(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]]})
ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2})
md = ck.metadata
params, offset = [], 0
for name, ty in [("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("n_rows", "i32"), ("scale", "fp32"),
                 ("global_scratch", "*u8"), ("profile_scratch", "*u8")]:
    size = 8 if ty.startswith("*") else 4
    offset = -(-offset // size) * size
    params.append({"name": name, "type": ty, "offset": offset, "size": size,
                   "divisibility": 16 if name in ("x_ptr", "y_ptr") else 1})
    offset += size
meta = {"entry": md.name, "num_warps": md.num_warps, "num_ctas": md.num_ctas, "shared": md.shared,
        "global_scratch_size": md.global_scratch_size, "profile_scratch_size": md.profile_scratch_size,
        "launch_pdl": bool(md.launch_pdl), "launch_cooperative_grid": bool(md.launch_cooperative_grid),
        "params": params}
out = sys.argv[1]
open(out + ".cubin", "wb").write(ck.asm["cubin"])
json.dump(meta, open(out + ".json", "w"))
