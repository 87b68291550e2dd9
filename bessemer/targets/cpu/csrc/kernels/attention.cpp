// attention@1: paged KV cache (fp32, bf16, or int8 / fp8 E4M3 codes with a float32 scale
// per (token, KV head): kv_codec.h), GQA, causal by position, optional sliding window.
// Phase 1 stores k/v of every row into the cache (bf16: round to nearest even; int8/fp8:
// quantized with the row's dynamic scale); phase 2 computes the outputs, always reading K/V
// back from the cache (a key computed in this step and one from a cached prefix round the
// same way): tiles of 16 query vectors for prefill-like sequences, the G heads of one row
// and KV head for decode rows, a decode row's key blocks spread over the threads when there
// are few rows. Every path gives a query bit-identical results (the same key blocks at
// multiples of kKB, fp32 K/V values, FMA chains, block partials and merge order:
// attention_blocks.h, attention_merge.h), so a request's outputs do not depend on its batch,
// its prefill chunks, the prefix cache or the thread count.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <cmath>
#include <limits>

#include "attention.h"
#include "attention_merge.h"
#include "kernels.h"
#include "kv_codec.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

// ---- tiled path (prefill / chunked prefill): 16 query vectors x a block of keys ----
//
// A tile is up to 16 (row, head) query vectors of one sequence that share a KV head. Q is
// stored transposed (Qt[d][lane]) so one key gives 16 scores with D FMAs and no horizontal
// sums; P.V accumulates into Ot[d][lane] four dims at a time in registers. Keys are read
// block by block (kKB keys, gathered from the paged cache into fp32 scratch) with an
// online softmax; causal / window masks are per lane.
constexpr int kTileMin = 8;  // sequences with fewer (rows x group) vectors use the row path

struct AttnParams {
    int layer, H, Hkv, D, G, bs, B;
    bool dec512;  // decode inner loops in AVX-512 (CPU has it, head_dim % 16 == 0)
    int64_t window, row_elems;
    float scale;
    const float* sinks;  // (H) learned logits counted in each head's softmax denominator, or null
    const void* Kc;
    const void* Vc;
    const float* Ks;  // per (slot, KV head) scales of a one-byte cache, else null
    const float* Vs;
    const float *q, *k, *v;
    float* o;
    int64_t ldq, ldk, ldv, ldo;
};

// One (slot, KV head) row srow of a cache into the tile's fp32 block (L1, kKB rows): every
// element is reused by 16 query lanes, so it is converted once here (codes times the
// row's scale) rather than per FMA.
template <int KV>
inline void load_kv_row(const void* cache, const float* scales, int64_t srow, float* dst, int D) {
    const int64_t off = srow * D;
    if constexpr (KV == kv::F32) {
        std::memcpy(dst, static_cast<const float*>(cache) + off, sizeof(float) * D);
    } else {
        const float sc = kv::coded<KV>() ? scales[srow] * kv::value_mul<KV>() : 1.0f;
        const __m256 vs = _mm256_set1_ps(sc);
        int d = 0;
        for (; d + 8 <= D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(kv::load8<KV>(cache, off + d), vs));
        for (; d < D; ++d) dst[d] = kv::load1<KV>(cache, off + d) * sc;
    }
}

template <int KV>
void attend_tile(const AttnParams& P, const StepContext& ctx, int s, int kvh, int q0, float* scratch) {
    const int D = P.D, G = P.G;
    const int row0 = ctx.cu_seqlens[s];
    const int nq = (ctx.cu_seqlens[s + 1] - row0) * G;
    const int R = std::min(kLanes, nq - q0);
    float* Qt = scratch;           // [D][16]
    float* Ot = Qt + D * kLanes;   // [D][16]
    float* Sb = Ot + D * kLanes;   // [kKB][16]
    float* Kf = Sb + kKB * kLanes; // [kKB][D]
    float* Vf = Kf + kKB * D;      // [kKB][D]
    alignas(32) int32_t lo_l[kLanes], hi_l[kLanes];
    int t_l[kLanes], h_l[kLanes];
    int32_t jlo = INT32_MAX, jhi = -1;
    for (int lane = 0; lane < kLanes; ++lane) {
        const int qi = q0 + std::min(lane, R - 1);  // padding lanes repeat the last vector
        const int t = row0 + qi / G, h = kvh * G + qi % G;
        const int32_t p = ctx.positions[t];
        const int32_t lo = P.window > 0 ? int32_t(std::max<int64_t>(0, p - P.window + 1)) : 0;
        t_l[lane] = t;
        h_l[lane] = h;
        lo_l[lane] = lo;
        hi_l[lane] = p;
        jlo = std::min(jlo, lo);
        jhi = std::max(jhi, p);
        const float* qr = P.q + t * P.ldq + int64_t(h) * D;
        for (int d = 0; d < D; ++d) Qt[d * kLanes + lane] = qr[d] * P.scale;
    }
    std::memset(Ot, 0, sizeof(float) * D * kLanes);
    const __m256i lo0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_l));
    const __m256i lo1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_l + 8));
    const __m256i hi0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_l));
    const __m256i hi1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_l + 8));
    const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    const __m256 nomax = _mm256_set1_ps(attn::kNoMax);
    // each lane's running state (attention_merge.h)
    __m256 m0 = nomax, m1 = nomax;
    __m256 l0 = _mm256_setzero_ps(), l1 = l0;
    const int32_t* bt = ctx.block_tables + int64_t(s) * P.B;
    const int bs = P.bs;

    // key blocks start at multiples of kKB whatever the tile's lanes: a lane's blocks (and so
    // its rounding) depend only on its own position
    for (int32_t jb = jlo / kKB * kKB; jb <= jhi; jb += kKB) {
        const int nk = std::min<int>(kKB, jhi - jb + 1);
        for (int i = 0; i < nk; ++i) {
            const int32_t j = jb + i;
            if (j < jlo) {  // before every lane's window (its block may be gone): masked, zeros
                std::memset(Kf + i * D, 0, sizeof(float) * D);
                std::memset(Vf + i * D, 0, sizeof(float) * D);
                continue;
            }
            const int64_t srow = (int64_t(bt[j / bs]) * bs + j % bs) * P.Hkv + kvh;
            load_kv_row<KV>(P.Kc, P.Ks, srow, Kf + i * D, D);
            load_kv_row<KV>(P.Vc, P.Vs, srow, Vf + i * D, D);
        }
        // Scores S[i][lane] = Qt[:, lane] . K[i]
        int i = 0;
        for (; i + 4 <= nk; i += 4) {
            __m256 a[4][2];
            for (int u = 0; u < 4; ++u) a[u][0] = a[u][1] = _mm256_setzero_ps();
            const float* kr = Kf + i * D;
            for (int d = 0; d < D; ++d) {
                const __m256 qa = _mm256_load_ps(Qt + d * kLanes), qb = _mm256_load_ps(Qt + d * kLanes + 8);
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u) {
                    const __m256 kb = _mm256_broadcast_ss(kr + u * D + d);
                    a[u][0] = _mm256_fmadd_ps(qa, kb, a[u][0]);
                    a[u][1] = _mm256_fmadd_ps(qb, kb, a[u][1]);
                }
            }
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                _mm256_store_ps(Sb + (i + u) * kLanes, a[u][0]);
                _mm256_store_ps(Sb + (i + u) * kLanes + 8, a[u][1]);
            }
        }
        for (; i < nk; ++i) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            const float* kr = Kf + i * D;
            for (int d = 0; d < D; ++d) {
                const __m256 kb = _mm256_broadcast_ss(kr + d);
                a0 = _mm256_fmadd_ps(_mm256_load_ps(Qt + d * kLanes), kb, a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(Qt + d * kLanes + 8), kb, a1);
            }
            _mm256_store_ps(Sb + i * kLanes, a0);
            _mm256_store_ps(Sb + i * kLanes + 8, a1);
        }
        // Masks and the block's max.
        __m256 bm0 = nomax, bm1 = nomax;
        for (i = 0; i < nk; ++i) {
            const __m256i jv = _mm256_set1_epi32(jb + i);
            const __m256 bad0 = _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(lo0, jv), _mm256_cmpgt_epi32(jv, hi0)));
            const __m256 bad1 = _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(lo1, jv), _mm256_cmpgt_epi32(jv, hi1)));
            const __m256 s0 = _mm256_blendv_ps(_mm256_load_ps(Sb + i * kLanes), ninf, bad0);
            const __m256 s1 = _mm256_blendv_ps(_mm256_load_ps(Sb + i * kLanes + 8), ninf, bad1);
            _mm256_store_ps(Sb + i * kLanes, s0);
            _mm256_store_ps(Sb + i * kLanes + 8, s1);
            bm0 = _mm256_max_ps(bm0, s0);
            bm1 = _mm256_max_ps(bm1, s1);
        }
        // Lanes without a key in this block keep their state (a decode row never sees the
        // block): no lane's bits depend on its tile neighbours' blocks.
        const __m256i first = _mm256_set1_epi32(jb), last = _mm256_set1_epi32(jb + nk - 1);
        const __m256 skip0 = _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(first, hi0), _mm256_cmpgt_epi32(lo0, last)));
        const __m256 skip1 = _mm256_castsi256_ps(_mm256_or_si256(_mm256_cmpgt_epi32(first, hi1), _mm256_cmpgt_epi32(lo1, last)));
        // P = exp(S - block max), masked entries exactly 0; the block's sum from 0.
        __m256 lb0 = _mm256_setzero_ps(), lb1 = lb0;
        for (i = 0; i < nk; ++i) {
            const __m256 s0 = _mm256_load_ps(Sb + i * kLanes), s1 = _mm256_load_ps(Sb + i * kLanes + 8);
            __m256 p0 = exp256(_mm256_sub_ps(s0, bm0)), p1 = exp256(_mm256_sub_ps(s1, bm1));
            p0 = _mm256_and_ps(p0, _mm256_cmp_ps(s0, ninf, _CMP_NEQ_OQ));
            p1 = _mm256_and_ps(p1, _mm256_cmp_ps(s1, ninf, _CMP_NEQ_OQ));
            _mm256_store_ps(Sb + i * kLanes, p0);
            _mm256_store_ps(Sb + i * kLanes + 8, p1);
            lb0 = _mm256_add_ps(lb0, p0);
            lb1 = _mm256_add_ps(lb1, p1);
        }
        // Merge coefficients (attention_merge.h).
        const __m256 mn0 = _mm256_max_ps(m0, bm0), mn1 = _mm256_max_ps(m1, bm1);
        const __m256 al0 = exp256(_mm256_sub_ps(m0, mn0)), al1 = exp256(_mm256_sub_ps(m1, mn1));
        const __m256 be0 = exp256(_mm256_sub_ps(bm0, mn0)), be1 = exp256(_mm256_sub_ps(bm1, mn1));
        l0 = _mm256_blendv_ps(_mm256_fmadd_ps(lb0, be0, _mm256_mul_ps(l0, al0)), l0, skip0);
        l1 = _mm256_blendv_ps(_mm256_fmadd_ps(lb1, be1, _mm256_mul_ps(l1, al1)), l1, skip1);
        m0 = _mm256_blendv_ps(mn0, m0, skip0);
        m1 = _mm256_blendv_ps(mn1, m1, skip1);
        // The block's P.V (sum_i P[i] * V[i][d] from 0, keys in order), merged into Ot.
        const auto merge_out = [&](float* o, __m256 ob0, __m256 ob1) {
            const __m256 o0 = _mm256_load_ps(o), o1 = _mm256_load_ps(o + 8);
            _mm256_store_ps(o, _mm256_blendv_ps(_mm256_fmadd_ps(ob0, be0, _mm256_mul_ps(o0, al0)), o0, skip0));
            _mm256_store_ps(o + 8, _mm256_blendv_ps(_mm256_fmadd_ps(ob1, be1, _mm256_mul_ps(o1, al1)), o1, skip1));
        };
        int d0 = 0;
        for (; d0 + 4 <= D; d0 += 4) {
            __m256 a[4][2];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) a[u][0] = a[u][1] = _mm256_setzero_ps();
            for (i = 0; i < nk; ++i) {
                const __m256 pa = _mm256_load_ps(Sb + i * kLanes), pb = _mm256_load_ps(Sb + i * kLanes + 8);
                const float* vr = Vf + i * D + d0;
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u) {
                    const __m256 vb = _mm256_broadcast_ss(vr + u);
                    a[u][0] = _mm256_fmadd_ps(pa, vb, a[u][0]);
                    a[u][1] = _mm256_fmadd_ps(pb, vb, a[u][1]);
                }
            }
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) merge_out(Ot + (d0 + u) * kLanes, a[u][0], a[u][1]);
        }
        for (; d0 < D; ++d0) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0;
            for (i = 0; i < nk; ++i) {
                const __m256 vb = _mm256_broadcast_ss(Vf + i * D + d0);
                a0 = _mm256_fmadd_ps(_mm256_load_ps(Sb + i * kLanes), vb, a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(Sb + i * kLanes + 8), vb, a1);
            }
            merge_out(Ot + d0 * kLanes, a0, a1);
        }
    }
    alignas(32) float lsum[kLanes], lmax[kLanes];
    _mm256_store_ps(lsum, l0);
    _mm256_store_ps(lsum + 8, l1);
    _mm256_store_ps(lmax, m0);
    _mm256_store_ps(lmax + 8, m1);
    for (int lane = 0; lane < R; ++lane) {
        const float sink = P.sinks ? std::exp(P.sinks[h_l[lane]] - lmax[lane]) : 0.0f;
        const float inv = 1.0f / (lsum[lane] + sink);
        float* orow = P.o + t_l[lane] * P.ldo + int64_t(h_l[lane]) * D;
        for (int d = 0; d < D; ++d) orow[d] = Ot[d * kLanes + lane] * inv;
    }
}

// ---- row path (decode and short sequences): the G query heads of one row and KV head ----
//
// Bit-identical to a tile lane with the same query, so a row's result does not depend on
// which path its step shape sends it down (decode, chunked prefill, prefix-cache hit or
// miss): the same key blocks (absolute multiples of kKB), the same fp32 K/V values
// (load_kv_row's conversion), a score as one FMA chain over d of (q * scale) . k, the same
// block partial (max, exps, sum and P.V as chains over the keys in order) and the same merge
// (attention_merge.h). Only the vectorisation differs: keys in the lanes of a score (the
// block's K converted and transposed: in registers by the AVX-512 loops for fp32 and bf16
// caches, else in scratch), output dims in the lanes of P.V, the G heads reusing the block's
// K/V from L1.

// 8 rows of 8 floats transposed in registers (data movement only: exact).
inline void transpose8(__m256 r[8]) {
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Kt[d * kKB + i] = key i's element d as fp32 (load_kv_row's value), for the keys i < nk
// (cache rows srow[i]) and zeros up to the next multiple of 8 keys; converted in registers.
template <int KV>
void load_keys_transposed(const AttnParams& P, const int64_t* srow, int nk, float* Kt) {
    const int D = P.D, D8 = D & ~7;
    for (int k0 = 0; k0 < nk; k0 += 8) {
        const int nu = std::min(8, nk - k0);
        __m256 mul[8];
        for (int u = 0; u < 8; ++u)
            mul[u] = _mm256_set1_ps(kv::coded<KV>() && u < nu ? P.Ks[srow[k0 + u]] * kv::value_mul<KV>() : 1.0f);
        for (int d0 = 0; d0 < D8; d0 += 8) {
            __m256 r[8];
            for (int u = 0; u < 8; ++u) {
                if (u >= nu) {
                    r[u] = _mm256_setzero_ps();
                    continue;
                }
                r[u] = kv::load8<KV>(P.Kc, srow[k0 + u] * D + d0);
                if constexpr (kv::coded<KV>()) r[u] = _mm256_mul_ps(r[u], mul[u]);
            }
            transpose8(r);
            for (int x = 0; x < 8; ++x) _mm256_storeu_ps(Kt + (d0 + x) * kKB + k0, r[x]);
        }
        for (int d = D8; d < D; ++d)
            for (int u = 0; u < 8; ++u)
                Kt[d * kKB + k0 + u] = u < nu ? kv::load1<KV>(P.Kc, srow[k0 + u] * D + d) * _mm256_cvtss_f32(mul[u]) : 0.0f;
    }
}

// Scores of the block's keys for G heads, 8 keys per accumulator, one FMA chain over d each.
inline void row_scores_avx2(const float* Qs, int G, int D, const float* Kt, int nk, float* Sg) {
    const int ng = (nk + 7) / 8;
    for (int g = 0; g < G; ++g) {
        const float* qg = Qs + g * D;
        __m256 acc[kKB / 8];
#pragma GCC unroll 8
        for (int kg = 0; kg < kKB / 8; ++kg) acc[kg] = _mm256_setzero_ps();
        if (ng == kKB / 8) {
            for (int d = 0; d < D; ++d) {
                const __m256 qb = _mm256_broadcast_ss(qg + d);
#pragma GCC unroll 8
                for (int kg = 0; kg < kKB / 8; ++kg)
                    acc[kg] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(Kt + d * kKB + kg * 8), acc[kg]);
            }
        } else {
            for (int d = 0; d < D; ++d) {
                const __m256 qb = _mm256_broadcast_ss(qg + d);
                for (int kg = 0; kg < ng; ++kg)
                    acc[kg] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(Kt + d * kKB + kg * 8), acc[kg]);
            }
        }
        for (int kg = 0; kg < ng; ++kg) _mm256_storeu_ps(Sg + g * kKB + kg * 8, acc[kg]);
    }
}

// P.V of GC heads over NV groups of 8 dims from d0: og[g * D + d] = chain over the keys of
// p * v from 0; with lg, also lg[g] = the keys' sum of p in order.
template <int GC, int NV>
inline void row_pv_chunk(const float* Sg, int D, const float* Vf, int nk, int d0, float* og, float* lg) {
    __m256 a[GC][NV];
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) a[g][v] = _mm256_setzero_ps();
    float l[GC] = {};
    for (int i = 0; i < nk; ++i) {
        __m256 x[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) x[v] = _mm256_loadu_ps(Vf + i * D + d0 + 8 * v);
#pragma GCC unroll 3
        for (int g = 0; g < GC; ++g) {
            const __m256 pb = _mm256_broadcast_ss(Sg + g * kKB + i);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) a[g][v] = _mm256_fmadd_ps(pb, x[v], a[g][v]);
            if (lg) l[g] = l[g] + Sg[g * kKB + i];
        }
    }
#pragma GCC unroll 3
    for (int g = 0; g < GC; ++g) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) _mm256_storeu_ps(og + g * D + d0 + 8 * v, a[g][v]);
        if (lg) lg[g] = l[g];
    }
}

template <int GC>
inline void row_pv_heads(const float* Sg, int D, const float* Vf, int nk, float* og, float* lg) {
    int d0 = 0;
    for (; d0 + 32 <= D; d0 += 32, lg = nullptr) row_pv_chunk<GC, 4>(Sg, D, Vf, nk, d0, og, lg);
    for (; d0 + 8 <= D; d0 += 8, lg = nullptr) row_pv_chunk<GC, 1>(Sg, D, Vf, nk, d0, og, lg);
    for (int g = 0; g < GC; ++g) {
        for (int d = d0; d < D; ++d) {
            float a = 0.0f;
            for (int i = 0; i < nk; ++i) a = std::fma(Sg[g * kKB + i], Vf[i * D + d], a);
            og[g * D + d] = a;
        }
        if (lg) {
            float l = 0.0f;
            for (int i = 0; i < nk; ++i) l = l + Sg[g * kKB + i];
            lg[g] = l;
        }
    }
}

inline void row_pv_avx2(const float* Sg, int G, int D, const float* Vf, int nk, float* Og, float* lg) {
    for (int g0 = 0; g0 < G; g0 += 3) {
        const float* sg = Sg + g0 * kKB;
        float* og = Og + g0 * D;
        switch (std::min(3, G - g0)) {
            case 3: row_pv_heads<3>(sg, D, Vf, nk, og, lg + g0); break;
            case 2: row_pv_heads<2>(sg, D, Vf, nk, og, lg + g0); break;
            default: row_pv_heads<1>(sg, D, Vf, nk, og, lg + g0); break;
        }
    }
}

// Scratch of the row path: the block's values, its keys transposed, the G heads' queries
// (times the softmax scale), scores, P.V and sums; then a block's partials and the running
// state of the G heads (sequential merge).
struct RowScratch {
    float *Vf, *Kt, *Qs, *Sg, *Og, *lg, *part, *mst, *lst, *Ost, *vmul;
    int64_t *srow, *voff;
    RowScratch(float* s, int G, int D) {
        Vf = s;                  // [kKB][D]
        Kt = Vf + kKB * D;       // [D][kKB]
        Qs = Kt + kKB * D;       // [G][D]
        Sg = Qs + G * D;         // [G][kKB]
        Og = Sg + G * kKB;       // [G][D]
        lg = Og + G * D;         // [G]
        part = lg + G;           // [G][kPartialHead + D]
        mst = part + G * (kPartialHead + D);  // [G]
        lst = mst + G;           // [G]
        Ost = lst + G;           // [G][D]
        vmul = Ost + G * D;      // [kKB]
        const int64_t used = (vmul + kKB) - s;
        srow = reinterpret_cast<int64_t*>(s + used + (used & 1));  // [kKB], 8-byte aligned
        voff = srow + kKB;       // [kKB]
    }
};

// The queries of row t's G heads of KV head kvh, times the softmax scale (a tile's Qt values).
inline void load_row_queries(const AttnParams& P, int t, int kvh, float* Qs) {
    for (int g = 0; g < P.G; ++g) {
        const float* qr = P.q + t * P.ldq + int64_t(kvh * P.G + g) * P.D;
        for (int d = 0; d < P.D; ++d) Qs[g * P.D + d] = qr[d] * P.scale;
    }
}

// Prefetches keys [j0, j0 + nk)'s K and V rows of heads [kvh, kvh + nh) (contiguous per
// key): strided and paged, they would otherwise be waited for one by one.
template <int KV>
void prefetch_block(const AttnParams& P, const int32_t* bt, int kvh, int nh, int32_t j0, int nk) {
    const int64_t row_bytes = int64_t(sizeof(typename kv::Elem<KV>::T)) * P.D;
    const int bs = P.bs;
    int32_t page = j0 / bs, in_page = j0 % bs;
    for (int i = 0; i < nk; ++i) {
        const int64_t off = ((int64_t(bt[page]) * bs + in_page) * P.Hkv + kvh) * row_bytes;
        if (++in_page == bs) {
            in_page = 0;
            ++page;
        }
        for (int64_t b = 0; b < nh * row_bytes; b += 64) {
            _mm_prefetch(static_cast<const char*>(P.Kc) + off + b, _MM_HINT_T0);
            _mm_prefetch(static_cast<const char*>(P.Vc) + off + b, _MM_HINT_T0);
        }
    }
}

// The partials of keys [j0, j0 + nk) (one block's, nk >= 1) of row t's sequence for the G heads
// of KV head kvh (queries in R.Qs): part[g * (kPartialHead + D) ..] = (max, sum, P.V).
template <int KV>
void row_block(const AttnParams& P, const int32_t* bt, int kvh, int32_t j0, int nk, const RowScratch& R, float* part) {
    const int D = P.D, G = P.G, bs = P.bs;
    int32_t page = j0 / bs, in_page = j0 % bs;
    for (int i = 0; i < nk; ++i) {
        R.srow[i] = (int64_t(bt[page]) * bs + in_page) * P.Hkv + kvh;
        if (++in_page == bs) {
            in_page = 0;
            ++page;
        }
    }
    if (P.dec512) {  // the AVX-512 P.V converts V in registers (K and V rows share element offsets)
        for (int i = 0; i < nk; ++i) {
            R.voff[i] = R.srow[i] * D;
            R.vmul[i] = kv::coded<KV>() ? P.Vs[R.srow[i]] * kv::value_mul<KV>() : 1.0f;  // load_kv_row's scale
        }
    } else {
        for (int i = 0; i < nk; ++i) load_kv_row<KV>(P.Vc, P.Vs, R.srow[i], R.Vf + i * D, D);
    }
    if (P.dec512 && !kv::coded<KV>()) {  // keys transposed in registers, no copy in scratch
        attn_row_scores_cache_avx512(KV, R.Qs, G, D, P.Kc, R.voff, nk, R.Sg);
    } else {
        load_keys_transposed<KV>(P, R.srow, nk, R.Kt);
        if (P.dec512)
            attn_row_scores_avx512(R.Qs, G, D, R.Kt, nk, R.Sg);
        else
            row_scores_avx2(R.Qs, G, D, R.Kt, nk, R.Sg);
    }
    const int ng = (nk + 7) / 8;
    for (int g = 0; g < G; ++g) {
        float* sg = R.Sg + g * kKB;
        __m256 vmax = _mm256_set1_ps(attn::kNoMax);  // max is exact: any order gives the same value
        int i = 0;
        for (; i + 8 <= nk; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sg + i));
        float mb = hmax256(vmax);
        for (; i < nk; ++i) mb = std::max(mb, sg[i]);
        const __m256 vm = _mm256_set1_ps(mb);
        for (int kg = 0; kg < ng; ++kg)
            _mm256_storeu_ps(sg + kg * 8, exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + kg * 8), vm)));
        part[g * (kPartialHead + D)] = mb;
    }
    if (P.dec512)
        attn_row_pv_avx512(KV, R.Sg, G, D, P.Vc, R.voff, R.vmul, nk, R.Og, R.lg);
    else
        row_pv_avx2(R.Sg, G, D, R.Vf, nk, R.Og, R.lg);
    for (int g = 0; g < G; ++g) {
        float* pg = part + g * (kPartialHead + D);
        pg[1] = R.lg[g];
        std::memcpy(pg + kPartialHead, R.Og + g * D, sizeof(float) * D);
    }
}

// Row t's key blocks from the first of its window to its position (the blocks split_row_blocks counts).
inline void row_key_range(const AttnParams& P, int32_t p, int32_t& lo, int32_t& first_block) {
    lo = P.window > 0 ? int32_t(std::max<int64_t>(0, p - P.window + 1)) : 0;
    first_block = lo / kKB;
}

// Output of one head from its merged state.
inline void finish_head(const AttnParams& P, int t, int h, float m, float l, const float* o) {
    const float sink = P.sinks ? std::exp(P.sinks[h] - m) : 0.0f;
    const float inv = 1.0f / (l + sink);
    float* orow = P.o + t * P.ldo + int64_t(h) * P.D;
    for (int d = 0; d < P.D; ++d) orow[d] = o[d] * inv;
}

// One row and KV head, its blocks in order on this thread, each merged as it is done.
template <int KV>
void attend_row(const AttnParams& P, const StepContext& ctx, int t, int kvh, float* scratch) {
    const int D = P.D, G = P.G;
    const RowScratch R(scratch, G, D);
    const int32_t p = ctx.positions[t];
    int32_t lo, b0;
    row_key_range(P, p, lo, b0);
    const int32_t* bt = ctx.block_tables + int64_t(ctx.seq_of_row[t]) * P.B;
    load_row_queries(P, t, kvh, R.Qs);
    for (int g = 0; g < G; ++g) {
        R.mst[g] = attn::kNoMax;
        R.lst[g] = 0.0f;
    }
    std::memset(R.Ost, 0, sizeof(float) * G * D);
    for (int32_t jb = b0 * kKB; jb <= p; jb += kKB) {
        const int32_t j0 = std::max(jb, lo), nk = std::min<int32_t>(jb + kKB - 1, p) - j0 + 1;
        prefetch_block<KV>(P, bt, kvh, 1, j0, nk);
        row_block<KV>(P, bt, kvh, j0, nk, R, R.part);
        for (int g = 0; g < G; ++g) {
            const float* pg = R.part + g * (kPartialHead + D);
            attn::merge_partial(R.mst[g], R.lst[g], R.Ost + g * D, pg[0], pg[1], pg + kPartialHead, D);
        }
    }
    for (int g = 0; g < G; ++g) finish_head(P, t, kvh * G + g, R.mst[g], R.lst[g], R.Ost + g * D);
}

// One block of row t for every KV head (a row whose blocks run on several threads): the
// block's K/V rows of all heads are contiguous per key, read together; its partials into
// part ([Hkv][G][kPartialHead + D]), for merge_row_blocks.
template <int KV>
void attend_row_block(const AttnParams& P, const StepContext& ctx, int t, int32_t jb, float* scratch, float* part) {
    const RowScratch R(scratch, P.G, P.D);
    const int32_t p = ctx.positions[t];
    int32_t lo, b0;
    row_key_range(P, p, lo, b0);
    const int32_t j0 = std::max(jb, lo), nk = std::min<int32_t>(jb + kKB - 1, p) - j0 + 1;
    const int32_t* bt = ctx.block_tables + int64_t(ctx.seq_of_row[t]) * P.B;
    prefetch_block<KV>(P, bt, 0, P.Hkv, j0, nk);
    for (int kvh = 0; kvh < P.Hkv; ++kvh) {
        load_row_queries(P, t, kvh, R.Qs);
        row_block<KV>(P, bt, kvh, j0, nk, R, part + int64_t(kvh) * P.G * (kPartialHead + P.D));
    }
}

// Head h of row t from its nb block partials (part, hstride floats between blocks), merged in
// block order as attend_row merges them.
inline void merge_row_blocks(const AttnParams& P, int t, int h, const float* part, int nb, int64_t bstride,
                             float* o) {
    float m = attn::kNoMax, l = 0.0f;
    std::memset(o, 0, sizeof(float) * P.D);
    for (int b = 0; b < nb; ++b) {
        const float* pb = part + b * bstride;
        attn::merge_partial(m, l, o, pb[0], pb[1], pb + kPartialHead, P.D);
    }
    finish_head(P, t, h, m, l, o);
}

template <int KV>
void attend(const KernelCall& c, const StepContext& ctx) {
    const AttentionParams& a = c.get<AttentionParams>();
    AttnParams P;
    P.layer = a.layer;
    P.H = a.H;
    P.Hkv = a.Hkv;
    P.D = a.D;
    P.window = a.window;
    P.scale = a.scale;
    P.sinks = a.sinks ? static_cast<const float*>(c.weights[0]->data) : nullptr;
    P.G = P.H / P.Hkv;
    P.bs = ctx.block_size;
    P.B = ctx.B;
    P.row_elems = int64_t(P.Hkv) * P.D;
    P.dec512 = ctx.isa == Isa::AVX512 && P.D % 16 == 0;
    P.Kc = ctx.k_cache[P.layer];
    P.Vc = ctx.v_cache[P.layer];
    P.Ks = kv::coded<KV>() ? ctx.k_scale[P.layer] : nullptr;
    P.Vs = kv::coded<KV>() ? ctx.v_scale[P.layer] : nullptr;
    P.q = ctx.ptr(c.ins[0]);
    P.k = ctx.ptr(c.ins[1]);
    P.v = ctx.ptr(c.ins[2]);
    P.o = ctx.ptr(c.outs[0]);
    P.ldq = ctx.ld(c.ins[0]);
    P.ldk = ctx.ld(c.ins[1]);
    P.ldv = ctx.ld(c.ins[2]);
    P.ldo = ctx.ld(c.outs[0]);
    const int T = ctx.T, S = ctx.S, nt = ctx.nthreads;
    const int bs = P.bs, B = P.B;
    const int64_t row_elems = P.row_elems;

    // Phase 1: store this step's k/v rows into the cache.
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && T * row_elems >= 65536)
    for (int t = 0; t < T; ++t) {
        const int s = ctx.seq_of_row[t], p = ctx.positions[t];
        const int64_t blk = ctx.block_tables[int64_t(s) * B + p / bs];
        const int64_t slot = (blk * bs + p % bs) * row_elems;
        const float* kr = P.k + t * P.ldk;
        const float* vr = P.v + t * P.ldv;
        if constexpr (kv::coded<KV>()) {
            using E = typename kv::Elem<KV>::T;
            E* kd = static_cast<E*>(ctx.k_cache[P.layer]) + slot;
            E* vd = static_cast<E*>(ctx.v_cache[P.layer]) + slot;
            float* ks = ctx.k_scale[P.layer] + slot / P.D;
            float* vs = ctx.v_scale[P.layer] + slot / P.D;
            for (int h = 0; h < P.Hkv; ++h) {
                ks[h] = kv::quantize_row<KV>(kr + int64_t(h) * P.D, P.D, kd + int64_t(h) * P.D);
                vs[h] = kv::quantize_row<KV>(vr + int64_t(h) * P.D, P.D, vd + int64_t(h) * P.D);
            }
        } else if constexpr (KV == kv::BF16) {
            uint16_t* kd = static_cast<uint16_t*>(ctx.k_cache[P.layer]) + slot;
            uint16_t* vd = static_cast<uint16_t*>(ctx.v_cache[P.layer]) + slot;
            for (int64_t e = 0; e < row_elems; ++e) {
                kd[e] = f32_to_bf16(kr[e]);
                vd[e] = f32_to_bf16(vr[e]);
            }
        } else {
            std::memcpy(static_cast<float*>(ctx.k_cache[P.layer]) + slot, kr, sizeof(float) * row_elems);
            std::memcpy(static_cast<float*>(ctx.v_cache[P.layer]) + slot, vr, sizeof(float) * row_elems);
        }
    }

    // Work list: tiles of sequences with >= kTileMin query vectors per KV head; the rows of
    // the other sequences (decode) go one (row, KV head) at a time, or, when there are too
    // few of those to keep the threads busy, one (row, KV head, key block) at a time with a
    // merge pass after them. Every split gives a query the same bits: its blocks are fixed
    // by its position and always merge in order (attention_merge.h).
    int32_t* tile_start = ctx.iwork;        // [S + 1] prefix sums of tiles (x Hkv)
    int32_t* dec_rows = ctx.iwork + S + 1;  // [T] rows on the row path
    tile_start[0] = 0;
    int n_dec = 0;
    int max_blocks = 1;  // key blocks of the longest decode row
    for (int s = 0; s < S; ++s) {
        const int r0 = ctx.cu_seqlens[s], r1 = ctx.cu_seqlens[s + 1];
        const int nq = (r1 - r0) * P.G;
        const int tiles = nq >= kTileMin ? (nq + kLanes - 1) / kLanes : 0;
        if (!tiles)
            for (int t = r0; t < r1; ++t) {
                dec_rows[n_dec++] = t;
                int32_t lo, b0;
                row_key_range(P, ctx.positions[t], lo, b0);
                max_blocks = std::max(max_blocks, ctx.positions[t] / kKB - b0 + 1);
            }
        tile_start[s + 1] = tile_start[s] + tiles * P.Hkv;
    }
    const int64_t tile_items = tile_start[S];
    const int H = P.H, D = P.D, Hkv = P.Hkv;
    // (row, block) partials of every head: [n_dec][max_blocks][H][kPartialHead + D]
    const int64_t head_stride = kPartialHead + D, block_stride = int64_t(H) * head_stride;
    const bool split = nt > 1 && n_dec > 0 && max_blocks > 1 && int64_t(n_dec) * Hkv < 4 * nt && ctx.fwork &&
                       int64_t(n_dec) * max_blocks * block_stride <= ctx.fwork_len;
    const int64_t dec_items = int64_t(n_dec) * (split ? max_blocks : Hkv);
    const int64_t total = tile_items + dec_items;

#pragma omp parallel num_threads(nt) if (nt > 1 && total > 1)
    {
        float* scratch = ctx.scratch[omp_get_thread_num()];
#pragma omp for schedule(dynamic, 1) nowait
        for (int64_t it = 0; it < tile_items; ++it) {
            const int32_t idx = int32_t(tile_items - 1 - it);  // heaviest (latest) tiles first
            const int s = int(std::upper_bound(tile_start, tile_start + S + 1, idx) - tile_start) - 1;
            const int local = idx - tile_start[s];
            attend_tile<KV>(P, ctx, s, local % P.Hkv, (local / P.Hkv) * kLanes, scratch);
        }
        if (!split) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < dec_items; ++it)
                attend_row<KV>(P, ctx, dec_rows[it / Hkv], int(it % Hkv), scratch);
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t it = 0; it < dec_items; ++it) {
                const int r = int(it / max_blocks), b = int(it % max_blocks), t = dec_rows[r];
                int32_t lo, b0;
                row_key_range(P, ctx.positions[t], lo, b0);
                const int32_t jb = (b0 + b) * kKB;
                if (jb > ctx.positions[t]) continue;  // a shorter row than the longest
                attend_row_block<KV>(P, ctx, t, jb, scratch, ctx.fwork + (int64_t(r) * max_blocks + b) * block_stride);
            }
#pragma omp for schedule(static)
            for (int64_t it = 0; it < int64_t(n_dec) * H; ++it) {
                const int r = int(it / H), h = int(it % H), t = dec_rows[r];
                int32_t lo, b0;
                row_key_range(P, ctx.positions[t], lo, b0);
                merge_row_blocks(P, t, h, ctx.fwork + int64_t(r) * max_blocks * block_stride + int64_t(h) * head_stride,
                                 ctx.positions[t] / kKB - b0 + 1, block_stride, scratch);
            }
        }
    }
}

}  // namespace

void run_attention(const KernelCall& c, const StepContext& ctx) {
    switch (ctx.kv_dtype) {
        case DT_BF16: attend<kv::BF16>(c, ctx); break;
        case DT_I8: attend<kv::I8>(c, ctx); break;
        case DT_F8E4M3: attend<kv::F8>(c, ctx); break;
        default: attend<kv::F32>(c, ctx); break;
    }
}

}  // namespace bessemer
