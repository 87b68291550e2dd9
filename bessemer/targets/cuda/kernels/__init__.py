"""Triton kernels of the cuda target, one module per op family.

Conventions shared by every kernel (the cuda plan relies on them, see targets/cuda/plan.py):
- Activations are bf16 or fp16 (the pointer's element type); every load is converted to
  fp32 before arithmetic and every accumulation is fp32. (This is also what keeps the
  Triton interpreter exact: it cannot do bf16 arithmetic.)
- Sizes known when the engine is built (widths, row strides, head counts, tile sizes) are
  constexprs; only per-step counts (rows, sequences) are runtime i32 parameters, so one
  compiled kernel serves every step.
- Row strides are in elements; a matrix view is (pointer to its first column, row stride).
- The paged KV cache of one layer is [num_blocks, block_size, num_kv_heads, head_dim]:
  element (slot, h, d) lives at (slot * num_kv_heads + h) * head_dim + d, where the slot
  of position p of sequence s is block_tables[s, p // block_size] * block_size + p % block_size.
  With one-byte codes (--kv-cache-dtype int8 | fp8: KV_CODES 1 | 2) a block is its codes
  [block_size, num_kv_heads, head_dim] (bytes) followed by their float32 scales
  [block_size, num_kv_heads]: block b starts at byte b * block_size * num_kv_heads *
  (head_dim + 4), and the kernels read the scales through a float32 pointer to the same
  region (head_dim a multiple of 4 keeps them aligned). Keeping a block's scales beside its
  codes lets the cache stay one region per layer and K/V, sized as format/kv.py counts it.
- Bits the GPU must share with a NumPy reference (one-byte KV codes and their scales,
  quantization/kv_cache.py; fp8 activation codes, quantization/fp8.py): a quotient that is
  rounded to a code or stored is tl.math.div_rn (fp32 `/` compiles to the approximate
  div.full.f32), and a kernel that multiplies then adds on the way to a code is listed in
  UNFUSED_KERNELS, compiled without contracting a * b + c into one FMA (NumPy rounds the
  product first). The interpreter computes what such a kernel computes on the GPU, so its
  tests check the GPU's bits; elsewhere (exp2, rsqrt, sin/cos, `/`, FMA) the GPU differs
  from NumPy by rounding, and the tests hold those kernels to stated tolerances.
"""

# (kernel module, function) compiled with enable_fp_fusion=False (compile_worker.py): the
# int8 codes are rint(x * inv) through a magic-number add, which an FMA would compute from
# the unrounded product
UNFUSED_KERNELS = frozenset({("rope", "rope_kv_write_kernel"), ("rope", "kv_write_kernel")})


def fp_fusion(module: str, function: str) -> bool:
    """Whether kernel `function` of `module` (a full or a kernels-relative module name) may
    contract multiply-adds into FMA."""
    return (module.rsplit(".", 1)[-1], function) not in UNFUSED_KERNELS
