// attention@1's one merge: a key block's partial (max mb, sum of exps lb, unnormalised P.V
// ob) into a query's running state (m, l, o), in block order. The tiles (16 queries in the
// lanes), the decode rows (over head_dim) and the merge pass after a decode row's blocks ran
// on several threads (over head_dim) all use these roundings, so a query's result does not
// depend on which of them served it:
//   mn = max(m, mb), a = exp(m - mn), b = exp(mb - mn)   (exp256 / exp_scalar: one polynomial)
//   l <- fma(lb, b, l * a), o <- fma(ob, b, o * a), m <- mn
// The state starts at (kNoMax, 0, 0): merging the first block gives it exactly (a * 0 = 0,
// b = exp(0) = 1).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "simd_avx2.h"

namespace bessemer {
namespace attn {

constexpr float kNoMax = -1e30f;  // the running max before the first block (and a block's start)

// One query (one head of one row): o[D] and its (m, l) take the block's partial.
inline void merge_partial(float& m, float& l, float* o, float mb, float lb, const float* ob, int D) {
    const float mn = std::max(m, mb);
    const float a = simd::exp_scalar(m - mn), b = simd::exp_scalar(mb - mn);
    l = std::fma(lb, b, l * a);
    const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
    int d = 0;
    for (; d + 8 <= D; d += 8)
        _mm256_storeu_ps(o + d, _mm256_fmadd_ps(_mm256_loadu_ps(ob + d), vb, _mm256_mul_ps(_mm256_loadu_ps(o + d), va)));
    for (; d < D; ++d) o[d] = std::fma(ob[d], b, o[d] * a);
    m = mn;
}

}  // namespace attn
}  // namespace bessemer
