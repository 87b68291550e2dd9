// linear_w4a8@1: 4-bit weight codes (symmetric, a bf16 scale per group of G) times int8
// activations (dynamic, per row and per group of G), int32 dot products per group.
//
//   weights: codes int4 panel16_int4_k8 [N, K], scales bf16 (or f32) panel16 [N, K/G],
//            bias f32 [N] (optional); attrs group_size (G: a multiple of 8 dividing K)
//   per row t, group g: a = max|x[t, g]|; xs[t, g] = a / 127 (1 when a == 0);
//            xq[t, k] = clamp(rint(x[t, k] * (127 / a)), -127, 127)   (0 when a == 0)
//   y[t, n] = sum over g in order of float(sum_{k in g} xq[t, k] * (code[n, k] - 8))
//             * (xs[t, g] * scales[n, g])   (an fp32 FMA per group) (+ bias[n])
//
// The same codes and scales as linear_w4a16@3 (the w4a16 scale search is reused), read
// with int8 arithmetic like llama.cpp's Q4_0 x Q8_0 dot products. The integer sum per
// group is exact, the fp32 steps run in a fixed order per row, and the activation
// quantization is row-local: a row's output is bit-identical whatever the call's row
// count, and on both ISAs. Reference: quantization/primitives.py (quantize_int8_per_group,
// linear_w4a8_ref). This file holds prepare/run (ISA dispatch), the activation
// quantization and the AVX2 path; the AVX-512 VNNI path is linear_w4a8_avx512.cpp.
//
// The unsigned codes (0..15) are the u8 operand of the byte dot products and the int8
// activations the signed one, so code - 8 is applied as sum(xq * code) - 8 * sum(xq),
// the second sum computed once per row and group when the row is quantized. AVX2's
// maddubs sums two u8 x s8 products into a saturating int16: 2 * 15 * 127 = 3810, and two
// of them (low and high nibbles) 7620, stay far below 32767, so every step is exact.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels.h"
#include "linear_w4a8_family.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {
struct W4A8Params : KernelParams {
    int N, K, G;
    bool vnni;  // the CPU has AVX-512 VNNI
    // fp32 panel16 [N, K/G] scales, widened once at prepare from the stored bf16
    std::vector<float> scales;
};
}  // namespace

void prepare_linear_w4a8(KernelCall& c, const PlanInfo& p) {
    int N, K;
    expect_linear(c, p, 2, 3, &N, &K);
    const int64_t G = attr_int(c, "group_size");
    if (G <= 0 || G % 8 != 0 || K % G != 0)
        kernel_error(c, "group_size " + std::to_string(G) + " must be a multiple of 8 that divides K = " +
                            std::to_string(K));
    // The driver keeps Mc x K quantized activations on each thread's stack.
    if (K > kW8A8MaxK) kernel_error(c, "K = " + std::to_string(K) + " exceeds " + std::to_string(kW8A8MaxK));
    expect_weight(c, 0, {DT_I4}, {LAYOUT_PANEL16_INT4_K8}, {int64_t(N), int64_t(K)});
    expect_weight(c, 1, {DT_BF16, DT_F32}, {LAYOUT_PANEL16}, {int64_t(N), K / G});
    if (c.weights.size() == 3) expect_weight(c, 2, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    W4A8Params& a = c.set_params<W4A8Params>();
    a.N = N;
    a.K = K;
    a.G = int(G);
    a.vnni = __builtin_cpu_supports("avx512vnni");
    const size_t n = size_t((N + 15) / 16 * 16) * size_t(K / G);
    a.scales.resize(n);
    const void* src = c.weights[1]->data;
    for (size_t i = 0; i < n; ++i) {
        if (c.weights[1]->dtype == DT_BF16) {
            const uint32_t u = uint32_t(static_cast<const uint16_t*>(src)[i]) << 16;
            std::memcpy(&a.scales[i], &u, 4);
        } else {
            a.scales[i] = static_cast<const float*>(src)[i];
        }
    }
}

void run_linear_w4a8(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const W4A8Params& a = c.get<W4A8Params>();
    const auto* codes = static_cast<const uint8_t*>(c.weights[0]->data);
    const float* bias = c.weights.size() == 3 ? static_cast<const float*>(c.weights[2]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    // isa=avx512 on a CPU without VNNI runs the AVX2 path (no u8 x s8 -> s32 instruction)
    if (ctx.isa == Isa::AVX512 && a.vnni)
        linear_w4a8_avx512(x, ctx.ld(c.ins[0]), M, codes, a.scales.data(), a.G, a.N, a.K, bias, y,
                           ctx.ld(c.outs[0]), ctx.nthreads);
    else
        linear_w4a8_avx2(x, ctx.ld(c.ins[0]), M, codes, a.scales.data(), a.G, a.N, a.K, bias, y, ctx.ld(c.outs[0]),
                         ctx.nthreads);
}

void quant_rows_w4a8(const float* x, int64_t ldx, int rows, int K, int G, int8_t* q, float* xs, int32_t* xc) {
    const int ng = K / G;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        int8_t* qr = q + int64_t(r) * K;
        for (int g = 0; g < ng; ++g) {
            const float* xg = xr + g * G;
            __m256 vmax = _mm256_setzero_ps();
            for (int k = 0; k < G; k += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xg + k)));
            const float amax = hmax256(vmax);
            const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
            xs[int64_t(r) * ng + g] = amax > 0 ? amax / 127.0f : 1.0f;
            __m256i sum = _mm256_setzero_si256();
            for (int k = 0; k < G; k += 8) {
                const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(xg + k), inv)));
                const __m256i i32 = _mm256_cvtps_epi32(v);  // round to nearest even, like np.rint
                sum = _mm256_add_epi32(sum, i32);
                const __m256i p = _mm256_permutevar8x32_epi32(i32, order);
                const __m128i i16 = _mm_packs_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
                _mm_storel_epi64(reinterpret_cast<__m128i*>(qr + g * G + k), _mm_packs_epi16(i16, i16));
            }
            alignas(32) int32_t t[8];
            _mm256_store_si256(reinterpret_cast<__m256i*>(t), sum);
            xc[int64_t(r) * ng + g] = 8 * (t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7]);
        }
    }
}

namespace {

constexpr int kMR = 4;  // rows per microkernel (one panel: 16 registers of accumulators)

// MR rows x one panel; per 8-k block: 16 rows x 8 k of codes = two ymm (rows 0-7, 8-15),
// each split into its low (xa's k) and high (xb's k) nibbles.
template <int MR>
void ukr_w4a8_avx2(const W4A8Args& a) {
    __m256 accf[MR][2];
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) accf[r][0] = accf[r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int nb = a.G / 8;
    for (int g = 0; g < a.ng; ++g) {
        __m256i acc[MR][2];
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
        for (int b = g * nb; b < (g + 1) * nb; ++b) {
            const char* p = reinterpret_cast<const char*>(a.w) + int64_t(b) * 64;
            const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
            const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
            const __m256i l0 = _mm256_and_si256(v0, low), h0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low);
            const __m256i l1 = _mm256_and_si256(v1, low), h1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low);
#pragma GCC unroll 4
            for (int r = 0; r < MR; ++r) {
                int32_t x2[2];
                std::memcpy(x2, a.xq + r * a.ldq + int64_t(b) * 8, 8);
                const __m256i xa = _mm256_set1_epi32(x2[0]), xb = _mm256_set1_epi32(x2[1]);
                const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(l0, xa), _mm256_maddubs_epi16(h0, xb));
                const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(l1, xa), _mm256_maddubs_epi16(h1, xb));
                acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(s0, ones));
                acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(s1, ones));
            }
        }
        const float* wsg = a.ws + g * 16;
        const __m256 w0 = _mm256_loadu_ps(wsg), w1 = _mm256_loadu_ps(wsg + 8);
#pragma GCC unroll 4
        for (int r = 0; r < MR; ++r) {
            const __m256i c = _mm256_set1_epi32(a.xc[r * a.ng + g]);
            const __m256 xs = _mm256_set1_ps(a.xs[r * a.ng + g]);
            const __m256 t0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][0], c));
            const __m256 t1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc[r][1], c));
            accf[r][0] = _mm256_fmadd_ps(t0, _mm256_mul_ps(xs, w0), accf[r][0]);
            accf[r][1] = _mm256_fmadd_ps(t1, _mm256_mul_ps(xs, w1), accf[r][1]);
        }
    }
    const int nc = a.ncols;
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
        float* yp = a.y + r * a.ldy;
        __m256 v0 = accf[r][0], v1 = accf[r][1];
        if (nc >= 16) {
            if (a.bias) {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(a.bias));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(a.bias + 8));
            }
            _mm256_storeu_ps(yp, v0);
            _mm256_storeu_ps(yp + 8, v1);
        } else {
            alignas(32) float t[16];
            _mm256_store_ps(t, v0);
            _mm256_store_ps(t + 8, v1);
            for (int j = 0; j < nc; ++j) yp[j] = a.bias ? t[j] + a.bias[j] : t[j];
        }
    }
}

struct UkTableW4A8 {
    W4A8Uk f[(kMR + 1) * 2];
    constexpr UkTableW4A8() : f{} {
        f[1 * 2 + 1] = ukr_w4a8_avx2<1>;
        f[2 * 2 + 1] = ukr_w4a8_avx2<2>;
        f[3 * 2 + 1] = ukr_w4a8_avx2<3>;
        f[4 * 2 + 1] = ukr_w4a8_avx2<4>;
    }
};

const UkTableW4A8 kTable;

}  // namespace

void linear_w4a8_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    linear_w4a8_drive(x, ldx, M, codes, scales, G, N, K, bias, y, ldy, nthreads, kMR, 1, kTable.f, 2);
}

}  // namespace bessemer
