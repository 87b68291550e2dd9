// linear@1, AVX-512 implementation (see linear.cpp for the blocking scheme).
// Compiled for AVX-512 by the pragma below and only called when the CPU has it. This file
// deliberately includes no C++ standard library headers: an inline library function
// instantiated here would be compiled for AVX-512 and could be picked by the linker for
// callers elsewhere.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 reports a false positive inside avx512fintrin.h (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_driver.h"
#include "simd_avx512.h"

namespace bessemer {

void linear_avx512(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                   const float* bias, float* y, int64_t ldy, int nthreads);

namespace {

constexpr int kMR = 6;  // rows per microkernel
constexpr int kNR = 4;  // panels (16 outputs each) per microkernel

template <bool BF16>
inline __m512 load_w(const char* base, int k) {
    if (BF16) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base) + k);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    } else {
        return _mm512_loadu_ps(reinterpret_cast<const float*>(base) + k * 16);
    }
}

template <int MR, int NR, bool BF16>
void ukr_avx512(const UkArgs& a) {
    __m512 acc[MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_ps();
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    for (int k = 0; k < a.kc; ++k) {
        __m512 wv[NR];
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) wv[n] = load_w<BF16>(wp[n], k);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512 xb = _mm512_set1_ps(xr[r][k]);
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_fmadd_ps(xb, wv[n], acc[r][n]);
        }
    }
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16;
        const int nc = a.ncols - col0;
        if (nc <= 0) break;
        const __mmask16 mask = simd512::panel_mask(nc);
        const __m512 b = simd512::load_bias16(a.bias ? a.bias + col0 : nullptr, mask);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
            simd512::store_row16(a.y + r * a.ldy + col0, mask, _mm512_add_ps(acc[r][n], b), a.accumulate);
    }
}

// bf16 GEMV microkernel (MR <= 2): one 64-byte load covers rows k and k+1 of a panel
// (32 bf16 = 16 u32 lanes holding columns (2i, 2i+1) of row k in lanes 0-7 and of row k+1
// in lanes 8-15). A shift gives the even columns, a mask the odd ones: two cheap in-lane
// ops per 32 weights instead of two cross-lane widenings. x is broadcast as
// [x_k x8, x_k+1 x8]; the halves are summed and re-interleaved once at the end.
template <int MR, int NR>
void ukr_avx512_bf16_pair(const UkArgs& a) {
    __m512 ae[MR][NR], ao[MR][NR];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) ae[r][n] = ao[r][n] = _mm512_setzero_ps();
    const float* xr[MR];
#pragma GCC unroll 2
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    const __m512i hi_mask = _mm512_set1_epi32(int(0xFFFF0000u));
    const int k2 = a.kc & ~1;
    for (int k = 0; k < k2; k += 2) {
        __m512 we[NR], wo[NR];
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const __m512i raw = _mm512_loadu_si512(wp[n] + k * 32);
            we[n] = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
            wo[n] = _mm512_castsi512_ps(_mm512_and_si512(raw, hi_mask));
        }
#pragma GCC unroll 2
        for (int r = 0; r < MR; ++r) {
            const __m512 xb = _mm512_insertf32x8(_mm512_set1_ps(xr[r][k]), _mm256_set1_ps(xr[r][k + 1]), 1);
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) {
                ae[r][n] = _mm512_fmadd_ps(xb, we[n], ae[r][n]);
                ao[r][n] = _mm512_fmadd_ps(xb, wo[n], ao[r][n]);
            }
        }
    }
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16;
        const int nc = a.ncols - col0;
        if (nc <= 0) break;
        const __mmask16 mask = simd512::panel_mask(nc);
        const __m512 b = simd512::load_bias16(a.bias ? a.bias + col0 : nullptr, mask);
        __m512 wl = _mm512_setzero_ps();
        if (k2 < a.kc) wl = load_w<true>(wp[n], k2);  // odd K: last row, natural order
#pragma GCC unroll 2
        for (int r = 0; r < MR; ++r) {
            const __m256 e = _mm256_add_ps(_mm512_castps512_ps256(ae[r][n]), _mm512_extractf32x8_ps(ae[r][n], 1));
            const __m256 o = _mm256_add_ps(_mm512_castps512_ps256(ao[r][n]), _mm512_extractf32x8_ps(ao[r][n], 1));
            const __m256 lo = _mm256_unpacklo_ps(e, o), hi = _mm256_unpackhi_ps(e, o);
            __m512 v = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_permute2f128_ps(lo, hi, 0x20)),
                                          _mm256_permute2f128_ps(lo, hi, 0x31), 1);
            if (k2 < a.kc) v = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][k2]), wl, v);
            simd512::store_row16(a.y + r * a.ldy + col0, mask, _mm512_add_ps(v, b), a.accumulate);
        }
    }
}

template <bool BF16>
struct UkTable {
    UkFn f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_avx512<MR, NR, BF16>; }
    template <int MR>
    constexpr void row() { set<MR, 1>(); set<MR, 2>(); set<MR, 3>(); set<MR, 4>(); }
    template <int MR>
    constexpr void pair_row() {
        f[MR * (kNR + 1) + 1] = ukr_avx512_bf16_pair<MR, 1>;
        f[MR * (kNR + 1) + 2] = ukr_avx512_bf16_pair<MR, 2>;
        f[MR * (kNR + 1) + 3] = ukr_avx512_bf16_pair<MR, 3>;
        f[MR * (kNR + 1) + 4] = ukr_avx512_bf16_pair<MR, 4>;
    }
    constexpr UkTable() : f{} {
        row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>();
        if (BF16) { pair_row<1>(); pair_row<2>(); }  // GEMV rows: cheaper bf16 unpacking
    }
};

const UkTable<false> kTableF32;
const UkTable<true> kTableBF16;

}  // namespace

void linear_avx512(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                   const float* bias, float* y, int64_t ldy, int nthreads) {
    linear_drive(x, ldx, M, w, bf16 ? 2 : 4, N, K, bias, y, ldy, nthreads, kMR, kNR,
                 bf16 ? kTableBF16.f : kTableF32.f, kNR + 1);
}

}  // namespace bessemer
