// AVX2/FMA helpers (the baseline ISA of the cpu target). Header-only, static inline.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace bessemer {
namespace simd {

static inline float hsum256(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, lo);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

static inline float hmax256(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

// 8 bf16 (uint16 bit patterns) -> 8 fp32.
static inline __m256 load_bf16x8(const uint16_t* p) {
    __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (matches engine_format.to_bfloat16_bits).
static inline uint16_t f32_to_bf16(float f) {
    if (std::isnan(f)) return 0x7FC0;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

// exp(x) for fp32 lanes (Cephes polynomial, ~1-2 ulp); inputs clamped to [-87.3, 88].
static inline __m256 exp256(__m256 x) {
    const __m256 hi = _mm256_set1_ps(88.0f), lo = _mm256_set1_ps(-87.33654f);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, r2, r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
    e = _mm256_slli_epi32(e, 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// Scalar twin of exp256 for tails (same polynomial, so results agree lane for lane).
static inline float exp_scalar(float x) {
    __m256 v = exp256(_mm256_set1_ps(x));
    return _mm256_cvtss_f32(v);
}

// Mask of the first n (0..8) lanes for maskload/maskstore.
static inline __m256i tail_mask8(int n) {
    alignas(32) static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 8 - n));
}

// The store epilogue of the AVX2 linear kernels: one row's 16 finished outputs of a panel
// (v0: columns 0-7, v1: 8-15), plus bias (at the panel's first column) when given. (A later
// K block does not add to y here: it starts its accumulators from y, load_partial16.) The
// quantized AVX2 kernels (w8a16/w4a16, fp8, w8a8) keep their epilogue inline: it multiplies
// by the scales just before these adds and the compiler fuses that multiply with the first
// add (-ffp-contract=fast, GCC's default), so routing it through finished values here would
// change the last bit of their outputs.
static inline void store_row16(float* yp, __m256 v0, __m256 v1, const float* bias) {
    if (bias) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + 8));
    }
    _mm256_storeu_ps(yp, v0);
    _mm256_storeu_ps(yp + 8, v1);
}

// A K block's partial sums of one row of a panel (its first nc > 0 columns) through y: a
// later block loads them as its starting accumulators (columns past nc as 0), so the K
// blocking does not change a row's FMA chain. v0: columns 0-7, v1: 8-15.
static inline void load_partial16(const float* yp, int nc, __m256& v0, __m256& v1) {
    if (nc >= 16) {
        v0 = _mm256_loadu_ps(yp);
        v1 = _mm256_loadu_ps(yp + 8);
        return;
    }
    alignas(32) float t[16] = {};
    for (int j = 0; j < nc; ++j) t[j] = yp[j];
    v0 = _mm256_load_ps(t);
    v1 = _mm256_load_ps(t + 8);
}

static inline void store_partial16(float* yp, int nc, __m256 v0, __m256 v1) {
    if (nc >= 16) {
        _mm256_storeu_ps(yp, v0);
        _mm256_storeu_ps(yp + 8, v1);
        return;
    }
    alignas(32) float t[16];
    _mm256_store_ps(t, v0);
    _mm256_store_ps(t + 8, v1);
    for (int j = 0; j < nc; ++j) yp[j] = t[j];
}

// The same for the last panel's first nc < 16 columns, from finished values v[0..nc).
static inline void store_row_tail(float* yp, const float* v, int nc, const float* bias) {
    for (int j = 0; j < nc; ++j) yp[j] = bias ? v[j] + bias[j] : v[j];
}

// A group's weights decoded once into fp32 (PanelPredecode, linear_driver.h): panel n's 16
// weights at k at wdec + (n * kc + k) * 16. store_decoded_panels writes nr panels over kc k,
// decode16(n, k, w0, w1) giving each 16 (the microkernel's own decode, so the same bits);
// load_decoded16 reads them back.
template <class Decode16>
static inline void store_decoded_panels(int nr, int kc, float* wdec, Decode16 decode16) {
    for (int n = 0; n < nr; ++n)
        for (int k = 0; k < kc; ++k) {
            __m256 w0, w1;
            decode16(n, k, w0, w1);
            float* d = wdec + (int64_t(n) * kc + k) * 16;
            _mm256_storeu_ps(d, w0);
            _mm256_storeu_ps(d + 8, w1);
        }
}

static inline void load_decoded16(const float* wdec, int kc, int n, int k, __m256& w0, __m256& w1) {
    const float* d = wdec + (int64_t(n) * kc + k) * 16;
    w0 = _mm256_loadu_ps(d);
    w1 = _mm256_loadu_ps(d + 8);
}

}  // namespace simd
}  // namespace bessemer
