// attention@1: paged KV cache (fp32, bf16, or int8 / fp8 E4M3 codes with a float32 scale
// per (token, KV head): kv_codec.h), GQA, causal by position, optional sliding window.
// Phase 1 stores k/v of every row into the cache (bf16: round to nearest even; int8/fp8:
// quantized with the row's dynamic scale); phase 2 computes the outputs, always reading K/V
// back from the cache (a key computed in this step and one from a cached prefix round the
// same way): tiles of 16 query vectors for prefill-like sequences, the G heads of one row
// and KV head for decode rows. Both paths give a query bit-identical results (the same key
// blocks, fp32 K/V values, FMA chains and online softmax), so a request's outputs do not
// depend on its batch, its prefill chunks or the prefix cache.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <cmath>
#include <limits>

#include "attention.h"
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
    __m256 m0 = _mm256_set1_ps(-1e30f), m1 = m0;
    __m256 l0 = _mm256_setzero_ps(), l1 = l0;
    const int32_t* bt = ctx.block_tables + int64_t(s) * P.B;
    const int bs = P.bs;

    // key blocks start at multiples of kKB whatever the tile's lanes: a lane's blocks (and so
    // its online-softmax rounding) depend only on its own position
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
        // Masks and block max.
        __m256 bm0 = m0, bm1 = m1;
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
        // Rescale the running sums when the max moved.
        const __m256 al0 = exp256(_mm256_sub_ps(m0, bm0)), al1 = exp256(_mm256_sub_ps(m1, bm1));
        const bool moved = _mm256_movemask_ps(_mm256_cmp_ps(bm0, m0, _CMP_NEQ_OQ)) |
                           _mm256_movemask_ps(_mm256_cmp_ps(bm1, m1, _CMP_NEQ_OQ));
        m0 = bm0;
        m1 = bm1;
        if (moved) {
            l0 = _mm256_mul_ps(l0, al0);
            l1 = _mm256_mul_ps(l1, al1);
            for (int d = 0; d < D; ++d) {
                _mm256_store_ps(Ot + d * kLanes, _mm256_mul_ps(_mm256_load_ps(Ot + d * kLanes), al0));
                _mm256_store_ps(Ot + d * kLanes + 8, _mm256_mul_ps(_mm256_load_ps(Ot + d * kLanes + 8), al1));
            }
        }
        // P = exp(S - m); masked entries exactly 0.
        for (i = 0; i < nk; ++i) {
            const __m256 s0 = _mm256_load_ps(Sb + i * kLanes), s1 = _mm256_load_ps(Sb + i * kLanes + 8);
            __m256 p0 = exp256(_mm256_sub_ps(s0, m0)), p1 = exp256(_mm256_sub_ps(s1, m1));
            p0 = _mm256_and_ps(p0, _mm256_cmp_ps(s0, ninf, _CMP_NEQ_OQ));
            p1 = _mm256_and_ps(p1, _mm256_cmp_ps(s1, ninf, _CMP_NEQ_OQ));
            _mm256_store_ps(Sb + i * kLanes, p0);
            _mm256_store_ps(Sb + i * kLanes + 8, p1);
            l0 = _mm256_add_ps(l0, p0);
            l1 = _mm256_add_ps(l1, p1);
        }
        // Ot[d] += sum_i P[i] * V[i][d]
        int d0 = 0;
        for (; d0 + 4 <= D; d0 += 4) {
            __m256 a[4][2];
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u) {
                a[u][0] = _mm256_load_ps(Ot + (d0 + u) * kLanes);
                a[u][1] = _mm256_load_ps(Ot + (d0 + u) * kLanes + 8);
            }
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
            for (int u = 0; u < 4; ++u) {
                _mm256_store_ps(Ot + (d0 + u) * kLanes, a[u][0]);
                _mm256_store_ps(Ot + (d0 + u) * kLanes + 8, a[u][1]);
            }
        }
        for (; d0 < D; ++d0) {
            __m256 a0 = _mm256_load_ps(Ot + d0 * kLanes), a1 = _mm256_load_ps(Ot + d0 * kLanes + 8);
            for (i = 0; i < nk; ++i) {
                const __m256 vb = _mm256_broadcast_ss(Vf + i * D + d0);
                a0 = _mm256_fmadd_ps(_mm256_load_ps(Sb + i * kLanes), vb, a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(Sb + i * kLanes + 8), vb, a1);
            }
            _mm256_store_ps(Ot + d0 * kLanes, a0);
            _mm256_store_ps(Ot + d0 * kLanes + 8, a1);
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
// (load_kv_row), a score as one FMA chain over d of (q * scale) . k, the same online
// softmax, and P.V as one FMA chain over the keys in key order. Only the vectorisation
// differs: 8 keys in the lanes of a score (K transposed in scratch), 8 output dims in the
// lanes of P.V, and the G heads reuse the block's converted K/V from L1.
constexpr int kRowKeyGroups = kKB / 8;

template <int KV>
void attend_row(const AttnParams& P, const StepContext& ctx, int t, int kvh, float* scratch) {
    const int D = P.D, G = P.G;
    const int s = ctx.seq_of_row[t];
    const int32_t p = ctx.positions[t];
    const int32_t lo = P.window > 0 ? int32_t(std::max<int64_t>(0, p - P.window + 1)) : 0;
    float* Kf = scratch;           // [kKB][D] the block's keys, fp32
    float* Vf = Kf + kKB * D;      // [kKB][D] its values
    float* Kt = Vf + kKB * D;      // [kRowKeyGroups][D][8] keys transposed, 8 per group
    float* Qs = Kt + kKB * D;      // [G][D] queries times the softmax scale
    float* Sg = Qs + G * D;        // [G][kKB] scores, then softmax numerators
    float* Og = Sg + G * kKB;      // [G][D] unnormalised outputs
    float* mg = Og + G * D;        // [G] running max
    float* lg = mg + G;            // [G] running sum
    for (int g = 0; g < G; ++g) {
        const float* qr = P.q + t * P.ldq + int64_t(kvh * G + g) * D;
        for (int d = 0; d < D; ++d) Qs[g * D + d] = qr[d] * P.scale;
        mg[g] = -1e30f;  // the tile's initial running max
        lg[g] = 0.0f;
    }
    std::memset(Og, 0, sizeof(float) * G * D);
    std::memset(Kf, 0, sizeof(float) * kKB * D);  // keys past the last real one score 0, unused
    const int32_t* bt = ctx.block_tables + int64_t(s) * P.B;
    const int bs = P.bs;
    for (int32_t jb = lo / kKB * kKB; jb <= p; jb += kKB) {
        const int32_t j0 = std::max(jb, lo);
        const int nk = std::min<int32_t>(jb + kKB - 1, p) - j0 + 1;
        for (int i = 0; i < nk; ++i) {
            const int32_t j = j0 + i;
            const int64_t srow = (int64_t(bt[j / bs]) * bs + j % bs) * P.Hkv + kvh;
            load_kv_row<KV>(P.Kc, P.Ks, srow, Kf + i * D, D);
            load_kv_row<KV>(P.Vc, P.Vs, srow, Vf + i * D, D);
        }
        const int ng = (nk + 7) / 8;
        for (int kg = 0; kg < ng; ++kg)
            for (int d = 0; d < D; ++d)
                for (int u = 0; u < 8; ++u) Kt[(kg * D + d) * 8 + u] = Kf[(kg * 8 + u) * D + d];
        for (int g = 0; g < G; ++g) {
            // Scores of the block's keys, 8 per accumulator, one FMA chain over d each.
            const float* qg = Qs + g * D;
            float* sg = Sg + g * kKB;
            __m256 acc[kRowKeyGroups];
#pragma GCC unroll 8
            for (int kg = 0; kg < kRowKeyGroups; ++kg) acc[kg] = _mm256_setzero_ps();
            if (ng == kRowKeyGroups) {
                for (int d = 0; d < D; ++d) {
                    const __m256 qb = _mm256_broadcast_ss(qg + d);
#pragma GCC unroll 8
                    for (int kg = 0; kg < kRowKeyGroups; ++kg)
                        acc[kg] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(Kt + (kg * D + d) * 8), acc[kg]);
                }
            } else {
                for (int d = 0; d < D; ++d) {
                    const __m256 qb = _mm256_broadcast_ss(qg + d);
                    for (int kg = 0; kg < ng; ++kg)
                        acc[kg] = _mm256_fmadd_ps(qb, _mm256_loadu_ps(Kt + (kg * D + d) * 8), acc[kg]);
                }
            }
            for (int kg = 0; kg < ng; ++kg) _mm256_storeu_ps(sg + kg * 8, acc[kg]);
            // Online softmax, as the tile does it per lane.
            float bm = mg[g];
            for (int i = 0; i < nk; ++i) bm = std::max(bm, sg[i]);
            if (bm != mg[g]) {
                const float al = exp_scalar(mg[g] - bm);
                lg[g] = lg[g] * al;
                const __m256 va = _mm256_set1_ps(al);
                float* og = Og + g * D;
                int d = 0;
                for (; d + 8 <= D; d += 8) _mm256_storeu_ps(og + d, _mm256_mul_ps(_mm256_loadu_ps(og + d), va));
                for (; d < D; ++d) og[d] = og[d] * al;
            }
            mg[g] = bm;
            const __m256 vm = _mm256_set1_ps(bm);
            for (int kg = 0; kg < ng; ++kg)
                _mm256_storeu_ps(sg + kg * 8, exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + kg * 8), vm)));
            float l = lg[g];
            for (int i = 0; i < nk; ++i) l = l + sg[i];
            lg[g] = l;
            // Og[d] += sum_i p[i] * V[i][d], keys in order.
            float* og = Og + g * D;
            int d0 = 0;
            for (; d0 + 32 <= D; d0 += 32) {
                __m256 a[4];
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u) a[u] = _mm256_loadu_ps(og + d0 + 8 * u);
                for (int i = 0; i < nk; ++i) {
                    const __m256 pb = _mm256_broadcast_ss(sg + i);
                    const float* vr = Vf + i * D + d0;
#pragma GCC unroll 4
                    for (int u = 0; u < 4; ++u) a[u] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(vr + 8 * u), a[u]);
                }
#pragma GCC unroll 4
                for (int u = 0; u < 4; ++u) _mm256_storeu_ps(og + d0 + 8 * u, a[u]);
            }
            for (; d0 + 8 <= D; d0 += 8) {
                __m256 a = _mm256_loadu_ps(og + d0);
                for (int i = 0; i < nk; ++i)
                    a = _mm256_fmadd_ps(_mm256_broadcast_ss(sg + i), _mm256_loadu_ps(Vf + i * D + d0), a);
                _mm256_storeu_ps(og + d0, a);
            }
            for (; d0 < D; ++d0) {
                float a = og[d0];
                for (int i = 0; i < nk; ++i) a = std::fma(sg[i], Vf[i * D + d0], a);
                og[d0] = a;
            }
        }
    }
    for (int g = 0; g < G; ++g) {
        const int h = kvh * G + g;
        const float sink = P.sinks ? std::exp(P.sinks[h] - mg[g]) : 0.0f;
        const float inv = 1.0f / (lg[g] + sink);
        float* orow = P.o + t * P.ldo + int64_t(h) * D;
        for (int d = 0; d < D; ++d) orow[d] = Og[g * D + d] * inv;
    }
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
    // the other sequences (decode) go one (row, KV head) at a time. Both give the same bits
    // for a query (attend_row), so the split is free to follow the step's shape. No split of
    // a row's keys over threads: its combine would round differently from a tile's.
    int32_t* tile_start = ctx.iwork;        // [S + 1] prefix sums of tiles (x Hkv)
    int32_t* dec_rows = ctx.iwork + S + 1;  // [T] rows on the row path
    tile_start[0] = 0;
    int n_dec = 0;
    for (int s = 0; s < S; ++s) {
        const int r0 = ctx.cu_seqlens[s], r1 = ctx.cu_seqlens[s + 1];
        const int nq = (r1 - r0) * P.G;
        const int tiles = nq >= kTileMin ? (nq + kLanes - 1) / kLanes : 0;
        if (!tiles)
            for (int t = r0; t < r1; ++t) dec_rows[n_dec++] = t;
        tile_start[s + 1] = tile_start[s] + tiles * P.Hkv;
    }
    const int64_t tile_items = tile_start[S];
    const int64_t dec_items = int64_t(n_dec) * P.Hkv;
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
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < dec_items; ++it)
            attend_row<KV>(P, ctx, dec_rows[it / P.Hkv], int(it % P.Hkv), scratch);
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
