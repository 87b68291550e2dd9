// Build-time search of symmetric int4 group scales (quantization/scale_search.py): the same
// arithmetic as its NumPy reference, operation for operation, so the scales are bit-identical.
#pragma once

#include <cstdint>

namespace bessemer {

// w: (n, k) fp32 row-major; importance: (k,) fp32, already floored above 0 (all ones for
// plain weight error); divisors: (num_divisors,) fp64, the divisors d of the candidate
// scales v / -d. Writes scales: (n, k / group) fp32 (bf16 values). Rows run in parallel on
// `threads` threads of its own (0: one per core; fork-safe: row_threads.h); k % group == 0.
void int4_symmetric_scale_search(const float* w, int64_t n, int64_t k, int64_t group, const float* importance,
                                 const double* divisors, int64_t num_divisors, float* scales, int64_t threads);

}  // namespace bessemer
