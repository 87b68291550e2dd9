// linear_w8a8@1, AVX-512 VNNI path (see linear_w8a8.cpp for the math, linear_w8a8_family.h
// for the blocking). Compiled for AVX-512 VNNI by the pragma below and only called when
// the CPU has it. No C++ standard library headers (see linear_avx512.cpp for why).
//
// vpdpbusd multiplies unsigned by signed bytes, so activations are stored shifted,
// u = xq + 128 (0..254), and sum_k u*q = sum_k xq*q + 128 * wsum[n]: the build stores
// wsum[n] = sum_k q[n, k] per output channel and the epilogue subtracts 128 * wsum. The
// 4-byte sums cannot overflow int32 for K < 2^31 / (255 * 127).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_w8a8_family.h"
#include "simd_avx512.h"

namespace bessemer {

void linear_w8a8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* ws, const int32_t* wsum,
                        const float* smooth, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads);

namespace {

constexpr int kMR = 8;  // rows per microkernel
constexpr int kNR = 2;  // panels (16 outputs, one zmm of int32 each) per microkernel

inline float hmax512(__m512 v) { return _mm512_reduce_max_ps(v); }

// Per-token int8 quantization of `rows` rows, stored as u8 = code + 128 (K..ldq: 128 = 0).
void quant_rows_avx512(const float* x, int64_t ldx, int rows, int K, int64_t ldq, const float* smooth,
                       int8_t* q, float* scale) {
    const int tail = K & 15;
    const __mmask16 tm = __mmask16((1u << tail) - 1);
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        int8_t* qr = q + r * ldq;
        __m512 vmax = _mm512_setzero_ps();
        int k = 0;
        for (; k + 16 <= K; k += 16) {
            __m512 v = _mm512_loadu_ps(xr + k);
            if (smooth) v = _mm512_mul_ps(v, _mm512_loadu_ps(smooth + k));
            vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
        }
        if (tail) {
            __m512 v = _mm512_maskz_loadu_ps(tm, xr + k);
            if (smooth) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(tm, smooth + k));
            vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
        }
        const float amax = hmax512(vmax);
        const float inv = amax > 0 ? 127.0f / amax : 0.0f;
        scale[r] = amax > 0 ? amax / 127.0f : 1.0f;
        const __m512 vinv = _mm512_set1_ps(inv);
        const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
        const __m128i off = _mm_set1_epi8(char(0x80));
        for (k = 0; k < K; k += 16) {
            const __mmask16 m = K - k >= 16 ? __mmask16(0xFFFF) : tm;
            __m512 v = _mm512_maskz_loadu_ps(m, xr + k);
            if (smooth) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, smooth + k));
            v = _mm512_min_ps(hi, _mm512_max_ps(lo, _mm512_mul_ps(v, vinv)));
            const __m128i b = _mm_xor_si128(_mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)), off);
            _mm_mask_storeu_epi8(qr + k, m, b);
        }
        for (k = K; k < ldq; ++k) qr[k] = int8_t(-128);  // u8 128 = code 0
    }
}

// acc[r][n] += sum over 4-byte k groups of row r's codes times panel n's; with PF, each
// panel's cache line at the same k of the next panel group is prefetched (W8A8Args::pf_next).
template <int MR, int NR, bool PF>
inline __attribute__((always_inline)) void dot_loop(__m512i (&acc)[MR][NR], const int32_t* const (&xr)[MR],
                                                    const char* wp, int64_t pstride, int64_t pf_next, int kq) {
    for (int kk = 0; kk < kq; ++kk) {
        __m512i wv[NR];
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) {
            const char* p = wp + n * pstride + kk * 64;
            if (PF) _mm_prefetch(p + pf_next, _MM_HINT_T1);
            wv[n] = _mm512_loadu_si512(p);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512i xb = _mm512_set1_epi32(xr[r][kk]);
#pragma GCC unroll 2
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_dpbusd_epi32(acc[r][n], xb, wv[n]);
        }
    }
}

template <int MR, int NR>
void ukr_w8a8_avx512(const W8A8Args& a) {
    __m512i acc[MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_si512();
    const int32_t* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = reinterpret_cast<const int32_t*>(a.xq + r * a.ldq);
    const char* wp = reinterpret_cast<const char*>(a.w);
    if (a.pf_next)
        dot_loop<MR, NR, true>(acc, xr, wp, a.pstride, a.pf_next, a.kq);
    else
        dot_loop<MR, NR, false>(acc, xr, wp, a.pstride, 0, a.kq);
#pragma GCC unroll 2
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16, nc = a.ncols - col0;
        if (nc <= 0) break;
        const __mmask16 m = simd512::panel_mask(nc);
        const __m512i corr = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, a.wsum + col0), 7);  // 128 * wsum
        const __m512 wsc = _mm512_maskz_loadu_ps(m, a.ws + col0);
        const __m512 b = simd512::load_bias16(a.bias ? a.bias + col0 : nullptr, m);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512 s = _mm512_mul_ps(_mm512_set1_ps(a.xs[r]), wsc);
            const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][n], corr)), s);
            simd512::store_row16(a.y + r * a.ldy + col0, m, a.bias ? _mm512_add_ps(v, b) : v, false);
        }
    }
}

struct UkTableW8A8 {
    W8A8Uk f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_w8a8_avx512<MR, NR>; }
    constexpr UkTableW8A8() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>(); set<5, 1>(); set<6, 1>(); set<7, 1>(); set<8, 1>();
        set<1, 2>(); set<2, 2>(); set<3, 2>(); set<4, 2>(); set<5, 2>(); set<6, 2>(); set<7, 2>(); set<8, 2>();
    }
};

const UkTableW8A8 kTable;

}  // namespace

void linear_w8a8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* ws, const int32_t* wsum,
                        const float* smooth, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    linear_w8a8_drive(x, ldx, M, q, ws, wsum, smooth, N, K, bias, y, ldy, nthreads, kMR, kNR, kTable.f, kNR + 1,
                      quant_rows_avx512);
}

}  // namespace bessemer
