// AVX-512 helpers of the linear kernels: the store epilogue every one of them ends with.
// Included only by files compiled for AVX-512 (after their `#pragma GCC target`); like
// them it uses no C++ standard library.
#pragma once

#include <immintrin.h>

namespace bessemer {
namespace simd512 {

// The lanes of a panel whose first nc (> 0) columns are valid.
static inline __mmask16 panel_mask(int nc) { return nc >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nc) - 1u); }

// The same, or no lanes when nc <= 0 (a panel past the valid columns).
static inline __mmask16 panel_mask_or_none(int nc) { return nc > 0 ? panel_mask(nc) : __mmask16(0); }

// The panel's bias (at its first column) or zeros.
static inline __m512 load_bias16(const float* bias, __mmask16 m) {
    return bias ? _mm512_maskz_loadu_ps(m, bias) : _mm512_setzero_ps();
}

// The store epilogue of every AVX-512 linear kernel: one row's finished (masked) outputs of
// a panel, plus y when accumulate.
static inline void store_row16(float* yp, __mmask16 m, __m512 v, bool accumulate) {
    if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, yp));
    _mm512_mask_storeu_ps(yp, m, v);
}

}  // namespace simd512
}  // namespace bessemer
