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

// A row's outputs are one FMA chain over k = 0..K-1: a later K block starts from the partial
// sums the previous one stored in y, the bias is added after the last.
template <int MR, int NR, bool BF16>
void ukr_avx512(const UkArgs& a) {
    __mmask16 mask[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) mask[n] = simd512::panel_mask_or_none(a.ncols - n * 16);
    __m512 acc[MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n)
            acc[r][n] = a.accumulate ? _mm512_maskz_loadu_ps(mask[n], a.y + r * a.ldy + n * 16) : _mm512_setzero_ps();
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
        if (!mask[n]) break;
        if (a.bias) {
            const __m512 b = simd512::load_bias16(a.bias + col0, mask[n]);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) acc[r][n] = _mm512_add_ps(acc[r][n], b);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(a.y + r * a.ldy + col0, mask[n], acc[r][n]);
    }
}

template <bool BF16>
struct UkTable {
    UkFn f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_avx512<MR, NR, BF16>; }
    template <int MR>
    constexpr void row() { set<MR, 1>(); set<MR, 2>(); set<MR, 3>(); set<MR, 4>(); }
    // One microkernel for every MR: a GEMV-only variant (e.g. summing even and odd k apart)
    // would give a row other bits when it is alone than inside a batch.
    constexpr UkTable() : f{} { row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>(); }
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
