// linear_w4a8@1, AVX-512 VNNI path (see linear_w4a8.cpp for the math, linear_w4a8_family.h
// for the blocking). Compiled for AVX-512 VNNI by the pragma below and only called when
// the CPU has it. No C++ standard library headers (see linear_avx512.cpp for why).
//
// One 64-byte block of panel16_int4_k8 codes is 16 rows x 8 k: masked, its low nibbles
// are the u8 operand of one vpdpbusd (16 rows x 4 k), shifted and masked its high nibbles
// another; the int8 activations are the s8 operand, each row's 4 bytes broadcast from
// memory. Per group: int32 sums (at most 15 * 127 * G in magnitude), minus 8 * sum(xq),
// converted and multiplied into fp32 accumulators once.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_w4a8_family.h"
#include "simd_avx512.h"

namespace bessemer {

void linear_w4a8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                        int K, const float* bias, float* y, int64_t ldy, int nthreads);

namespace {

constexpr int kMR = 6;  // rows per microkernel
constexpr int kNR = 2;  // panels per microkernel: 6 x 2 int32 + 6 x 2 fp32 accumulators

template <int MR, int NR>
void ukr_w4a8_avx512(const W4A8Args& a) {
    __m512 accf[MR][NR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) accf[r][n] = _mm512_setzero_ps();
    const int32_t* xr[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) xr[r] = reinterpret_cast<const int32_t*>(a.xq + r * a.ldq);
    const char* wp = reinterpret_cast<const char*>(a.w);
    const __m512i low = _mm512_set1_epi8(0x0F);
    const int nb = a.G / 8;
    for (int g = 0; g < a.ng; ++g) {
        __m512i acc[MR][NR];
#pragma GCC unroll 6
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_si512();
        for (int b = g * nb; b < (g + 1) * nb; ++b) {
            __m512i wl[NR], wh[NR];
#pragma GCC unroll 2
            for (int n = 0; n < NR; ++n) {
                const __m512i v = _mm512_loadu_si512(wp + n * a.pstride + int64_t(b) * 64);
                wl[n] = _mm512_and_si512(v, low);
                wh[n] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            }
#pragma GCC unroll 6
            for (int r = 0; r < MR; ++r) {
                const __m512i xa = _mm512_set1_epi32(xr[r][2 * b]), xb = _mm512_set1_epi32(xr[r][2 * b + 1]);
#pragma GCC unroll 2
                for (int n = 0; n < NR; ++n) {
                    acc[r][n] = _mm512_dpbusd_epi32(acc[r][n], wl[n], xa);
                    acc[r][n] = _mm512_dpbusd_epi32(acc[r][n], wh[n], xb);
                }
            }
        }
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) {
            const __m512 wsc = _mm512_loadu_ps(a.ws + n * a.qpstride + g * 16);
#pragma GCC unroll 6
            for (int r = 0; r < MR; ++r) {
                const __m512 t =
                    _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][n], _mm512_set1_epi32(a.xc[r * a.ng + g])));
                accf[r][n] = _mm512_fmadd_ps(t, _mm512_mul_ps(_mm512_set1_ps(a.xs[r * a.ng + g]), wsc), accf[r][n]);
            }
        }
    }
#pragma GCC unroll 2
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16, nc = a.ncols - col0;
        if (nc <= 0) break;
        const __mmask16 m = simd512::panel_mask(nc);
        const __m512 bv = simd512::load_bias16(a.bias ? a.bias + col0 : nullptr, m);
#pragma GCC unroll 6
        for (int r = 0; r < MR; ++r)
            simd512::store_row16(a.y + r * a.ldy + col0, m, a.bias ? _mm512_add_ps(accf[r][n], bv) : accf[r][n],
                                 false);
    }
}

struct UkTableW4A8 {
    W4A8Uk f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_w4a8_avx512<MR, NR>; }
    constexpr UkTableW4A8() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>(); set<5, 1>(); set<6, 1>();
        set<1, 2>(); set<2, 2>(); set<3, 2>(); set<4, 2>(); set<5, 2>(); set<6, 2>();
    }
};

const UkTableW4A8 kTable;

}  // namespace

void linear_w4a8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                        int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    linear_w4a8_drive(x, ldx, M, codes, scales, G, N, K, bias, y, ldy, nthreads, kMR, kNR, kTable.f, kNR + 1);
}

}  // namespace bessemer
