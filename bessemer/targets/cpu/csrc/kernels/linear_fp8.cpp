// linear_fp8@1: E4M3 activations (static per-tensor scale) times E4M3 weights
// (per-output-channel scales), fp32 accumulation.
//
//   weights: codes float8_e4m3 panel16 [N, K], scales f32 [N], input_scale f32 [1], bias?
//   y = (e4m3(x / s_x) @ decode(codes)^T) * s_x * scales (+ bias)
//
// linear_fp8@2: the same with a dynamic scale per token (row), computed in the kernel from
// the row itself: s_x[t] = max_k |x[t, k]| / 448 (1 for an all-zero row); weights codes,
// scales, bias? (no input_scale: nothing to calibrate, nothing to saturate on unseen text).
// Attr act_group G (16, 32, 64 or 128; @2 only): each group of G columns of a row is quantized
// with s_x[t] * 2^-e, e = the largest integer in [0, 64] with max|x[t, group]| * 2^e <=
// max|x[t]| (quantization/fp8.py group_exponents): a group far below the row's outlier keeps
// E4M3's full precision instead of falling into its subnormals.
//
// e4m3(v): round to nearest even on the E4M3FN grid, saturating at +-448 (the reference is
// quantization/fp8.py). The activations are quantized once per thread and block by the
// driver (linear_driver.h, linear_fp8_family.h). The AVX2 kernel converts the weight bytes
// in registers for a GEMV; for a row block of several 6-row chunks it converts a panel's K
// block once into a per-thread fp32 buffer (L2) that every chunk reads, since converting
// them again per chunk cost about as much as the FMAs (SmolLM2 fp8 prefill 0.6-0.7x CPU).
// E4M3 values and their products are exact in fp32 (and in bf16), so the kernels differ
// from the reference only by the fp32 summation order, which neither path changes.
//
// This file: prepare/run (ISA dispatch) and the AVX2 kernel. Weight byte b -> fp16 bits
// ((b & 0x7F) << 7 | (b & 0x80) << 8) is the E4M3 value times 2^-8 exactly (subnormals
// included: fp16 has the wider exponent), widened by vcvtph2ps; the 2^8 is folded into
// the epilogue's scale. The AVX-512 kernel (linear_fp8_avx512.cpp) needs AVX512_BF16 and
// is used only where the CPU has it; otherwise isa=avx512 runs this one.
#include <cmath>
#include <cstring>

#include "kernels.h"
#include "linear_fp8_family.h"
#include "simd_avx2.h"

namespace bessemer {

namespace {
struct Fp8Params : KernelParams {
    int N, K;
    bool bf16_kernel;  // the AVX-512 BF16 kernel (else AVX2 FMA)
    bool dynamic;      // @2: per-token scales computed from each row
    int act_group;     // @2: power-of-two sub-scales per group of this many columns (0: none)
    float xs;          // @1: the static input scale
};
}  // namespace

int fp8_act_group(const KernelCall& c, bool dynamic) {
    const double group = attr_or(c, "act_group", 0.0);
    if (group != 0.0 && (!dynamic || !(group == 16 || group == 32 || group == 64 || group == 128)))
        kernel_error(c, "act_group must be 16, 32, 64 or 128 with dynamic scales (linear_fp8@2), got " +
                            std::to_string(group) + (dynamic ? "" : " on @1"));
    return int(group);
}

void prepare_linear_fp8(KernelCall& c, const PlanInfo& p) {
    const bool dynamic = c.version >= 2;  // per-token scales: no input_scale tensor
    const int nw = dynamic ? 2 : 3;       // weights before the optional bias
    int N, K;
    expect_linear(c, p, nw, nw + 1, &N, &K);
    expect_weight(c, 0, {DT_F8E4M3}, {LAYOUT_PANEL16}, {int64_t(N), int64_t(K)});
    expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    float xs = 1.0f;
    if (!dynamic) {
        expect_weight(c, 2, {DT_F32}, {LAYOUT_ROW_MAJOR}, {1});
        xs = *static_cast<const float*>(c.weights[2]->data);
        if (!(xs > 0.0f) || !std::isfinite(xs))
            kernel_error(c, "input_scale must be a positive finite number, got " + std::to_string(xs));
    }
    if (int(c.weights.size()) == nw + 1) expect_weight(c, nw, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    const int group = fp8_act_group(c, dynamic);
    Fp8Params& a = c.set_params<Fp8Params>();
    a.act_group = group;
    a.N = N;
    a.K = K;
    a.bf16_kernel = linear_fp8_avx512_bf16_available();
    a.dynamic = dynamic;
    a.xs = xs;
}

void run_linear_fp8(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const Fp8Params& a = c.get<Fp8Params>();
    const int N = a.N, K = a.K;
    const auto* codes = static_cast<const uint8_t*>(c.weights[0]->data);
    const auto* scales = static_cast<const float*>(c.weights[1]->data);
    const size_t nw = a.dynamic ? 2 : 3;
    const float* bias = c.weights.size() == nw + 1 ? static_cast<const float*>(c.weights[nw]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    if (ctx.isa == Isa::AVX512 && a.bf16_kernel)
        linear_fp8_avx512(x, ctx.ld(c.ins[0]), M, codes, scales, a.xs, a.dynamic, a.act_group, N, K, bias, y,
                          ctx.ld(c.outs[0]), ctx.nthreads);
    else
        linear_fp8_avx2(x, ctx.ld(c.ins[0]), M, codes, scales, a.xs, a.dynamic, a.act_group, N, K, bias, y,
                        ctx.ld(c.outs[0]), ctx.nthreads);
}

namespace {

using namespace simd;

constexpr int kMR2 = 6;  // rows per microkernel
constexpr int kNR2 = 2;  // max panels per microkernel (2 only for M <= 2)

// Scalar twin of e4m3_round8, for the tail columns.
inline float e4m3_round1(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint32_t sign = u & 0x80000000u;
    float a = std::fabs(v);
    a = a < 448.0f ? a : 448.0f;
    float r;
    if (a < 0.015625f) {  // subnormal grid: multiples of 2^-9 (ulp of 2^14 in fp32)
        const float t = a + 16384.0f;  // no -ffast-math: (a + C) - C is not folded
        r = t - 16384.0f;
    } else {  // round the fp32 mantissa to 3 bits, ties to even
        uint32_t b;
        std::memcpy(&b, &a, 4);
        b = (b + 0x7FFFFu + ((b >> 20) & 1u)) & 0xFFF00000u;
        std::memcpy(&r, &b, 4);
    }
    std::memcpy(&u, &r, 4);
    u |= sign;
    std::memcpy(&r, &u, 4);
    return r;
}

// 8 values v -> their E4M3 values (saturating, ties to even) as fp32.
inline __m256 e4m3_round8(__m256 v) {
    const __m256 sign_mask = _mm256_set1_ps(-0.0f);
    const __m256 sign = _mm256_and_ps(v, sign_mask);
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign_mask, v), _mm256_set1_ps(448.0f));
    __m256i b = _mm256_castps_si256(a);
    b = _mm256_add_epi32(b, _mm256_add_epi32(_mm256_set1_epi32(0x7FFFF),
                                             _mm256_and_si256(_mm256_srli_epi32(b, 20), _mm256_set1_epi32(1))));
    const __m256 nrm = _mm256_castsi256_ps(_mm256_and_si256(b, _mm256_set1_epi32(int(0xFFF00000u))));
    const __m256 magic = _mm256_set1_ps(16384.0f);
    const __m256 sub = _mm256_sub_ps(_mm256_add_ps(a, magic), magic);
    const __m256 r = _mm256_blendv_ps(nrm, sub, _mm256_cmp_ps(a, _mm256_set1_ps(0.015625f), _CMP_LT_OQ));
    return _mm256_or_ps(r, sign);
}

void quantize_rows_f32(const float* x, int64_t ldx, int rows, int kc, const float* s, const Fp8Groups& g, char* out,
                       int64_t ldq) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float* q = reinterpret_cast<float*>(out) + r * ldq;
        fp8_segments(g, r, kc, s[r], [&](int a, int b, float sd, float post) {
            const __m256 sv = _mm256_set1_ps(sd), pv = _mm256_set1_ps(post);
            int k = a;
            for (; k + 8 <= b; k += 8)
                _mm256_storeu_ps(q + k, _mm256_mul_ps(e4m3_round8(_mm256_div_ps(_mm256_loadu_ps(xr + k), sv)), pv));
            for (; k < b; ++k) q[k] = e4m3_round1(xr[k] / sd) * post;
        });
        for (int k = kc; k < ldq; ++k) q[k] = 0.0f;
    }
}

void row_scales_f32(const float* x, int64_t ldx, int rows, int K, float* s) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float amax = 0.0f;
        for (int k = 0; k < K; ++k) amax = std::fmax(amax, std::fabs(xr[k]));
        s[r] = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    }
}

// 16 E4M3 weights of one panel at one k -> fp32 (rows 0-7, 8-15), each times 2^-8.
inline void decode16_e4m3(const uint8_t* p, __m256& w0, __m256& w1) {
    const __m256i h = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i f16 = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7),
                                        _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8));
    w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(f16));
    w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(f16, 1));
}

// The fp32 values of decode16_e4m3, for Fp8Args::wdec (the same bits, decoded once; a
// PanelDecodeFn, linear_driver.h).
void decode_panels_e4m3(const void* w, int64_t pstride, int nr, int kc, float* out) {
    const uint8_t* b = static_cast<const uint8_t*>(w);
    store_decoded_panels(nr, kc, out, [&](int n, int k, __m256& w0, __m256& w1) {
        decode16_e4m3(b + n * pstride + int64_t(k) * 16, w0, w1);
    });
}

// DEC: the weights come decoded (a.wdec), else the E4M3 bytes are decoded here per k.
template <int MR, int NR, bool DEC>
inline __attribute__((always_inline)) void ukr_fp8_avx2_body(const Fp8Args& a) {
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = reinterpret_cast<const float*>(a.xq) + r * a.ldq;
    const uint8_t* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    // A later K block resumes the unscaled partial sums the previous one stored in y; the
    // last scales them: one FMA chain over k = 0..K-1 per output.
    __m256 acc[MR][NR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int nc = a.ncols - n * 16;
            if (a.accumulate && nc > 0)
                load_partial16(a.y + r * a.ldy + n * 16, nc, acc[r][n][0], acc[r][n][1]);
            else
                acc[r][n][0] = acc[r][n][1] = _mm256_setzero_ps();
        }
    for (int k = 0; k < a.kc; ++k) {
        if (a.pf_next && (k & 3) == 0)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) _mm_prefetch(reinterpret_cast<const char*>(wp[n] + k * 16 + a.pf_next), _MM_HINT_T0);
        __m256 wv[NR][2];
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n)
            if (DEC)
                load_decoded16(a.wdec, a.kc, n, k, wv[n][0], wv[n][1]);
            else
                decode16_e4m3(wp[n] + k * 16, wv[n][0], wv[n][1]);
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
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16;
        const int nc = a.ncols - col0;
        if (nc <= 0) break;
        if (!a.last) {  // partial sums, finished by the last K block
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) store_partial16(a.y + r * a.ldy + col0, nc, acc[r][n][0], acc[r][n][1]);
            continue;
        }
        if (nc >= 16) {
            const __m256 w0 = _mm256_loadu_ps(a.ws + col0), w1 = _mm256_loadu_ps(a.ws + col0 + 8);
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                const __m256 sx = _mm256_set1_ps(a.xs[r] * 256.0f);  // decoded weights are value * 2^-8
                const __m256 s0 = _mm256_mul_ps(w0, sx), s1 = _mm256_mul_ps(w1, sx);
                float* yp = a.y + r * a.ldy + col0;
                __m256 v0 = _mm256_mul_ps(acc[r][n][0], s0), v1 = _mm256_mul_ps(acc[r][n][1], s1);
                if (a.bias) {
                    v0 = _mm256_add_ps(v0, _mm256_loadu_ps(a.bias + col0));
                    v1 = _mm256_add_ps(v1, _mm256_loadu_ps(a.bias + col0 + 8));
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
                    float val = tmp[j] * (a.ws[col0 + j] * (a.xs[r] * 256.0f));
                    if (a.bias) val += a.bias[col0 + j];
                    yp[j] = val;
                }
            }
        }
    }
}

template <int MR, int NR>
void ukr_fp8_avx2(const Fp8Args& a) {
    if (a.wdec)
        ukr_fp8_avx2_body<MR, NR, true>(a);
    else
        ukr_fp8_avx2_body<MR, NR, false>(a);
}

struct UkTableFp8 {
    Fp8Fn f[(kMR2 + 1) * (kNR2 + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR2 + 1) + NR] = ukr_fp8_avx2<MR, NR>; }
    constexpr UkTableFp8() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>(); set<5, 1>(); set<6, 1>();
        set<1, 2>(); set<2, 2>();
    }
};

const UkTableFp8 kTableFp8;

}  // namespace

void linear_fp8_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, float xs,
                     bool dynamic, int act_group, int N, int K, const float* bias, float* y, int64_t ldy,
                     int nthreads) {
    linear_fp8_drive(x, ldx, M, codes, scales, xs, dynamic ? row_scales_f32 : nullptr, act_group, N, K, bias, y, ldy,
                     nthreads, kMR2, M <= 2 ? 2 : 1, kTableFp8.f, kNR2 + 1, quantize_rows_f32, 4,
                     decode_panels_e4m3);
}

bool linear_fp8_avx512_bf16_available() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace bessemer
