// linear_w8a16@1 / linear_w4a16@1, AVX-512 microkernels (see linear_quant.cpp for the math
// and linear_driver.h for the blocking scheme).
// Compiled for AVX-512 by the pragma below and only called when the CPU has it. Like
// linear_avx512.cpp this file includes no C++ standard library headers (an inline library
// function instantiated here would be compiled for AVX-512 and could be picked by the
// linker for callers elsewhere).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 reports a false positive inside avx512fintrin.h (_mm512_undefined_*).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_driver.h"

namespace bessemer {

void linear_w8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads);
void linear_w4_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                      const float* offsets, int group, int N, int K, const float* bias, float* y,
                      int64_t ldy, int nthreads);

namespace {

constexpr int kMR = 6;  // rows per microkernel
constexpr int kNR = 4;  // panels (16 outputs each) per microkernel

enum QKind { Q8 = 0, Q4 = 1 };

// Constants of the int4 decode: per-lane shift (rows 0-7: low nibble, rows 8-15: high
// nibble) and the code -> fp32 table (vpermps reads only the low 4 bits of each index,
// so the nibble needs no mask).
struct Q4Consts {
    __m512i shift;
    __m512 table;
};

// 16 weights of one panel at one k as fp32, rows in lane order.
template <int QK>
inline __m512 decode16(const char* p, int k, const Q4Consts& c) {
    if (QK == Q8) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * 16))));
    } else {
        long long b;
        __builtin_memcpy(&b, p + k * 8, 8);
        // bytes 0-7 twice -> dwords 0-15 = byte (lane & 7); lanes 8-15 shifted by 4.
        const __m512i d = _mm512_srlv_epi32(_mm512_cvtepu8_epi32(_mm_set1_epi64x(b)), c.shift);
        return _mm512_permutexvar_ps(d, c.table);
    }
}

inline float sum_avx512(const float* p, int n) {
    __m512 s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(p + i));
    if (i < n) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(__mmask16((1u << (n - i)) - 1u), p + i));
    return _mm512_reduce_add_ps(s);
}

template <int MR, int NR, int QK>
void ukr_q_avx512(const UkArgs& a) {
    Q4Consts qc;
    if (QK == Q4) {
        qc.shift = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4);
        qc.table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    }
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    const int G = QK == Q4 ? a.group : a.kc;
    const int ng = a.kc / G;
    for (int g = 0; g < ng; ++g) {
        __m512 acc[MR][NR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_ps();
        const int k0 = g * G, k1 = k0 + G;
        for (int k = k0; k < k1; ++k) {
            __m512 wv[NR];
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) wv[n] = decode16<QK>(wp[n], k, qc);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                const __m512 xb = _mm512_set1_ps(xr[r][k]);
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_fmadd_ps(xb, wv[n], acc[r][n]);
            }
        }
        float sx[MR];
        if (QK == Q4)
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) sx[r] = sum_avx512(xr[r] + k0, G);
        const bool load_y = g > 0 || a.accumulate;
        const float* bias = g == ng - 1 ? a.bias : nullptr;
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int col0 = n * 16;
            const int nc = a.ncols - col0;
            if (nc <= 0) break;
            const __mmask16 mask = nc >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << nc) - 1u);
            __m512 s, o = _mm512_setzero_ps();
            if (QK == Q4) {  // panel16 params: padded to whole panels
                s = _mm512_loadu_ps(a.qs + n * a.qpstride + g * 16);
                o = _mm512_loadu_ps(a.qo + n * a.qpstride + g * 16);
            } else {
                s = _mm512_maskz_loadu_ps(mask, a.qs + col0);
            }
            const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col0) : _mm512_setzero_ps();
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                float* yp = a.y + r * a.ldy + col0;
                __m512 v = QK == Q4 ? _mm512_fmadd_ps(o, _mm512_set1_ps(sx[r]), b) : b;
                v = _mm512_fmadd_ps(acc[r][n], s, v);
                if (load_y) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yp));
                _mm512_mask_storeu_ps(yp, mask, v);
            }
        }
    }
}

template <int QK>
struct UkTableQ {
    UkFn f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_q_avx512<MR, NR, QK>; }
    template <int MR>
    constexpr void row() { set<MR, 1>(); set<MR, 2>(); set<MR, 3>(); set<MR, 4>(); }
    constexpr UkTableQ() : f{} { row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>(); }
};

const UkTableQ<Q8> kTableW8;
const UkTableQ<Q4> kTableW4;

}  // namespace

void linear_w8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N, int K,
                      const float* bias, float* y, int64_t ldy, int nthreads) {
    const QuantParams qp{scales, nullptr, 0};
    linear_drive_q(x, ldx, M, q, 16, N, K, bias, y, ldy, nthreads, kMR, kNR, kTableW8.f, kNR + 1, &qp);
}

void linear_w4_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                      const float* offsets, int group, int N, int K, const float* bias, float* y, int64_t ldy,
                      int nthreads) {
    const QuantParams qp{scales, offsets, group};
    linear_drive_q(x, ldx, M, codes, 8, N, K, bias, y, ldy, nthreads, kMR, kNR, kTableW4.f, kNR + 1, &qp);
}

}  // namespace bessemer
