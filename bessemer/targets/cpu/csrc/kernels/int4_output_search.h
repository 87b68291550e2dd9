// Build-time search of symmetric int4 group scales for a weight's output error on its
// calibration rows (quantization/scale_search.int4_symmetric_scales_for_inputs): the same
// candidates and selection rule as its NumPy reference (plus a refit's other bf16 neighbour
// where it lies at a rounding midpoint); the e^T M e sums run in another order, so the
// contract with the reference is on the error, not the bits (tests/test_scale_search.py).
#pragma once

#include <cstdint>

namespace bessemer {

// w: (n, k) fp32 row-major; moments: (k / group, group, group) fp32, the second moments of
// each group's input channels (scale_search.group_second_moments); plain: (n, k / group) fp32,
// the plain search's scales (the first candidate); divisors: (num_divisors,) fp64, the
// divisors d of the candidates v / -d whose codes are refitted. Writes scales:
// (n, k / group) fp32 (bf16 values). Rows run in parallel on `threads` threads of its own
// (0: one per core; fork-safe); k % group == 0.
void int4_output_error_scale_search(const float* w, int64_t n, int64_t k, int64_t group, const float* moments,
                                    const float* plain, const double* divisors, int64_t num_divisors,
                                    int64_t threads, float* scales);

}  // namespace bessemer
