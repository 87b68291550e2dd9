// attention@1, AVX-512 inner loops of the decode path (see attention.cpp's attend_dec):
// the scores of 8 keys for every head and the P.V accumulation, 16 lanes at a time, for
// every cache kind (fp32, bf16, int8 and E4M3 codes converted in registers, as kv_codec.h).
// Used when head_dim is a multiple of 16. Compiled for AVX-512 by the pragma below and only
// called when the CPU has it; like linear_avx512.cpp it includes no C++ standard library
// header (an inline library function instantiated here could be picked by the linker for
// callers elsewhere).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"  // _mm512_extractf32x8_ps: the header's undefined vector

#include <immintrin.h>
#include <stdint.h>

#include "attention_avx512.h"

namespace bessemer {

namespace {

// 16 elements at off as fp32 (one-byte kinds unscaled; fp8 2^-8 times the E4M3 value).
template <int KV>
inline __m512 load16(const void* base, int64_t off) {
    if (KV == 1) {  // bf16
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + off));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
    } else if (KV == 2) {  // int8
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + off));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    } else if (KV == 3) {  // E4M3 -> fp16 bits -> fp32
        const __m256i w = _mm256_cvtepu8_epi16(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + off)));
        const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)), 7),
                                          _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8));
        return _mm512_cvtph_ps(h);
    } else {
        return _mm512_loadu_ps(static_cast<const float*>(base) + off);
    }
}

// The query heads of one KV head are done GC (<= 3) at a time, so that each K element is
// loaded and converted once for all of them (GC x 8 accumulators + GC query vectors fit the
// 32 registers); the sums run in the same order as one head at a time, so the scores are
// the same bits.
template <int KV, int GC>
inline void scores8_heads(const void* Kc, const int64_t* ko, int64_t kbase, const float* q, int D, __m256 mul,
                          float* sc, int64_t ncap) {
    __m512 x[GC][8];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) x[g][u] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 16) {
        __m512 qv[GC];
#pragma GCC unroll 3
        for (int g = 0; g < GC; ++g) qv[g] = _mm512_loadu_ps(q + int64_t(g) * D + d);
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u) {
            const __m512 kv = load16<KV>(Kc, ko[u] + kbase + d);
#pragma GCC unroll 3
            for (int g = 0; g < GC; ++g) x[g][u] = _mm512_fmadd_ps(qv[g], kv, x[g][u]);
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g) {
        __m256 y[8];
#pragma GCC unroll 8
        for (int u = 0; u < 8; ++u)
            y[u] = _mm256_add_ps(_mm512_castps512_ps256(x[g][u]), _mm512_extractf32x8_ps(x[g][u], 1));
        const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(y[0], y[1]), _mm256_hadd_ps(y[2], y[3]));
        const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(y[4], y[5]), _mm256_hadd_ps(y[6], y[7]));
        const __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
        _mm256_storeu_ps(sc + g * ncap, _mm256_mul_ps(v, mul));
    }
}

template <int KV>
void scores8(const void* Kc, const int64_t* ko, const float* q, int H, int Hkv, int D,
             const float* kmul, float* sc, int64_t ncap) {
    const int G = H / Hkv;
    for (int kvh = 0; kvh < Hkv; ++kvh) {
        const int64_t kbase = int64_t(kvh) * D;
        const __m256 mul = _mm256_loadu_ps(kmul + kvh * 8);
        for (int g0 = 0; g0 < G; g0 += 3) {
            const int h = kvh * G + g0;
            const float* qr = q + int64_t(h) * D;
            switch (G - g0 >= 3 ? 3 : G - g0) {
                case 3: scores8_heads<KV, 3>(Kc, ko, kbase, qr, D, mul, sc + h * ncap, ncap); break;
                case 2: scores8_heads<KV, 2>(Kc, ko, kbase, qr, D, mul, sc + h * ncap, ncap); break;
                default: scores8_heads<KV, 1>(Kc, ko, kbase, qr, D, mul, sc + h * ncap, ncap); break;
            }
        }
    }
}

// acc[g][dc ..] += sum_i w[g][i] * V[voff[i] + dc ..] for GC heads of one KV head (w rows
// wstride apart, acc rows astride apart): each V element is converted once for all GC
// heads; per head the sum over i runs in the same order as alone.
template <int KV, int NV, int GC>
inline void pv_accum16(const void* Vc, const int64_t* voff, int n, const float* w, int64_t wstride, int dc,
                       float* acc, int64_t astride) {
    __m512 a[GC][NV];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[g][v] = _mm512_loadu_ps(acc + g * astride + dc + 16 * v);
    for (int i = 0; i < n; ++i) {
        __m512 wv[GC];
#pragma GCC unroll 3
        for (int g = 0; g < GC; ++g) wv[g] = _mm512_set1_ps(w[g * wstride + i]);
        const int64_t off = voff[i] + dc;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) {
            const __m512 x = load16<KV>(Vc, off + 16 * v);
#pragma GCC unroll 3
            for (int g = 0; g < GC; ++g) a[g][v] = _mm512_fmadd_ps(wv[g], x, a[g][v]);
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + g * astride + dc + 16 * v, a[g][v]);
}

// d chunks of at most 128 (GC x 8 accumulators <= 24 registers).
template <int KV, int GC>
void pv_heads(const void* Vc, const int64_t* voff, int n, const float* w, int64_t wstride, int D, float* acc) {
    int dc = 0;
    for (; dc + 128 <= D; dc += 128) pv_accum16<KV, 8, GC>(Vc, voff, n, w, wstride, dc, acc, D);
    switch ((D - dc) / 16) {
        case 7: pv_accum16<KV, 7, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 6: pv_accum16<KV, 6, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 5: pv_accum16<KV, 5, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 4: pv_accum16<KV, 4, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 3: pv_accum16<KV, 3, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 2: pv_accum16<KV, 2, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        case 1: pv_accum16<KV, 1, GC>(Vc, voff, n, w, wstride, dc, acc, D); break;
        default: break;
    }
}

template <int KV>
void pv(const void* Vc, const int64_t* voff, int n, const float* w, int64_t wstride, int heads, int D, float* acc) {
    for (int g0 = 0; g0 < heads; g0 += 3) {
        const float* wg = w + g0 * wstride;
        float* ag = acc + int64_t(g0) * D;
        switch (heads - g0 >= 3 ? 3 : heads - g0) {
            case 3: pv_heads<KV, 3>(Vc, voff, n, wg, wstride, D, ag); break;
            case 2: pv_heads<KV, 2>(Vc, voff, n, wg, wstride, D, ag); break;
            default: pv_heads<KV, 1>(Vc, voff, n, wg, wstride, D, ag); break;
        }
    }
}

}  // namespace

void attn_dec_scores8_avx512(int kind, const void* Kc, const int64_t* ko, const float* q, int H, int Hkv, int D,
                             const float* kmul, float* sc, int64_t ncap) {
    switch (kind) {
        case 1: scores8<1>(Kc, ko, q, H, Hkv, D, kmul, sc, ncap); break;
        case 2: scores8<2>(Kc, ko, q, H, Hkv, D, kmul, sc, ncap); break;
        case 3: scores8<3>(Kc, ko, q, H, Hkv, D, kmul, sc, ncap); break;
        default: scores8<0>(Kc, ko, q, H, Hkv, D, kmul, sc, ncap); break;
    }
}

void attn_dec_pv_avx512(int kind, const void* Vc, const int64_t* voff, int n, const float* w, int64_t wstride,
                        int heads, int D, float* acc) {
    switch (kind) {
        case 1: pv<1>(Vc, voff, n, w, wstride, heads, D, acc); break;
        case 2: pv<2>(Vc, voff, n, w, wstride, heads, D, acc); break;
        case 3: pv<3>(Vc, voff, n, w, wstride, heads, D, acc); break;
        default: pv<0>(Vc, voff, n, w, wstride, heads, D, acc); break;
    }
}

}  // namespace bessemer
