// Build-time fake quantization on the 4-bit grid (quantization/awq.py): w -> dequantize(quantize(w))
// on the grid scale_search.int4_grid(search=False) gives, with AWQ's per-input-channel scaling
// around it, the same arithmetic as its NumPy reference, operation for operation.
#pragma once

#include <cstdint>

namespace bessemer {

// w: (n, k) fp32 row-major, k % group == 0; col_scale: (k,) fp32 or nullptr (then 1).
// Writes out (n, k) fp32: each group of v = w * col_scale quantized on its grid (zero_point:
// min/max, scale and offset stored; else symmetric, scale v / -8 of the weight of largest
// magnitude), dequantized, then divided by col_scale. Rows run on `threads` threads (0: one
// per core; threads of its own, fork-safe).
void int4_fake_quant(const float* w, int64_t n, int64_t k, int64_t group, bool zero_point, const float* col_scale,
                     float* out, int64_t threads);

}  // namespace bessemer
