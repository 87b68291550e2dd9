// attention@1, AVX-512 inner loops of the decode path (see attention.cpp's attend_dec):
// the scores of 8 keys for every head and the P.V accumulation, 16 lanes at a time, for
// every cache kind (fp32, bf16, int8 and E4M3 codes converted in registers, as kv_codec.h).
// Used when head_dim is a multiple of 16. Compiled for AVX-512 by the pragma below and only
// called when the CPU has it; like linear_avx512.cpp it includes no C++ standard library
// header (an inline library function instantiated here could be picked by the linker for
// callers elsewhere).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

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

template <int KV>
void scores8(const void* Kc, const int64_t* ko, const float* q, int H, int Hkv, int D,
             const float* kmul, float* sc, int64_t ncap) {
    const int G = H / Hkv;
    for (int kvh = 0; kvh < Hkv; ++kvh) {
        const int64_t kbase = int64_t(kvh) * D;
        const __m256 mul = _mm256_loadu_ps(kmul + kvh * 8);
        for (int g = 0; g < G; ++g) {
            const int h = kvh * G + g;
            const float* qr = q + int64_t(h) * D;
            __m512 x[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u) x[u] = _mm512_setzero_ps();
            for (int d = 0; d < D; d += 16) {
                const __m512 qv = _mm512_loadu_ps(qr + d);
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) x[u] = _mm512_fmadd_ps(qv, load16<KV>(Kc, ko[u] + kbase + d), x[u]);
            }
            __m256 y[8];
#pragma GCC unroll 8
            for (int u = 0; u < 8; ++u)
                y[u] = _mm256_add_ps(_mm512_castps512_ps256(x[u]), _mm512_extractf32x8_ps(x[u], 1));
            const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(y[0], y[1]), _mm256_hadd_ps(y[2], y[3]));
            const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(y[4], y[5]), _mm256_hadd_ps(y[6], y[7]));
            const __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
            _mm256_storeu_ps(sc + h * ncap, _mm256_mul_ps(v, mul));
        }
    }
}

template <int KV, int NV>
inline void pv_accum16(const void* Vc, const int64_t* voff, int n, const float* w, int dc, float* acc) {
    __m512 a[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) a[v] = _mm512_loadu_ps(acc + 16 * v);
    for (int i = 0; i < n; ++i) {
        const __m512 wv = _mm512_set1_ps(w[i]);
        const int64_t off = voff[i] + dc;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[v] = _mm512_fmadd_ps(wv, load16<KV>(Vc, off + 16 * v), a[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(acc + 16 * v, a[v]);
}

template <int KV>
void pv(const void* Vc, const int64_t* voff, int n, const float* w, int D, float* acc) {
    int dc = 0;
    for (; dc + 128 <= D; dc += 128) pv_accum16<KV, 8>(Vc, voff, n, w, dc, acc + dc);
    switch ((D - dc) / 16) {
        case 7: pv_accum16<KV, 7>(Vc, voff, n, w, dc, acc + dc); break;
        case 6: pv_accum16<KV, 6>(Vc, voff, n, w, dc, acc + dc); break;
        case 5: pv_accum16<KV, 5>(Vc, voff, n, w, dc, acc + dc); break;
        case 4: pv_accum16<KV, 4>(Vc, voff, n, w, dc, acc + dc); break;
        case 3: pv_accum16<KV, 3>(Vc, voff, n, w, dc, acc + dc); break;
        case 2: pv_accum16<KV, 2>(Vc, voff, n, w, dc, acc + dc); break;
        case 1: pv_accum16<KV, 1>(Vc, voff, n, w, dc, acc + dc); break;
        default: break;
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

void attn_dec_pv_avx512(int kind, const void* Vc, const int64_t* voff, int n, const float* w, int D, float* acc) {
    switch (kind) {
        case 1: pv<1>(Vc, voff, n, w, D, acc); break;
        case 2: pv<2>(Vc, voff, n, w, D, acc); break;
        case 3: pv<3>(Vc, voff, n, w, D, acc); break;
        default: pv<0>(Vc, voff, n, w, D, acc); break;
    }
}

}  // namespace bessemer
