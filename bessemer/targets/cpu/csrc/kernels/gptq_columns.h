// GPTQ's column loop inside one block of columns (quantization/gptq.py): each column rounded
// to its grid, its error spread over the block's later columns. The same fp32 operations as
// the NumPy reference (gptq.gptq_columns_reference), so the codes are bit-identical.
#pragma once

#include <cstdint>

namespace bessemer {

// The grid a column's values are rounded to, per output row n of original column j:
//   int4: q = clip(rint((w - offset[g, n]) / divisor[g, n]), 0, 15) * scale[g, n] + offset[g, n],
//         g = j / group; scale, offset, divisor (K / group, n) fp32 row-major
//   e4m3: q = e4m3(clip(w / scale[n], -448, 448)) * scale[n] (round to nearest even); scale (n,)
struct GptqGrid {
    enum Kind { kInt4, kE4m3 } kind;
    const float* scale;
    const float* offset;   // int4 only
    const float* divisor;  // int4 only
    int64_t group;         // int4 only
};

// One block of b columns of a transposed weight, n outputs each:
//   wt: (b, n) fp32 row-major, the block's rows of W^T, updated in place (as the reference's
//       W1 view); hinv: the block's (b, b) corner of the upper inverse-Hessian factor, row
//       stride ldh; cols: (b,) original column index of each (act-order permutes them).
// Writes qt: (b, n) the chosen grid values; err: (n, b) each column's scaled rounding error
// (the block update's left operand). Output rows run in parallel (threads 0: one per core);
// a row's result depends only on that row.
void gptq_block_columns(float* wt, int64_t b, int64_t n, const float* hinv, int64_t ldh, const int64_t* cols,
                        const GptqGrid& grid, float* qt, float* err, int64_t threads);

}  // namespace bessemer
