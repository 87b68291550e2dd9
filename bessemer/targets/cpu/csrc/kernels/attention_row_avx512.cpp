// attention@1, AVX-512 inner loops of the decode-row path (attention.cpp's row_block): the
// scores of a block's keys (16 keys per register) and its P.V (16 output dims per register,
// V converted from the cache in registers: kv_codec.h's kinds) for the G query heads of one
// KV head, up to 3 heads at a time so that each K/V element loaded serves all of them; with
// an fp32 or bf16 cache the scores read the keys from the cache, transposed in registers.
// The sums run in the same order as the AVX2 loops (one FMA chain per score over d, one per
// output over the keys), so both give the same bits.
// Compiled for AVX-512 by the pragma below and only called when the CPU has it; like
// linear_avx512.cpp it includes no C++ standard library header (an inline library function
// instantiated here could be picked by the linker for callers elsewhere).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // the conversions' undefined upper parts (intrinsics headers)

#include <immintrin.h>
#include <stdint.h>

#include "attention_blocks.h"

namespace bessemer {

namespace {

// 16 cache elements at element offset off as fp32 (one-byte kinds unscaled, fp8 2^-8 times
// the E4M3 value: kv_codec.h's load8 values, all exact conversions).
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

// Scores straight from an fp32 or bf16 cache (no transposed copy of the block: half the L1
// footprint, no stores): 16 bytes of 16 key rows at a time are transposed in registers and
// feed the FMAs at once. Register a[r]'s 128-bit lane l takes key 4l + r's bytes (a masked
// broadcast from memory: a load, no shuffle), then one in-lane 4x4 transpose of 32-bit words
// leaves in b[w] the 16 keys' word w of those bytes, in key order. A bf16 word holds elements
// 2w and 2w + 1, whose fp32 values are its low half shifted up and its high half masked
// (kv_codec.h's conversion, exact). Each score is still one FMA chain over d in order.
// Keys past nk repeat key nk - 1 (their scores are not used).
template <int KV, int GC, int NG>
void scores_from_cache(const float* qs, int D, const void* kc, const int64_t* koff, int nk, float* sg) {
    constexpr int kElemBytes = KV == 1 ? 2 : 4;
    constexpr int kPieceElems = 16 / kElemBytes;  // elements per 16 bytes of a row
    const char* row[16 * NG];
    for (int u = 0; u < 16 * NG; ++u)
        row[u] = static_cast<const char*>(kc) + koff[u < nk ? u : nk - 1] * kElemBytes;
    __m512 acc[GC][NG];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) acc[g][k] = _mm512_setzero_ps();
    const __m512i high_half = _mm512_set1_epi32(int32_t(0xFFFF0000u));
    for (int e0 = 0; e0 < D; e0 += kPieceElems) {
        const int64_t byte0 = int64_t(e0) * kElemBytes;
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) {
            const char* const* rk = row + 16 * k;
            __m512i a[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; ++r) {
                a[r] = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rk[r] + byte0)));
#pragma GCC unroll 3
                for (int l = 1; l < 4; ++l)
                    a[r] = _mm512_mask_broadcast_i32x4(
                        a[r], __mmask16(0xF << (4 * l)),
                        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rk[4 * l + r] + byte0)));
            }
            const __m512i t0 = _mm512_unpacklo_epi32(a[0], a[1]), t1 = _mm512_unpackhi_epi32(a[0], a[1]);
            const __m512i t2 = _mm512_unpacklo_epi32(a[2], a[3]), t3 = _mm512_unpackhi_epi32(a[2], a[3]);
            const __m512i b[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                                  _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
#pragma GCC unroll 4
            for (int w = 0; w < 4; ++w) {
                if (KV == 1) {
                    const int d = e0 + 2 * w;
                    const __m512 x0 = _mm512_castsi512_ps(_mm512_slli_epi32(b[w], 16));
                    const __m512 x1 = _mm512_castsi512_ps(_mm512_and_si512(b[w], high_half));
#pragma GCC unroll 3
                    for (int g = 0; g < GC; ++g)
                        acc[g][k] = _mm512_fmadd_ps(_mm512_set1_ps(qs[g * D + d]), x0, acc[g][k]);
#pragma GCC unroll 3
                    for (int g = 0; g < GC; ++g)
                        acc[g][k] = _mm512_fmadd_ps(_mm512_set1_ps(qs[g * D + d + 1]), x1, acc[g][k]);
                } else {
                    const int d = e0 + w;
                    const __m512 x = _mm512_castsi512_ps(b[w]);
#pragma GCC unroll 3
                    for (int g = 0; g < GC; ++g)
                        acc[g][k] = _mm512_fmadd_ps(_mm512_set1_ps(qs[g * D + d]), x, acc[g][k]);
                }
            }
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) _mm512_storeu_ps(sg + g * kKB + 16 * k, acc[g][k]);
}

template <int KV, int GC>
void scores_from_cache_groups(const float* qs, int D, const void* kc, const int64_t* koff, int nk, float* sg) {
    switch ((nk + 15) / 16) {
        case 4: scores_from_cache<KV, GC, 4>(qs, D, kc, koff, nk, sg); break;
        case 3: scores_from_cache<KV, GC, 3>(qs, D, kc, koff, nk, sg); break;
        case 2: scores_from_cache<KV, GC, 2>(qs, D, kc, koff, nk, sg); break;
        default: scores_from_cache<KV, GC, 1>(qs, D, kc, koff, nk, sg); break;
    }
}

template <int KV>
void scores_from_cache_heads(const float* qs, int G, int D, const void* kc, const int64_t* koff, int nk, float* sg) {
    for (int g0 = 0; g0 < G; g0 += 3) {
        const float* q = qs + g0 * D;
        float* s = sg + g0 * kKB;
        switch (G - g0 >= 3 ? 3 : G - g0) {
            case 3: scores_from_cache_groups<KV, 3>(q, D, kc, koff, nk, s); break;
            case 2: scores_from_cache_groups<KV, 2>(q, D, kc, koff, nk, s); break;
            default: scores_from_cache_groups<KV, 1>(q, D, kc, koff, nk, s); break;
        }
    }
}

// Scores of GC heads (queries qs, D apart) over the block's NG groups of 16 keys.
template <int GC, int NG>
inline void scores_heads(const float* qs, int D, const float* kt, float* sg) {
    __m512 acc[GC][NG];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) acc[g][k] = _mm512_setzero_ps();
    for (int d = 0; d < D; ++d) {
        __m512 kv[NG];
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) kv[k] = _mm512_loadu_ps(kt + d * kKB + 16 * k);
#pragma GCC unroll 3
        for (int g = 0; g < GC; ++g) {
            const __m512 qb = _mm512_set1_ps(qs[g * D + d]);
#pragma GCC unroll 4
            for (int k = 0; k < NG; ++k) acc[g][k] = _mm512_fmadd_ps(qb, kv[k], acc[g][k]);
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 4
        for (int k = 0; k < NG; ++k) _mm512_storeu_ps(sg + g * kKB + 16 * k, acc[g][k]);
}

template <int GC>
inline void scores_groups(const float* qs, int D, const float* kt, int ng, float* sg) {
    switch (ng) {
        case 4: scores_heads<GC, 4>(qs, D, kt, sg); break;
        case 3: scores_heads<GC, 3>(qs, D, kt, sg); break;
        case 2: scores_heads<GC, 2>(qs, D, kt, sg); break;
        default: scores_heads<GC, 1>(qs, D, kt, sg); break;
    }
}

// P.V of GC heads over NV groups of 16 dims from d0 (and, with lg, the heads' sums); key i's
// values are the cache's row at element offset voff[i], times vmul[i] for one-byte kinds
// (load_kv_row's value: one rounding of code times scale).
template <int KV, int GC, int NV>
inline void pv_chunk(const float* sg, const void* vc, const int64_t* voff, const float* vmul, int nk, int D, int d0,
                     float* og, float* lg) {
    __m512 a[GC][NV];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[g][v] = _mm512_setzero_ps();
    float l[GC];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g) l[g] = 0.0f;
    for (int i = 0; i < nk; ++i) {
        __m512 x[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) x[v] = load16<KV>(vc, voff[i] + d0 + 16 * v);
        if (KV == 2 || KV == 3) {
            const __m512 m = _mm512_set1_ps(vmul[i]);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) x[v] = _mm512_mul_ps(x[v], m);
        }
#pragma GCC unroll 3
        for (int g = 0; g < GC; ++g) {
            const float p = sg[g * kKB + i];
            const __m512 pb = _mm512_set1_ps(p);
#pragma GCC unroll 8
            for (int v = 0; v < NV; ++v) a[g][v] = _mm512_fmadd_ps(pb, x[v], a[g][v]);
            if (lg) l[g] = l[g] + p;
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g) {
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(og + g * D + d0 + 16 * v, a[g][v]);
        if (lg) lg[g] = l[g];
    }
}

// d in chunks of at most 128 (GC x 8 accumulators + 8 values <= 32 registers).
template <int KV, int GC>
inline void pv_heads(const float* sg, const void* vc, const int64_t* voff, const float* vmul, int nk, int D,
                     float* og, float* lg) {
    int d0 = 0;
    for (; d0 + 128 <= D; d0 += 128, lg = nullptr) pv_chunk<KV, GC, 8>(sg, vc, voff, vmul, nk, D, d0, og, lg);
    switch ((D - d0) / 16) {
        case 7: pv_chunk<KV, GC, 7>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 6: pv_chunk<KV, GC, 6>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 5: pv_chunk<KV, GC, 5>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 4: pv_chunk<KV, GC, 4>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 3: pv_chunk<KV, GC, 3>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 2: pv_chunk<KV, GC, 2>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        case 1: pv_chunk<KV, GC, 1>(sg, vc, voff, vmul, nk, D, d0, og, lg); break;
        default: break;
    }
}

template <int KV>
void pv(const float* sg, int G, int D, const void* vc, const int64_t* voff, const float* vmul, int nk, float* og,
        float* lg) {
    for (int g0 = 0; g0 < G; g0 += 3) {
        const float* s = sg + g0 * kKB;
        float* o = og + g0 * D;
        switch (G - g0 >= 3 ? 3 : G - g0) {
            case 3: pv_heads<KV, 3>(s, vc, voff, vmul, nk, D, o, lg + g0); break;
            case 2: pv_heads<KV, 2>(s, vc, voff, vmul, nk, D, o, lg + g0); break;
            default: pv_heads<KV, 1>(s, vc, voff, vmul, nk, D, o, lg + g0); break;
        }
    }
}

}  // namespace

void attn_row_scores_avx512(const float* qs, int G, int D, const float* kt, int nk, float* sg) {
    const int ng = (nk + 15) / 16;
    for (int g0 = 0; g0 < G; g0 += 3) {
        const float* q = qs + g0 * D;
        float* s = sg + g0 * kKB;
        switch (G - g0 >= 3 ? 3 : G - g0) {
            case 3: scores_groups<3>(q, D, kt, ng, s); break;
            case 2: scores_groups<2>(q, D, kt, ng, s); break;
            default: scores_groups<1>(q, D, kt, ng, s); break;
        }
    }
}

void attn_row_scores_cache_avx512(int kind, const float* qs, int G, int D, const void* kc, const int64_t* koff,
                                  int nk, float* sg) {
    if (kind == 1)
        scores_from_cache_heads<1>(qs, G, D, kc, koff, nk, sg);
    else
        scores_from_cache_heads<0>(qs, G, D, kc, koff, nk, sg);
}

void attn_row_pv_avx512(int kind, const float* sg, int G, int D, const void* vc, const int64_t* voff,
                        const float* vmul, int nk, float* og, float* lg) {
    switch (kind) {
        case 1: pv<1>(sg, G, D, vc, voff, vmul, nk, og, lg); break;
        case 2: pv<2>(sg, G, D, vc, voff, vmul, nk, og, lg); break;
        case 3: pv<3>(sg, G, D, vc, voff, vmul, nk, og, lg); break;
        default: pv<0>(sg, G, D, vc, voff, vmul, nk, og, lg); break;
    }
}

}  // namespace bessemer
