"""Row gathers: the token embedding and the selection of the rows whose logits are wanted.

Both copy whole rows without arithmetic, so the activation dtype passes through unchanged.
"""

import triton
import triton.language as tl


@triton.jit
def embedding_kernel(token_ids_ptr, table_ptr, out_ptr,
                     HIDDEN: tl.constexpr, OUT_STRIDE: tl.constexpr, BLOCK: tl.constexpr):
    """out[t, :] = table[token_ids[t], :]. table: [V, HIDDEN] row-major.
    Grid: (T, cdiv(HIDDEN, BLOCK))."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < HIDDEN
    token = tl.load(token_ids_ptr + row).to(tl.int64)
    x = tl.load(table_ptr + token * HIDDEN + cols, mask=mask)
    tl.store(out_ptr + row.to(tl.int64) * OUT_STRIDE + cols, x, mask=mask)


@triton.jit
def gather_rows_kernel(indices_ptr, x_ptr, out_ptr,
                       WIDTH: tl.constexpr, X_STRIDE: tl.constexpr, OUT_STRIDE: tl.constexpr,
                       BLOCK: tl.constexpr):
    """out[i, :] = x[indices[i], :]. Grid: (L, cdiv(WIDTH, BLOCK))."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    src = tl.load(indices_ptr + row).to(tl.int64)
    x = tl.load(x_ptr + src * X_STRIDE + cols, mask=mask)
    tl.store(out_ptr + row.to(tl.int64) * OUT_STRIDE + cols, x, mask=mask)
