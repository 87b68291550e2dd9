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
#include "simd_avx512.h"

namespace bessemer {

void linear_w8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads);
void linear_w4_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                      const float* offsets, int group, int N, int K, const float* bias, float* y,
                      int64_t ldy, int nthreads, bool round_x);
void round_rows_to_bf16_f32(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq);

namespace {

// Microkernels: up to 8 rows x 3 panels (24 accumulators; the codes of a panel and k are
// decoded once for 8 rows, and decode GEMV up to M = 8 is one pass over the weights), or
// up to 4 rows x 4 panels (M <= 4: more independent accumulators per decoded k).
constexpr int kMR = 8;   // max rows per microkernel
constexpr int kNR = 4;   // max panels (16 outputs each) per microkernel
constexpr int kNR8 = 3;  // panels when M > 4

enum QKind { Q8 = 0, Q4 = 1 };

// int4 decode: the 8 bytes of (panel, k) are broadcast to all 8 qwords; qword L is shifted
// right by kQ4Shift[L] bits, so dword 2L holds the nibble at bit kQ4Shift[L] and dword
// 2L+1 the one at bit kQ4Shift[L] + 32 in its low 4 bits; vpermps with the table
// {0.f .. 15.f} (it reads only the low 4 bits of each index) turns them into fp32 codes.
// One shift and one shuffle per 16 weights, no widening; lanes hold the rows in the fixed
// order kQ4Rows = {0,4,1,5,2,6,3,7, 8,12,9,13,10,14,11,15}, undone once per group with
// kQ4Unperm (lane of row r).
struct Q4Consts {
    __m512i shift;
    __m512 table;
    __m512i unperm;
};

inline Q4Consts q4_consts() {
    Q4Consts c;
    c.shift = _mm512_setr_epi64(0, 8, 16, 24, 4, 12, 20, 28);
    c.table = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    c.unperm = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    return c;
}

// 16 weights of one panel at one k as fp32 (int8: rows in lane order; int4: kQ4Rows order).
template <int QK>
inline __m512 decode16(const char* p, int k, const Q4Consts& c) {
    if (QK == Q8) {
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * 16))));
    } else {
        long long b;
        __builtin_memcpy(&b, p + k * 8, 8);
        return _mm512_permutexvar_ps(_mm512_srlv_epi64(_mm512_set1_epi64(b), c.shift), c.table);
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
    constexpr int kBytes = QK == Q8 ? 16 : 8;  // weight bytes per panel and k
    Q4Consts qc;
    if (QK == Q4) qc = q4_consts();
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    const int G = QK == Q4 ? a.group : a.kc;
    const int ng = a.kc / G;
    // GEMV (a.pf_next != 0): prefetch the next panel group's codes (a.pf_next bytes ahead,
    // once per cache line) and its parameters (pq_len floats at pq_s / pq_o, pq_step per
    // cache-line step of the k loop); see UkArgs::pf_next.
    constexpr int kLineK = 64 / kBytes;  // k per cache line of a panel's codes
    const int64_t pq_len = a.pf_next ? (QK == Q4 ? NR * a.qpstride : NR * 16) : 0;
    const float* pq_s = a.qs + pq_len;
    const float* pq_o = QK == Q4 ? a.qo + pq_len : nullptr;
    const int64_t pq_step = (pq_len / 16 + (a.kc + kLineK - 1) / kLineK - 1) / ((a.kc + kLineK - 1) / kLineK) * 16;
    // int8 (one group, per-channel scales): a later K block starts from the unscaled partial
    // sums the previous one stored in y, and only the last block scales them and adds the
    // bias, so a row's sum is one FMA chain over k = 0..K-1 whatever the K blocking. int4:
    // each whole group is summed from zero and added to y in group order, which K blocks of
    // whole groups do not change either.
    const bool resume = QK == Q8 && a.accumulate;
    for (int g = 0; g < ng; ++g) {
        __m512 acc[MR][NR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n)
                acc[r][n] = resume ? _mm512_maskz_loadu_ps(simd512::panel_mask_or_none(a.ncols - n * 16),
                                                           a.y + r * a.ldy + n * 16)
                                   : _mm512_setzero_ps();
        const int k0 = g * G, k1 = k0 + G;
        for (int k = k0; k < k1; ++k) {
            if (a.pf_next && (k & (kLineK - 1)) == 0) {
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) _mm_prefetch(wp[n] + k * kBytes + a.pf_next, _MM_HINT_T1);
                const int64_t i0 = (k / kLineK) * pq_step, i1 = i0 + pq_step < pq_len ? i0 + pq_step : pq_len;
                for (int64_t i = i0; i < i1; i += 16) {
                    _mm_prefetch(reinterpret_cast<const char*>(pq_s + i), _MM_HINT_T0);
                    if (QK == Q4) _mm_prefetch(reinterpret_cast<const char*>(pq_o + i), _MM_HINT_T0);
                }
            }
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
        const bool load_y = QK == Q4 && (g > 0 || a.accumulate);
        const float* bias = g == ng - 1 ? a.bias : nullptr;
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int col0 = n * 16;
            const int nc = a.ncols - col0;
            if (nc <= 0) break;
            const __mmask16 mask = simd512::panel_mask(nc);
            if (QK == Q8 && !a.last) {  // partial sums, finished by the last K block
#pragma GCC unroll 8
                for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(a.y + r * a.ldy + col0, mask, acc[r][n]);
                continue;
            }
            __m512 s, o = _mm512_setzero_ps();
            if (QK == Q4) {  // panel16 params: padded to whole panels
                s = _mm512_loadu_ps(a.qs + n * a.qpstride + g * 16);
                o = _mm512_loadu_ps(a.qo + n * a.qpstride + g * 16);
            } else {
                s = _mm512_maskz_loadu_ps(mask, a.qs + col0);
            }
            const __m512 b = simd512::load_bias16(bias ? bias + col0 : nullptr, mask);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                __m512 v = QK == Q4 ? _mm512_fmadd_ps(o, _mm512_set1_ps(sx[r]), b) : b;
                const __m512 d = QK == Q4 ? _mm512_permutexvar_ps(qc.unperm, acc[r][n]) : acc[r][n];
                simd512::store_row16(a.y + r * a.ldy + col0, mask, _mm512_fmadd_ps(d, s, v), load_y);
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
    constexpr void row() { set<MR, 1>(); set<MR, 2>(); set<MR, 3>(); if (MR <= 4) set<MR, 4>(); }
    constexpr UkTableQ() : f{} {
        row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>(); row<7>(); row<8>();
    }
};

const UkTableQ<Q8> kTableW8;
const UkTableQ<Q4> kTableW4;

}  // namespace

void linear_w8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N, int K,
                      const float* bias, float* y, int64_t ldy, int nthreads) {
    const QuantParams qp{scales, nullptr, 0};
    linear_drive_q(x, ldx, M, q, 16, N, K, bias, y, ldy, nthreads, kMR, M <= 4 ? kNR : kNR8, kTableW8.f,
                   kNR + 1, &qp);
}

void linear_w4_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                      const float* offsets, int group, int N, int K, const float* bias, float* y, int64_t ldy,
                      int nthreads, bool round_x) {
    const QuantParams qp{scales, offsets, group};
    linear_drive_q(x, ldx, M, codes, 8, N, K, bias, y, ldy, nthreads, kMR, M <= 4 ? kNR : kNR8, kTableW4.f,
                   kNR + 1, &qp, round_x ? round_rows_to_bf16_f32 : nullptr, 4);
}

}  // namespace bessemer
