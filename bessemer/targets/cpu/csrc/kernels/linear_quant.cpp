// linear_w8a16@1 and linear_w4a16@1: fp32 activations times int8 / int4 weight codes.
//
//   w8: q int8 panel16 [N, K], scales [N]:        y = (x @ q^T) * scales (+ bias)
//   w4: codes int4 panel16_int4 [N, K], scales and offsets panel16 [N, K/G]:
//       y = sum_g scales[:, g] * (x_g @ codes_g^T) + offsets[:, g] * sum(x_g) (+ bias)
//
// linear_w4a16@3: symmetric codes without offsets, w = scales * (code - 8): weights codes,
// scales (bf16 or fp32) [, bias]; otherwise @2. The bf16 kernel folds the -8 into its
// epilogue; the fp32 kernels get offsets = -8 * scales made once at prepare.
//
// linear_w4a16@2: the same weights and formula with x rounded to bf16 first (xb), so the
// dot products run on vdpbf16ps (linear_w4_bf16_avx512.cpp: twice the products per
// instruction and a cheaper code decode; measured on SmolLM2 in bench/kernel_speed.py).
// A CPU without AVX512_BF16 + VBMI runs @2 as the @1 microkernels on xb, so an engine
// computes the same products everywhere.
//
// This file holds prepare/run (ISA dispatch) and the AVX2 microkernels; the AVX-512 ones
// live in linear_quant_avx512.cpp. Both run under the blocking/threading driver of
// linear@1 (linear_driver.h). The codes are widened to fp32 (their exact integer values)
// and accumulated with fp32 FMAs exactly like linear@1; the per-channel / per-group scale
// (and offset * row sum) is applied once per group in the microkernel epilogue. The AVX2
// kernels widen the codes in registers inside the k loop for a GEMV; for a row block of
// several 6-row chunks they widen a panel's K block once into a per-thread fp32 buffer that
// every chunk reads (PanelPredecode), since widening again per chunk cost about as much as
// the FMAs. Same values, same FMA order: both paths give the same bits. Likewise, with bf16
// activations in groups of 32, 64 or 128 each group's sum(x_g) is made once per prepared
// block (round_rows_to_bf16_f32_sums) instead of per panel group and chunk, by the same
// arithmetic (sum_avx2), so the same bits.
#include <algorithm>
#include <cstring>

#include "kernels.h"
#include "linear_driver.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

// ---------------------------------------------------------------- prepare / run
namespace {
struct W8Params : KernelParams {
    int N, K;
};

struct W4Params : KernelParams {
    int N, K, G;
    bool bf16_kernel;   // linear_w4_bf16_avx512 reads the stored codes and parameters
    bool k8;            // codes stored panel16_int4_k8
    bool bf16_params;   // scales/offsets stored bf16
    bool symmetric;     // @3: no offsets stored, w = scale * (code - 8)
    bool params_as_stored;  // the AVX2 kernel reads scales/offsets as stored (fp32 or bf16)
    // Weights re-laid (codes) or widened (fp32 parameters) once at prepare for a CPU that
    // lacks the kernel their stored form was chosen for (empty otherwise); run reads them
    // instead of the mapped file.
    std::vector<uint8_t> relaid;
    std::vector<float> relaid_f;
};
}  // namespace

void prepare_linear_w8a16(KernelCall& c, const PlanInfo& p) {
    int N, K;
    expect_linear(c, p, 2, 3, &N, &K);
    expect_weight(c, 0, {DT_I8}, {LAYOUT_PANEL16}, {int64_t(N), int64_t(K)});
    expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (c.weights.size() == 3) expect_weight(c, 2, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    W8Params& a = c.set_params<W8Params>();
    a.N = N;
    a.K = K;
}

void run_linear_w8a16(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const W8Params& a = c.get<W8Params>();
    const int N = a.N, K = a.K;
    const auto* q = static_cast<const int8_t*>(c.weights[0]->data);
    const auto* scales = static_cast<const float*>(c.weights[1]->data);
    const float* bias = c.weights.size() == 3 ? static_cast<const float*>(c.weights[2]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    if (ctx.isa == Isa::AVX512)
        linear_w8_avx512(x, ctx.ld(c.ins[0]), M, q, scales, N, K, bias, y, ctx.ld(c.outs[0]), ctx.nthreads);
    else
        linear_w8_avx2(x, ctx.ld(c.ins[0]), M, q, scales, N, K, bias, y, ctx.ld(c.outs[0]), ctx.nthreads);
}

void prepare_linear_w4a16(KernelCall& c, const PlanInfo& p) {
    const bool sym = c.version >= 3;  // no offsets tensor: w = scale * (code - 8)
    const int np = sym ? 1 : 2;       // group parameter tensors after the codes
    int N, K;
    expect_linear(c, p, 1 + np, 2 + np, &N, &K);
    const int64_t G = attr_int(c, "group_size");
    if (G <= 0 || G > K || K % G != 0)
        kernel_error(c, "group_size " + std::to_string(G) + " must be > 0 and divide K = " + std::to_string(K));
    if (G % 16 != 0 && G != K)
        kernel_error(c, "group_size " + std::to_string(G) + " must be a multiple of 16 or equal K = " +
                            std::to_string(K));
    // @2 also reads panel16_int4_k8 codes and bf16 scales/offsets (what the builder writes
    // for it); @1 only panel16_int4 and fp32.
    if (c.version >= 2) {
        expect_weight(c, 0, {DT_I4}, {LAYOUT_PANEL16_INT4, LAYOUT_PANEL16_INT4_K8}, {int64_t(N), int64_t(K)});
        expect_weight(c, 1, {DT_F32, DT_BF16}, {LAYOUT_PANEL16}, {int64_t(N), K / G});
        if (!sym) {
            expect_weight(c, 2, {DT_F32, DT_BF16}, {LAYOUT_PANEL16}, {int64_t(N), K / G});
            if (c.weights[1]->dtype != c.weights[2]->dtype)
                kernel_error(c, "scales and offsets must have the same dtype");
        }
    } else {
        expect_weight(c, 0, {DT_I4}, {LAYOUT_PANEL16_INT4}, {int64_t(N), int64_t(K)});
        expect_weight(c, 1, {DT_F32}, {LAYOUT_PANEL16}, {int64_t(N), K / G});
        expect_weight(c, 2, {DT_F32}, {LAYOUT_PANEL16}, {int64_t(N), K / G});
    }
    // k8 codes have K % 8 == 0 (tensor check), so G (a multiple of 16, or K) is one of 8 too.
    const bool k8 = c.weights[0]->layout == LAYOUT_PANEL16_INT4_K8;
    if (int(c.weights.size()) == np + 2) expect_weight(c, np + 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (c.version >= 2 && G > linear_w4a16_v2_max_group())
        kernel_error(c, "group_size " + std::to_string(G) + " is larger than linear_w4a16@2 supports (" +
                            std::to_string(linear_w4a16_v2_max_group()) + "); rebuild with a smaller --group-size");
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    W4Params& a = c.set_params<W4Params>();
    a.N = N;
    a.K = K;
    a.G = int(G);
    a.bf16_kernel = c.version >= 2 && p.isa == Isa::AVX512 && linear_w4_bf16_avx512_available(k8);
    a.k8 = k8;
    // The fp32 kernels read panel16_int4 only: on a CPU without the bf16 kernel, k8 codes
    // are re-laid once here (the int4 codes' size again in memory, never per step).
    if (k8 && !a.bf16_kernel) {
        a.relaid.resize(size_t((N + 15) / 16) * size_t(K) * 8);
        repack_int4_k8_to_panel16(static_cast<const uint8_t*>(c.weights[0]->data), N, K, a.relaid.data());
    }
    // The AVX2 kernel reads the parameters as stored (bf16 widened in registers, a symmetric
    // offset made from its scale): in a decode GEMV of g32 codes, fp32 scales and offsets
    // were a third of the bytes read. For AVX-512's fp32 kernel bf16 scales/offsets are
    // widened to fp32 once: [scales | offsets], half each; symmetric codes get their offsets
    // -8 * scales there.
    a.bf16_params = c.weights[1]->dtype == DT_BF16;
    a.symmetric = sym;
    a.params_as_stored = p.isa != Isa::AVX512 && !a.bf16_kernel;
    if ((a.bf16_params || sym) && p.isa == Isa::AVX512 && !a.bf16_kernel) {
        const size_t n = size_t((N + 15) / 16 * 16) * size_t(K / G);
        a.relaid_f.resize(2 * n);
        for (int w = 0; w < np; ++w) {
            const void* src = c.weights[1 + w]->data;
            for (size_t i = 0; i < n; ++i) {
                if (a.bf16_params) {
                    const uint32_t u = uint32_t(static_cast<const uint16_t*>(src)[i]) << 16;
                    std::memcpy(&a.relaid_f[w * n + i], &u, 4);
                } else {
                    a.relaid_f[w * n + i] = static_cast<const float*>(src)[i];
                }
            }
        }
        if (sym)
            for (size_t i = 0; i < n; ++i) a.relaid_f[n + i] = -8.0f * a.relaid_f[i];
    }
}

void run_linear_w4a16(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const W4Params& a = c.get<W4Params>();
    const int N = a.N, K = a.K, G = a.G;
    const auto* codes = a.relaid.empty() ? static_cast<const uint8_t*>(c.weights[0]->data) : a.relaid.data();
    const size_t nw = a.symmetric ? 3 : 4;  // with a bias
    const float* bias = c.weights.size() == nw ? static_cast<const float*>(c.weights[nw - 1]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    const bool round_x = c.version >= 2;  // @2, @3: bf16 activations
    if (a.bf16_kernel) {  // codes and parameters as stored (no offsets: symmetric)
        linear_w4_bf16_avx512(x, ctx.ld(c.ins[0]), M, codes, a.k8, c.weights[1]->data,
                              a.symmetric ? nullptr : c.weights[2]->data, a.bf16_params, G, N, K, bias, y,
                              ctx.ld(c.outs[0]), ctx.nthreads);
        return;
    }
    // panel16_int4 codes (re-laid at prepare if stored as k8)
    if (a.params_as_stored) {
        const auto* scales = static_cast<const float*>(c.weights[1]->data);
        const auto* offsets = a.symmetric ? nullptr : static_cast<const float*>(c.weights[2]->data);
        linear_w4_avx2(x, ctx.ld(c.ins[0]), M, codes, scales, offsets, G, N, K, bias, y, ctx.ld(c.outs[0]),
                       ctx.nthreads, round_x, a.bf16_params ? 2 : 4);
        return;
    }
    // AVX-512's fp32 kernel (prepared for the executor's ISA, which run shares): fp32
    // parameters, widened at prepare if stored as bf16 or symmetric
    const float* scales = a.relaid_f.empty() ? static_cast<const float*>(c.weights[1]->data) : a.relaid_f.data();
    const float* offsets =
        a.relaid_f.empty() ? static_cast<const float*>(c.weights[2]->data) : a.relaid_f.data() + a.relaid_f.size() / 2;
    linear_w4_avx512(x, ctx.ld(c.ins[0]), M, codes, scales, offsets, G, N, K, bias, y, ctx.ld(c.outs[0]),
                     ctx.nthreads, round_x);
}

int linear_w4a16_v2_max_group() { return kXPrepMaxGroup; }

void repack_int4_k8_to_panel16(const uint8_t* k8, int N, int K, uint8_t* out) {
    // k8: per (panel, 8-k block) 64 bytes, row r at k = 4h + 2t + e in nibble t of byte
    // 4r + 2e + h; panel16_int4: per (panel, k) 8 bytes, row j low nibble, row 8 + j high.
    const int P = (N + 15) / 16, nb = K / 8;
    for (int p = 0; p < P; ++p)
        for (int b = 0; b < nb; ++b) {
            const uint8_t* blk = k8 + (int64_t(p) * nb + b) * 64;
            for (int o = 0; o < 8; ++o) {
                const int h = o >> 2, t = (o >> 1) & 1, e = o & 1;
                uint8_t* dst = out + (int64_t(p) * K + 8 * b + o) * 8;
                for (int j = 0; j < 8; ++j) {
                    const int lo = (blk[4 * j + 2 * e + h] >> (4 * t)) & 15;
                    const int hi = (blk[4 * (8 + j) + 2 * e + h] >> (4 * t)) & 15;
                    dst[j] = uint8_t(lo | (hi << 4));
                }
            }
        }
}

void round_rows_to_bf16_f32(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq) {
    for (int r = 0; r < rows; ++r) {
        const float* s = x + r * ldx;
        float* d = static_cast<float*>(out) + r * ldq;
        for (int i = 0; i < kc; ++i) {
            uint32_t u;
            std::memcpy(&u, s + i, 4);
            if ((u & 0x7F800000u) == 0) u &= 0x80000000u;  // denormal -> signed zero
            else if ((u & 0x7FFFFFFFu) <= 0x7F800000u) u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
            else u |= 0x00400000u;  // NaN stays a (quiet) NaN
            std::memcpy(d + i, &u, 4);
        }
        for (int64_t i = kc; i < ldq; ++i) d[i] = 0.0f;
    }
}

// ---------------------------------------------------------------- AVX2
namespace {

constexpr int kMR2 = 6;  // rows per microkernel
constexpr int kNR2 = 2;  // max panels per microkernel (2 only for M <= 2)

enum QKind { Q8 = 0, Q4 = 1 };

// 16 weights of one panel at one k, as fp32 (rows 0-7, rows 8-15).
template <int QK>
inline void decode16(const char* p, int k, __m256& w0, __m256& w1) {
    if (QK == Q8) {
        const char* b = p + k * 16;
        w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
        w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8))));
    } else {  // byte j: row j in the low nibble, row 8 + j in the high nibble
        const __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + k * 8)));
        w0 = _mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(0xF)));
        w1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4));
    }
}

inline float sum_avx2(const float* p, int n) {
    __m256 s = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(p + i));
    float r = hsum256(s);
    for (; i < n; ++i) r += p[i];
    return r;
}

// Prepared x blocks of linear_w4a16@2/@3 in groups of S columns (QuantParams::x_sums = S):
// each row of kc bf16-rounded values (fp32, even padded) is followed by its groups' sums,
// sum_avx2 of the same values the microkernel would otherwise sum per panel group and 6-row
// chunk, made once per block instead. A block is whole groups (linear_driver.h).
inline int64_t group_sums_at(int kc) { return (kc + 1) / 2 * 2; }

template <int S>
void round_rows_to_bf16_f32_sums(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq) {
    round_rows_to_bf16_f32(x, ldx, rows, kc, out, ldq);
    for (int r = 0; r < rows; ++r) {
        float* d = static_cast<float*>(out) + r * ldq;
        for (int j = 0; j < kc / S; ++j) d[group_sums_at(kc) + j] = sum_avx2(d + j * S, S);
    }
}

// The fp32 values of decode16<QK> for nr panels over kc k (a PanelDecodeFn: the same bits
// the microkernel widens in registers, decoded once for UkArgs::wdec).
template <int QK>
void decode_panels_q(const void* w, int64_t pstride, int nr, int kc, float* out) {
    const char* p = static_cast<const char*>(w);
    store_decoded_panels(nr, kc, out,
                         [&](int n, int k, __m256& w0, __m256& w1) { decode16<QK>(p + n * pstride, k, w0, w1); });
}

// Parameter i of p as fp32: stored fp32 (pbytes 4) or bf16 (pbytes 2, widened exactly).
inline float param_value(const float* p, int64_t i, int pbytes) {
    if (pbytes == 4) return p[i];
    const uint32_t u = uint32_t(reinterpret_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Parameters i..i+15 of p as two fp32 vectors (see param_value).
inline __attribute__((always_inline)) void load_params16(const float* p, int64_t i, int pbytes, __m256& v0,
                                                         __m256& v1) {
    if (pbytes == 4) {
        v0 = _mm256_loadu_ps(p + i);
        v1 = _mm256_loadu_ps(p + i + 8);
        return;
    }
    const auto* h = reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(p) + i);
    v0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16));
    v1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)), 16));
}

// One call covers a.kc columns of K: a.kc / G groups (w8: one group of kc, per-channel
// scales). Per group: fp32 dot of x with the codes (DEC: read decoded from a.wdec, else
// widened here per k), then w4: y (+)= scale * dot + offset * sum(x_g) (SUMS: sum(x_g) read
// from the prepared block, round_rows_to_bf16_f32_sums); w8: y = the running dot until the
// last K block, which stores scale * dot. Plus the bias after the last group of the last K
// block.
template <int MR, int NR, int QK, bool SUMS, bool DEC>
inline __attribute__((always_inline)) void ukr_q_avx2_body(const UkArgs& a) {
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    const int G = QK == Q4 ? a.group : a.kc;
    const int ng = a.kc / G;
    constexpr int kBytes = QK == Q8 ? 16 : 8;  // weight bytes per panel and k
    // GEMV (a.pf_next != 0): prefetch the next panel group's codes (a.pf_next bytes ahead,
    // once per cache line) and its parameters (pq_len of them at pq_s / pq_o, pq_step per
    // cache-line step of the k loop); see UkArgs::pf_next.
    constexpr int kLineK = 64 / kBytes;  // k per cache line of a panel's codes
    // int4 parameters are fp32 or bf16 (a.pbytes), their offsets absent for symmetric codes
    const int pb = QK == Q4 ? a.pbytes : 4;
    const int pq_inc = 64 / pb;  // parameters per cache line
    const int64_t pq_len = a.pf_next ? (QK == Q4 ? NR * a.qpstride : NR * 16) : 0;
    const char* pq_s = reinterpret_cast<const char*>(param_at(a.qs, pq_len, pb));
    const char* pq_o = QK == Q4 && a.qo ? reinterpret_cast<const char*>(param_at(a.qo, pq_len, pb)) : nullptr;
    const int64_t k_lines = (a.kc + kLineK - 1) / kLineK;
    const int64_t pq_step = (pq_len / pq_inc + k_lines - 1) / k_lines * pq_inc;
    // int8 (one group, per-channel scales): a later K block starts from the unscaled partial
    // sums the previous one stored in y, and only the last block scales them and adds the
    // bias, so a row's sum is one FMA chain over k = 0..K-1 whatever the K blocking. int4:
    // each whole group is summed from zero and added to y in group order, which K blocks of
    // whole groups do not change either.
    const bool resume = QK == Q8 && a.accumulate;
    for (int g = 0; g < ng; ++g) {
        __m256 acc[MR][NR][2];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) {
                const int nc = a.ncols - n * 16;
                if (resume && nc > 0)
                    load_partial16(a.y + r * a.ldy + n * 16, nc, acc[r][n][0], acc[r][n][1]);
                else
                    acc[r][n][0] = acc[r][n][1] = _mm256_setzero_ps();
            }
        const int k0 = g * G, k1 = k0 + G;
        for (int k = k0; k < k1; ++k) {
            if (a.pf_next && (k & (kLineK - 1)) == 0) {
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) _mm_prefetch(wp[n] + k * kBytes + a.pf_next, _MM_HINT_T0);
                const int64_t i0 = (k / kLineK) * pq_step, i1 = i0 + pq_step < pq_len ? i0 + pq_step : pq_len;
                for (int64_t i = i0; i < i1; i += pq_inc) {
                    _mm_prefetch(pq_s + i * pb, _MM_HINT_T0);
                    if (pq_o) _mm_prefetch(pq_o + i * pb, _MM_HINT_T0);
                }
            }
            __m256 wv[NR][2];
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n)
                if (DEC)
                    load_decoded16(a.wdec, a.kc, n, k, wv[n][0], wv[n][1]);
                else
                    decode16<QK>(wp[n], k, wv[n][0], wv[n][1]);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                const __m256 xb = _mm256_broadcast_ss(xr[r] + k);
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) {
                    acc[r][n][0] = _mm256_fmadd_ps(xb, wv[n][0], acc[r][n][0]);
                    acc[r][n][1] = _mm256_fmadd_ps(xb, wv[n][1], acc[r][n][1]);
                }
            }
        }
        float sx[MR];
        if (QK == Q4)
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) sx[r] = SUMS ? xr[r][group_sums_at(a.kc) + g] : sum_avx2(xr[r] + k0, G);
        const bool load_y = QK == Q4 && (g > 0 || a.accumulate);
        const float* bias = g == ng - 1 ? a.bias : nullptr;
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int col0 = n * 16;
            const int nc = a.ncols - col0;
            if (nc <= 0) break;
            if (QK == Q8 && !a.last) {  // partial sums, finished by the last K block
#pragma GCC unroll 8
                for (int r = 0; r < MR; ++r) store_partial16(a.y + r * a.ldy + col0, nc, acc[r][n][0], acc[r][n][1]);
                continue;
            }
            const int64_t pi = QK == Q4 ? n * a.qpstride + g * 16 : col0;  // parameter index
            if (nc >= 16) {
                __m256 s0, s1, o0 = _mm256_setzero_ps(), o1 = o0;
                load_params16(a.qs, pi, pb, s0, s1);
                if (QK == Q4) {
                    if (a.qo) {
                        load_params16(a.qo, pi, pb, o0, o1);
                    } else {  // symmetric: -8 * scale, exact (what a widened offsets table holds)
                        o0 = _mm256_mul_ps(s0, _mm256_set1_ps(-8.0f));
                        o1 = _mm256_mul_ps(s1, _mm256_set1_ps(-8.0f));
                    }
                }
#pragma GCC unroll 8
                for (int r = 0; r < MR; ++r) {
                    float* yp = a.y + r * a.ldy + col0;
                    __m256 v0 = _mm256_mul_ps(acc[r][n][0], s0), v1 = _mm256_mul_ps(acc[r][n][1], s1);
                    if (QK == Q4) {
                        const __m256 sb = _mm256_set1_ps(sx[r]);
                        v0 = _mm256_fmadd_ps(o0, sb, v0);
                        v1 = _mm256_fmadd_ps(o1, sb, v1);
                    }
                    if (load_y) {
                        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(yp));
                        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(yp + 8));
                    }
                    if (bias) {
                        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(bias + col0));
                        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(bias + col0 + 8));
                    }
                    _mm256_storeu_ps(yp, v0);
                    _mm256_storeu_ps(yp + 8, v1);
                }
            } else {
#pragma GCC unroll 8
                for (int r = 0; r < MR; ++r) {
                    alignas(32) float tmp[16];
                    _mm256_store_ps(tmp, acc[r][n][0]);
                    _mm256_store_ps(tmp + 8, acc[r][n][1]);
                    float* yp = a.y + r * a.ldy + col0;
                    for (int j = 0; j < nc; ++j) {
                        const float sj = param_value(a.qs, pi + j, pb);
                        float val = tmp[j] * sj;
                        if (QK == Q4) val = std::fma(a.qo ? param_value(a.qo, pi + j, pb) : -8.0f * sj, sx[r], val);
                        if (load_y) val += yp[j];
                        if (bias) val += bias[col0 + j];
                        yp[j] = val;
                    }
                }
            }
        }
    }
}

template <int MR, int NR, int QK, bool SUMS>
void ukr_q_avx2(const UkArgs& a) {
    if (a.wdec)
        ukr_q_avx2_body<MR, NR, QK, SUMS, true>(a);
    else
        ukr_q_avx2_body<MR, NR, QK, SUMS, false>(a);
}

template <int QK, bool SUMS = false>
struct UkTableQ2 {
    UkFn f[(kMR2 + 1) * (kNR2 + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR2 + 1) + NR] = ukr_q_avx2<MR, NR, QK, SUMS>; }
    constexpr UkTableQ2() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>(); set<5, 1>(); set<6, 1>();
        set<1, 2>(); set<2, 2>();
    }
};

const UkTableQ2<Q8> kTableW8;
const UkTableQ2<Q4> kTableW4;
const UkTableQ2<Q4, true> kTableW4Sums;

// The activation preparation of linear_w4a16 in groups of G: none (x as is), or bf16
// rounding (round_x), followed by the groups' sums (x_sums = G) for the builder's sizes.
struct W4Prep {
    XPrepFn fn;
    int x_sums;
};
W4Prep w4_prep(int G, bool round_x) {
    if (!round_x) return {nullptr, 0};
    switch (G) {
        case 32: return {round_rows_to_bf16_f32_sums<32>, 32};
        case 64: return {round_rows_to_bf16_f32_sums<64>, 64};
        case 128: return {round_rows_to_bf16_f32_sums<128>, 128};
        default: return {round_rows_to_bf16_f32, 0};
    }
}

}  // namespace

void linear_w8_avx2(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N, int K,
                    const float* bias, float* y, int64_t ldy, int nthreads) {
    const QuantParams qp{scales, nullptr, 0};
    linear_drive_q(x, ldx, M, q, 16, N, K, bias, y, ldy, nthreads, kMR2, M <= 2 ? 2 : 1, kTableW8.f, kNR2 + 1,
                   &qp, nullptr, 0, decode_panels_q<Q8>);
}

void linear_w4_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                    const float* offsets, int group, int N, int K, const float* bias, float* y, int64_t ldy,
                    int nthreads, bool round_x, int pbytes) {
    const W4Prep prep = w4_prep(group, round_x);
    QuantParams qp{scales, offsets, group};
    qp.pbytes = pbytes;
    qp.x_sums = prep.x_sums;
    // Decode reads each panel's codes in one K pass: a Llama-1B layer's four GEMVs (g32, from
    // DRAM) took 21% less time on 2 threads of a Zen 3 than in K blocks of 512, whose cuts
    // restart the panel streams (bench/kernel_speed.py --gemm-shapes llama-1b).
    qp.gemv_one_pass = true;
    linear_drive_q(x, ldx, M, codes, 8, N, K, bias, y, ldy, nthreads, kMR2, M <= 2 ? 2 : 1,
                   prep.x_sums ? kTableW4Sums.f : kTableW4.f, kNR2 + 1, &qp, prep.fn, 4, decode_panels_q<Q4>);
}

}  // namespace bessemer
