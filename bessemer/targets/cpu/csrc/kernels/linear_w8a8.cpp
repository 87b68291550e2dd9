// linear_w8a8@1: int8 activations (per token, dynamic) times int8 weights (per channel),
// int32 accumulation; the SmoothQuant GEMM.
//
//   weights: q int8 vnni16 [N, K], w_scales f32 [N], wsum int32 [N] (sum_k q[n, k]),
//            smooth f32 [K] (only with attr has_smooth = 1), bias f32 [N] (optional)
//   per row t: x' = x[t] (* smooth); a = max|x'|; xs[t] = a / 127;
//              xq[t, k] = clamp(rint(x'[k] * (127 / a)), -127, 127)   (0 when a == 0)
//   y[t, n] = float(sum_k xq[t, k] * q[n, k]) * (xs[t] * w_scales[n]) (+ bias[n])
//
// The reference is quantization/primitives.py (quantize_int8_per_token, linear_w8a8_ref).
// This file holds prepare/run (ISA dispatch) and the AVX2 path; the AVX-512 VNNI path is
// in linear_w8a8_avx512.cpp; both run under linear_driver.h (linear_w8a8_family.h).
//
// AVX2 has no u8 x s8 -> s32 dot product that cannot saturate (maddubs sums two u8*s8
// products into a saturating int16), so it uses |x| (u8) times sign(x) * w (s8): both are
// at most 127 in magnitude, so a pair sums to at most 2 * 127 * 127 = 32258 < 32767 and
// the int16 step is exact; madd_epi16 with ones then widens pairs to int32.
#include <algorithm>
#include <string>

#include "kernels.h"
#include "linear_w8a8_family.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

// iv: 0 N, 1 K, 2 has_smooth, 3 VNNI available
namespace {
struct W8A8Params : KernelParams {
    int N, K;
    bool smooth;  // a stored 1/s multiplies the activations first
    bool vnni;    // the CPU has AVX-512 VNNI
};
}  // namespace

void prepare_linear_w8a8(KernelCall& c, const PlanInfo& p) {
    const bool smooth = attr_or(c, "has_smooth", 0.0) != 0.0;
    int N, K;
    expect_linear(c, p, smooth ? 4 : 3, smooth ? 5 : 4, &N, &K);
    // The driver keeps Mc x K quantized activations on each thread's stack.
    if (K > kW8A8MaxK) kernel_error(c, "K = " + std::to_string(K) + " exceeds " + std::to_string(kW8A8MaxK));
    expect_weight(c, 0, {DT_I8}, {LAYOUT_VNNI16}, {int64_t(N), int64_t(K)});
    expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    expect_weight(c, 2, {DT_I32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    size_t next = 3;
    if (smooth) expect_weight(c, next++, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(K)});
    if (c.weights.size() > next) expect_weight(c, next, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    W8A8Params& a = c.set_params<W8A8Params>();
    a.N = N;
    a.K = K;
    a.smooth = smooth;
    a.vnni = __builtin_cpu_supports("avx512vnni");
}

void run_linear_w8a8(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const W8A8Params& a = c.get<W8A8Params>();
    const int N = a.N, K = a.K;
    const bool smooth = a.smooth;
    const auto* q = static_cast<const int8_t*>(c.weights[0]->data);
    const auto* ws = static_cast<const float*>(c.weights[1]->data);
    const auto* wsum = static_cast<const int32_t*>(c.weights[2]->data);
    const float* sm = smooth ? static_cast<const float*>(c.weights[3]->data) : nullptr;
    const size_t ib = smooth ? 4 : 3;
    const float* bias = c.weights.size() > ib ? static_cast<const float*>(c.weights[ib]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    // isa=avx512 on a CPU without VNNI (Skylake-X) runs the AVX2 path: AVX-512BW alone has
    // only the saturating maddubs and no byte sign instruction.
    if (ctx.isa == Isa::AVX512 && a.vnni)
        linear_w8a8_avx512(x, ctx.ld(c.ins[0]), M, q, ws, wsum, sm, N, K, bias, y, ctx.ld(c.outs[0]), ctx.nthreads);
    else
        linear_w8a8_avx2(x, ctx.ld(c.ins[0]), M, q, ws, wsum, sm, N, K, bias, y, ctx.ld(c.outs[0]), ctx.nthreads);
}

namespace {

constexpr int kMR = 4;  // rows per microkernel
constexpr int kNR = 2;  // panels per microkernel (M <= 2 only)

// Per-token int8 quantization of `rows` rows (signed codes; K..ldq padded with 0).
void quant_rows_avx2(const float* x, int64_t ldx, int rows, int K, int64_t ldq, const float* smooth,
                     int8_t* q, float* scale) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        int8_t* qr = q + r * ldq;
        __m256 vmax = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            if (smooth) v = _mm256_mul_ps(v, _mm256_loadu_ps(smooth + k));
            vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
        }
        float amax = hmax256(vmax);
        for (; k < K; ++k) amax = std::max(amax, std::fabs(smooth ? xr[k] * smooth[k] : xr[k]));
        const float inv = amax > 0 ? 127.0f / amax : 0.0f;
        scale[r] = amax > 0 ? amax / 127.0f : 1.0f;
        const __m256 vinv = _mm256_set1_ps(inv);
        const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        for (k = 0; k + 8 <= K; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            if (smooth) v = _mm256_mul_ps(v, _mm256_loadu_ps(smooth + k));
            v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(v, vinv)));
            const __m256i i32 = _mm256_cvtps_epi32(v);  // round to nearest even, like np.rint
            const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i*>(qr + k), _mm_packs_epi16(i16, i16));
        }
        for (; k < K; ++k) {
            const float v = (smooth ? xr[k] * smooth[k] : xr[k]) * inv;
            qr[k] = int8_t(std::nearbyint(std::min(127.0f, std::max(-127.0f, v))));
        }
        for (; k < ldq; ++k) qr[k] = 0;
    }
}

// MR rows x NR panels; per 4-byte k group: 16 rows x 4 k of weights = two ymm per panel.
template <int MR, int NR>
void ukr_w8a8_avx2(const W8A8Args& a) {
    __m256i acc[MR][NR][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) acc[r][n][0] = acc[r][n][1] = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int kk = 0; kk < a.kq; ++kk) {
        __m256i wv[NR][2];
#pragma GCC unroll 2
        for (int n = 0; n < NR; ++n) {
            const char* p = reinterpret_cast<const char*>(a.w) + n * a.pstride + kk * 64;
            if (a.pf_next) _mm_prefetch(p + a.pf_next, _MM_HINT_T1);  // see W8A8Args::pf_next
            wv[n][0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            wv[n][1] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
        }
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            int32_t x4;
            __builtin_memcpy(&x4, a.xq + r * a.ldq + kk * 4, 4);
            const __m256i xb = _mm256_set1_epi32(x4);
            const __m256i ax = _mm256_abs_epi8(xb);
#pragma GCC unroll 2
            for (int n = 0; n < NR; ++n)
#pragma GCC unroll 2
                for (int h = 0; h < 2; ++h) {
                    const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(wv[n][h], xb));
                    acc[r][n][h] = _mm256_add_epi32(acc[r][n][h], _mm256_madd_epi16(p16, ones));
                }
        }
    }
#pragma GCC unroll 2
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16, nc = a.ncols - col0;
        if (nc <= 0) break;
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            float* yp = a.y + r * a.ldy + col0;
            const __m256 xs = _mm256_set1_ps(a.xs[r]);
            if (nc >= 16) {
                for (int h = 0; h < 2; ++h) {
                    const __m256 s = _mm256_mul_ps(xs, _mm256_loadu_ps(a.ws + col0 + 8 * h));
                    __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][n][h]), s);
                    if (a.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(a.bias + col0 + 8 * h));
                    _mm256_storeu_ps(yp + 8 * h, v);
                }
            } else {
                alignas(32) int32_t t[16];
                _mm256_store_si256(reinterpret_cast<__m256i*>(t), acc[r][n][0]);
                _mm256_store_si256(reinterpret_cast<__m256i*>(t + 8), acc[r][n][1]);
                for (int j = 0; j < nc; ++j) {
                    float v = float(t[j]) * (a.xs[r] * a.ws[col0 + j]);
                    if (a.bias) v += a.bias[col0 + j];
                    yp[j] = v;
                }
            }
        }
    }
}

struct UkTableW8A8 {
    W8A8Uk f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_w8a8_avx2<MR, NR>; }
    constexpr UkTableW8A8() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>();
        set<1, 2>(); set<2, 2>();
    }
};

const UkTableW8A8 kTable;

}  // namespace

void linear_w8a8_avx2(const float* x, int64_t ldx, int M, const int8_t* q, const float* ws, const int32_t* wsum,
                      const float* smooth, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    (void)wsum;  // signed activations: no +128 correction
    linear_w8a8_drive(x, ldx, M, q, ws, wsum, smooth, N, K, bias, y, ldy, nthreads, kMR, M <= 2 ? 2 : 1, kTable.f,
                      kNR + 1, quant_rows_avx2);
}

}  // namespace bessemer
