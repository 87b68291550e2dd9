// Build-time search of the two-level 4-bit grid's sub-block parameters
// (quantization/superblock.py): the same arithmetic as its NumPy reference, operation for
// operation, so the parameters are bit-identical.
#pragma once

#include <cstdint>

namespace bessemer {

// Sub-blocks of this many columns (superblock.SUB).
constexpr int64_t kSuperblockSub = 32;

// w: (n, k) fp32 row-major, k a multiple of kSuperblockSub; importance: (k,) fp32, already
// floored above 0 (all ones for plain weight error); factors: (num_factors,) fp64, the range
// factors tried (superblock.RANGE_FACTORS). Writes scale and minimum: (n, k / 32) fp32 each.
// Rows run in parallel on `threads` threads of its own (0: one per core; fork-safe:
// row_threads.h).
void int4_superblock_search(const float* w, int64_t n, int64_t k, const float* importance, const double* factors,
                            int64_t num_factors, float* scale, float* minimum, int64_t threads);

}  // namespace bessemer
