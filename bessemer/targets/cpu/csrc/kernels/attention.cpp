// attention@1: paged KV cache (fp32, bf16, or int8 / fp8 E4M3 codes with a float32 scale
// per (token, KV head): kv_codec.h), GQA, causal by position, optional sliding window.
// Phase 1 stores k/v of every row into the cache (bf16: round to nearest even; int8/fp8:
// quantized with the row's dynamic scale); phase 2 computes the outputs: tiles of 16 query
// vectors with an online softmax for prefill-like sequences, one (row, head) with a
// two-pass softmax for decode rows. Quantized codes are converted in registers; their
// scales are applied once per key (K after the dot product, V inside the softmax weight).
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <cmath>
#include <limits>

#include "attention.h"
#include "attention_avx512.h"
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

    for (int32_t jb = jlo; jb <= jhi; jb += kKB) {
        const int nk = std::min<int>(kKB, jhi - jb + 1);
        for (int i = 0; i < nk; ++i) {
            const int32_t j = jb + i;
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

// ---- row path (decode and short sequences): one (row, head) ----
//
// Scores 8 keys at a time (8 dot-product accumulators, reduced together by a hadd tree);
// P.V keeps up to 64 output dims in registers while it walks the keys.
// Accumulates acc[0..8*NV) += sum_i w[i] * V[offs[i] + dc ..] (acc in memory, one load/store
// per call; the keys' V rows stream through registers).
template <int KV, int NV>
inline void pv_accum(const void* Vc, const int64_t* voff, int n, const float* w, int dc, float* acc) {
    __m256 a[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) a[v] = _mm256_loadu_ps(acc + 8 * v);
    for (int i = 0; i < n; ++i) {
        const __m256 wv = _mm256_set1_ps(w[i]);
        const int64_t off = voff[i] + dc;
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) a[v] = _mm256_fmadd_ps(wv, kv::load8<KV>(Vc, off + 8 * v), a[v]);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc + 8 * v, a[v]);
}

template <int KV>
inline void pv_block(const void* Vc, const int64_t* voff, int n, const float* w, int D, float* acc) {
    const int D8 = D & ~7;
    int dc = 0;
    for (; dc + 64 <= D8; dc += 64) pv_accum<KV, 8>(Vc, voff, n, w, dc, acc + dc);
    switch ((D8 - dc) / 8) {
        case 7: pv_accum<KV, 7>(Vc, voff, n, w, dc, acc + dc); break;
        case 6: pv_accum<KV, 6>(Vc, voff, n, w, dc, acc + dc); break;
        case 5: pv_accum<KV, 5>(Vc, voff, n, w, dc, acc + dc); break;
        case 4: pv_accum<KV, 4>(Vc, voff, n, w, dc, acc + dc); break;
        case 3: pv_accum<KV, 3>(Vc, voff, n, w, dc, acc + dc); break;
        case 2: pv_accum<KV, 2>(Vc, voff, n, w, dc, acc + dc); break;
        case 1: pv_accum<KV, 1>(Vc, voff, n, w, dc, acc + dc); break;
        default: break;
    }
    for (int d = D8; d < D; ++d) {
        float x = acc[d];
        for (int i = 0; i < n; ++i) x += w[i] * kv::load1<KV>(Vc, voff[i] + d);
        acc[d] = x;
    }
}

// One decode row, all heads, over key chunk `split` of `nsplit` of the row's key range.
// Each cached position's K (then V) row of all KV heads is contiguous, so the thread
// streams the cache in address order and reads every byte once; the G query heads of a
// KV head reuse its rows from L1. Writes o directly (partial == nullptr) or the chunk's
// (max, sum, unnormalised acc) per head into partial[h * (D + 2) ..] for the combine pass.
template <int KV>
void attend_dec(const AttnParams& P, const StepContext& ctx, int t, int split, int nsplit,
                float* scratch, int64_t ncap, float* partial) {
    using E = typename kv::Elem<KV>::T;
    const int D = P.D, G = P.G, H = P.H, Hkv = P.Hkv, bs = P.bs;
    const int D8 = D & ~7;
    const int s = ctx.seq_of_row[t];
    const int64_t p = ctx.positions[t];
    const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p - P.window + 1) : 0;
    const int64_t n_all = p - lo + 1;
    const int64_t a = lo + n_all * split / nsplit;
    const int n = int(lo + n_all * (split + 1) / nsplit - a);
    float* sc = scratch;                                             // [H][ncap]
    int64_t* offs = reinterpret_cast<int64_t*>(scratch + H * ncap);  // [ncap]
    int64_t* slot = reinterpret_cast<int64_t*>(scratch + (H + 2) * ncap);  // [ncap] x Hkv
    float* acc = scratch + (H + 4) * ncap;                           // [H][D]
    float* mx = acc + int64_t(H) * D;                                // [H]
    float* sum = mx + H;                                             // [H]
    float* kmul = sum + H;                                           // [Hkv][8]
    if (n <= 0) {
        for (int h = 0; h < H; ++h) {
            float* pp = partial + h * (D + 2);
            pp[0] = -std::numeric_limits<float>::infinity();
            pp[1] = 0.0f;
            std::memset(pp + 2, 0, sizeof(float) * D);
        }
        return;
    }
    const int32_t* bt = ctx.block_tables + int64_t(s) * P.B;
    for (int i = 0; i < n; ++i) {
        const int64_t j = a + i;
        slot[i] = (int64_t(bt[j / bs]) * bs + j % bs) * Hkv;
        offs[i] = slot[i] * D;
    }
    for (int i = n; i < ((n + 7) & ~7); ++i) {
        offs[i] = offs[0];
        slot[i] = slot[0];
    }
    const __m256 vscale = _mm256_set1_ps(P.scale);
    const E* Kc = static_cast<const E*>(P.Kc);
    const E* Vc = static_cast<const E*>(P.Vc);
    const int row_bytes = int(P.row_elems * sizeof(E));
    constexpr int kPfKeys = 16;  // software prefetch distance (rows), across page breaks
    // Scores, 8 positions at a time.
    for (int i0 = 0; i0 < n; i0 += 8) {
        const int64_t* ko = offs + i0;
        for (int u = 0; u < 8 && i0 + kPfKeys + u < n; ++u) {
            const char* kp = reinterpret_cast<const char*>(Kc + offs[i0 + kPfKeys + u]);
            for (int b = 0; b < row_bytes; b += 64) _mm_prefetch(kp + b, _MM_HINT_T0);
        }
        if (P.dec512) {
            for (int kvh = 0; kvh < Hkv; ++kvh)
                for (int u = 0; u < 8; ++u)
                    kmul[kvh * 8 + u] = kv::coded<KV>() ? P.Ks[slot[i0 + u] + kvh] * (P.scale * kv::value_mul<KV>())
                                                        : P.scale;
            attn_dec_scores8_avx512(KV, Kc, ko, P.q + t * P.ldq, H, Hkv, D, kmul, sc + i0, ncap);
            continue;
        }
        for (int kvh = 0; kvh < Hkv; ++kvh) {
            const E* Kk = Kc + int64_t(kvh) * D;
            // Per-key multiplier: the softmax scale, times the key's scale for codes.
            __m256 kmul = vscale;
            if constexpr (kv::coded<KV>()) {
                alignas(32) float ks[8];
                for (int u = 0; u < 8; ++u) ks[u] = P.Ks[slot[i0 + u] + kvh];
                kmul = _mm256_mul_ps(_mm256_load_ps(ks), _mm256_set1_ps(P.scale * kv::value_mul<KV>()));
            }
            for (int g = 0; g < G; ++g) {
                const int h = kvh * G + g;
                const float* qr = P.q + t * P.ldq + int64_t(h) * D;
                __m256 x[8];
#pragma GCC unroll 8
                for (int u = 0; u < 8; ++u) x[u] = _mm256_setzero_ps();
                for (int d = 0; d < D8; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qr + d);
#pragma GCC unroll 8
                    for (int u = 0; u < 8; ++u) x[u] = _mm256_fmadd_ps(qv, kv::load8<KV>(Kk, ko[u] + d), x[u]);
                }
                const __m256 t0 = _mm256_hadd_ps(_mm256_hadd_ps(x[0], x[1]), _mm256_hadd_ps(x[2], x[3]));
                const __m256 t1 = _mm256_hadd_ps(_mm256_hadd_ps(x[4], x[5]), _mm256_hadd_ps(x[6], x[7]));
                __m256 v = _mm256_add_ps(_mm256_permute2f128_ps(t0, t1, 0x20), _mm256_permute2f128_ps(t0, t1, 0x31));
                if (D8 < D) {
                    alignas(32) float tail[8];
                    for (int u = 0; u < 8; ++u) {
                        float e = 0.0f;
                        for (int d = D8; d < D; ++d) e += qr[d] * kv::load1<KV>(Kk, ko[u] + d);
                        tail[u] = e;
                    }
                    v = _mm256_add_ps(v, _mm256_load_ps(tail));
                }
                _mm256_storeu_ps(sc + h * ncap + i0, _mm256_mul_ps(v, kmul));
            }
        }
    }
    // Softmax numerators per head.
    for (int h = 0; h < H; ++h) {
        float* sg = sc + h * ncap;
        __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
        int i = 0;
        for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(sg + i));
        float m = hmax256(vmax);
        for (; i < n; ++i) m = std::max(m, sg[i]);
        const __m256 vm = _mm256_set1_ps(m);
        __m256 vsum = _mm256_setzero_ps();
        for (i = 0; i + 8 <= n; i += 8) {
            const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + i), vm));
            _mm256_storeu_ps(sg + i, e);
            vsum = _mm256_add_ps(vsum, e);
        }
        float l = hsum256(vsum);
        for (; i < n; ++i) {
            sg[i] = exp_scalar(sg[i] - m);
            l += sg[i];
        }
        mx[h] = m;
        sum[h] = l;
        if constexpr (kv::coded<KV>()) {  // V's scale joins the weight (after the sum)
            const float* vsc = P.Vs + h / G;
            const float mul = kv::value_mul<KV>();
            for (i = 0; i < n; ++i) sg[i] *= vsc[slot[i]] * mul;
        }
    }
    // P.V in blocks of 32 positions (their V rows stay in L1/L2 across the heads).
    std::memset(acc, 0, sizeof(float) * H * D);
    for (int kb = 0; kb < n; kb += 32) {
        const int nb = std::min(32, n - kb);
        for (int i = 0; i < nb && kb + 32 + i < n; ++i) {
            const char* vp = reinterpret_cast<const char*>(Vc + offs[kb + 32 + i]);
            for (int b = 0; b < row_bytes; b += 64) _mm_prefetch(vp + b, _MM_HINT_T0);
        }
        if (P.dec512)  // the G query heads of a KV head together: each V element converted once
            for (int kvh = 0; kvh < Hkv; ++kvh)
                attn_dec_pv_avx512(KV, Vc + int64_t(kvh) * D, offs + kb, nb, sc + kvh * G * ncap + kb, ncap, G, D,
                                   acc + int64_t(kvh) * G * D);
        else
            for (int h = 0; h < H; ++h)
                pv_block<KV>(Vc + int64_t(h / G) * D, offs + kb, nb, sc + h * ncap + kb, D, acc + h * D);
    }
    for (int h = 0; h < H; ++h) {
        const float* ah = acc + h * D;
        if (partial) {
            float* pp = partial + h * (D + 2);
            pp[0] = mx[h];
            pp[1] = sum[h];
            std::memcpy(pp + 2, ah, sizeof(float) * D);
        } else {
            const float sink = P.sinks ? std::exp(P.sinks[h] - mx[h]) : 0.0f;
            const float inv = 1.0f / (sum[h] + sink);
            float* orow = P.o + t * P.ldo + int64_t(h) * D;
            for (int d = 0; d < D; ++d) orow[d] = ah[d] * inv;
        }
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
    // the other sequences (decode) go one row (all heads) at a time, their key range split
    // into chunks when there are too few rows to keep the threads busy.
    int32_t* tile_start = ctx.iwork;        // [S + 1] prefix sums of tiles (x Hkv)
    int32_t* dec_rows = ctx.iwork + S + 1;  // [T] rows on the decode path
    tile_start[0] = 0;
    int n_dec = 0;
    int64_t max_keys = 1;
    for (int s = 0; s < S; ++s) {
        const int r0 = ctx.cu_seqlens[s], r1 = ctx.cu_seqlens[s + 1];
        const int nq = (r1 - r0) * P.G;
        const int tiles = nq >= kTileMin ? (nq + kLanes - 1) / kLanes : 0;
        if (!tiles)
            for (int t = r0; t < r1; ++t) {
                dec_rows[n_dec++] = t;
                const int64_t p = ctx.positions[t];
                const int64_t lo = P.window > 0 ? std::max<int64_t>(0, p - P.window + 1) : 0;
                max_keys = std::max<int64_t>(max_keys, p - lo + 1);
            }
        tile_start[s + 1] = tile_start[s] + tiles * P.Hkv;
    }
    const int64_t tile_items = tile_start[S];
    int nsplit = 1;
    if (n_dec > 0 && n_dec < 2 * nt && ctx.fwork) {
        // chunks of >= 64 keys: at short context one decode row is still ~20 us of work on
        // one core while the other waits (measured: SmolLM2 decode, 14% of the step)
        nsplit = int(std::min<int64_t>((4 * nt + n_dec - 1) / n_dec, (max_keys + 63) / 64));
        nsplit = std::max(1, std::min(nsplit, 4 * nt));
        if (int64_t(n_dec) * P.H * nsplit * (P.D + 2) > ctx.fwork_len) nsplit = 1;
    }
    const int64_t dec_items = int64_t(n_dec) * nsplit;
    const int64_t ncap = (std::min<int64_t>(max_keys, (max_keys + nsplit - 1) / nsplit + 1) + 15) / 16 * 16 + 16;
    const int64_t total = tile_items + dec_items;
    const int D = P.D, H = P.H;

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
        for (int64_t it = 0; it < dec_items; ++it) {
            const int r = int(it / nsplit), split = int(it % nsplit);
            float* partial = nsplit > 1 ? ctx.fwork + (int64_t(r) * nsplit + split) * H * int64_t(D + 2) : nullptr;
            attend_dec<KV>(P, ctx, dec_rows[r], split, nsplit, scratch, ncap, partial);
        }
        if (nsplit > 1) {
            // Combine the chunks: o = sum_c e^(m_c - M) acc_c / sum_c e^(m_c - M) l_c.
#pragma omp for schedule(static)
            for (int64_t it = 0; it < int64_t(n_dec) * H; ++it) {
                const int r = int(it / H), h = int(it % H);
                const float* base = ctx.fwork + int64_t(r) * nsplit * H * int64_t(D + 2) + int64_t(h) * (D + 2);
                const int64_t cstride = int64_t(H) * (D + 2);
                float M = -std::numeric_limits<float>::infinity();
                for (int c = 0; c < nsplit; ++c) M = std::max(M, base[c * cstride]);
                float* orow = P.o + dec_rows[r] * P.ldo + int64_t(h) * D;
                float l = 0.0f;
                for (int d = 0; d < D; ++d) orow[d] = 0.0f;
                for (int c = 0; c < nsplit; ++c) {
                    const float* pc = base + c * cstride;
                    if (pc[1] == 0.0f) continue;  // empty chunk
                    const float f = std::exp(pc[0] - M);
                    l += pc[1] * f;
                    for (int d = 0; d < D; ++d) orow[d] += pc[2 + d] * f;
                }
                if (P.sinks) l += std::exp(P.sinks[h] - M);  // once, after the chunks
                const float inv = 1.0f / l;
                for (int d = 0; d < D; ++d) orow[d] *= inv;
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
