// linear@1: y = x @ W^T (+ bias), W panel16 [N, K] in float32 or bfloat16.
// This file holds prepare/run (ISA dispatch) and the AVX2 microkernels; the AVX-512
// microkernels live in linear_avx512.cpp and the shared blocking/threading scheme in
// linear_driver.h. Microkernel: MR rows x NR panels of fp32 accumulators, one broadcast of
// x per row and k, one weight load per panel and k; bf16 weights are widened in registers
// (16-bit shift / mask), never dequantized into memory.
#include <algorithm>

#include "kernels.h"
#include "linear_driver.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

// ---------------------------------------------------------------- prepare / run
namespace {
struct LinearParams : KernelParams {
    int N, K;
    bool bf16;  // bf16 weights (else fp32)
};
}  // namespace

void prepare_linear(KernelCall& c, const PlanInfo& p) {
    int N, K;
    expect_linear(c, p, 1, 2, &N, &K);
    expect_weight(c, 0, {DT_F32, DT_BF16}, {LAYOUT_PANEL16}, {int64_t(N), int64_t(K)});
    if (c.weights.size() == 2) expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    LinearParams& a = c.set_params<LinearParams>();
    a.N = N;
    a.K = K;
    a.bf16 = c.weights[0]->dtype == DT_BF16;
}

void run_linear(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const LinearParams& a = c.get<LinearParams>();
    const int N = a.N, K = a.K;
    const bool bf16 = a.bf16;
    const float* bias = c.weights.size() == 2 ? static_cast<const float*>(c.weights[1]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    if (ctx.isa == Isa::AVX512)
        linear_avx512(x, ctx.ld(c.ins[0]), M, c.weights[0]->data, bf16, N, K, bias, y, ctx.ld(c.outs[0]),
                      ctx.nthreads);
    else
        linear_avx2(x, ctx.ld(c.ins[0]), M, c.weights[0]->data, bf16, N, K, bias, y, ctx.ld(c.outs[0]),
                    ctx.nthreads);
}

// ---------------------------------------------------------------- AVX2
namespace {

constexpr int kMR2 = 6;  // rows per microkernel
constexpr int kNR2 = 2;  // max panels per microkernel (2 only for M <= 2: 16 ymm registers)

// The 16 partial sums of a panel's row in y (its first nc columns, the rest 0) as the
// microkernel's accumulator pair: columns 0-7 and 8-15, or for bf16 weights the even and
// odd columns (the layout the bf16 loads produce; a pure permutation, so exact).
template <bool BF16>
inline void load_partial(const float* yp, int nc, __m256& v0, __m256& v1) {
    load_partial16(yp, nc, v0, v1);
    if (BF16) {  // columns 0..7, 8..15 -> (even, odd) columns
        const __m256 lo = _mm256_permute2f128_ps(v0, v1, 0x20), hi = _mm256_permute2f128_ps(v0, v1, 0x31);
        v0 = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
        v1 = _mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

// A row's outputs are one FMA chain over k = 0..K-1 per column: a later K block starts from
// the partial sums the previous one stored in y, the bias is added after the last.
template <int MR, int NR, bool BF16>
void ukr_avx2(const UkArgs& a) {
    __m256 acc[MR][NR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int nc = a.ncols - n * 16;
            if (a.accumulate && nc > 0)
                load_partial<BF16>(a.y + r * a.ldy + n * 16, nc, acc[r][n][0], acc[r][n][1]);
            else
                acc[r][n][0] = acc[r][n][1] = _mm256_setzero_ps();
        }
    const float* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = a.x + r * a.ldx;
    const char* w = a.w;
    const int64_t ps = a.pstride;
    for (int k = 0; k < a.kc; ++k) {
        __m256 wv[NR][2];
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            if (BF16) {
                // 16 bf16 = 8 u32 lanes holding columns (2i, 2i+1): a shift gives the even
                // columns, a mask the odd ones (no cross-lane unpacking; re-interleaved at
                // the store).
                const __m256i raw = _mm256_loadu_si256(
                    reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(w + n * ps) + k * 16));
                wv[n][0] = _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
                wv[n][1] = _mm256_castsi256_ps(_mm256_and_si256(raw, _mm256_set1_epi32(int(0xFFFF0000u))));
            } else {
                const float* wp = reinterpret_cast<const float*>(w + n * ps) + k * 16;
                wv[n][0] = _mm256_loadu_ps(wp);
                wv[n][1] = _mm256_loadu_ps(wp + 8);
            }
        }
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
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int col0 = n * 16;
            float* yp = a.y + r * a.ldy + col0;
            __m256 v0 = acc[r][n][0], v1 = acc[r][n][1];
            if (BF16) {  // (even, odd) columns -> columns 0..7, 8..15
                const __m256 lo = _mm256_unpacklo_ps(v0, v1), hi = _mm256_unpackhi_ps(v0, v1);
                v0 = _mm256_permute2f128_ps(lo, hi, 0x20);
                v1 = _mm256_permute2f128_ps(lo, hi, 0x31);
            }
            const float* bias = a.bias ? a.bias + col0 : nullptr;
            if (col0 + 16 <= a.ncols) {
                store_row16(yp, v0, v1, bias);
            } else if (col0 < a.ncols) {
                alignas(32) float tmp[16];
                _mm256_store_ps(tmp, v0);
                _mm256_store_ps(tmp + 8, v1);
                store_row_tail(yp, tmp, a.ncols - col0, bias);
            }
        }
    }
}

template <bool BF16>
struct UkTable2 {
    UkFn f[(kMR2 + 1) * (kNR2 + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR2 + 1) + NR] = ukr_avx2<MR, NR, BF16>; }
    constexpr UkTable2() : f{} {
        set<1, 1>(); set<2, 1>(); set<3, 1>(); set<4, 1>(); set<5, 1>(); set<6, 1>();
        set<1, 2>(); set<2, 2>();
    }
};

const UkTable2<false> kTableF32;
const UkTable2<true> kTableBF16;

}  // namespace

void linear_avx2(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                 const float* bias, float* y, int64_t ldy, int nthreads) {
    // Two panels per microkernel only when M <= 2 (otherwise 6 rows x 1 panel fills 12 ymm).
    const int NR = M <= 2 ? 2 : 1;
    linear_drive(x, ldx, M, w, bf16 ? 2 : 4, N, K, bias, y, ldy, nthreads, kMR2, NR,
                 bf16 ? kTableBF16.f : kTableF32.f, kNR2 + 1);
}

}  // namespace bessemer
