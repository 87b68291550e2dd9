// moe_mxfp4@1: the grouped expert driver (moe_grouped.h) on experts kept in MXFP4 as gpt-oss
// ships them (quantization/mxfp4.py): per output row of expert e, blocks of 32 E2M1 codes
// (16 bytes, element 2j in the low nibble of byte j, 2j + 1 in the high one) sharing one
// E8M0 scale (exponent + 127). Weights [gate_up codes uint8 (E*2I, H/2), scales uint8
// (E*2I, H/32), down codes (E*H, I/2), scales (E*H, I/32)] [gate_up_bias (E, 2I), down_bias
// (E, H)], row_major; gate_up rows interleave gate and up (layout 1).
//
// Two kernels compute the same products in fp32 (x stays fp32, accumulation fp32), each
// decoding a block once per (row, block) for the expert's tokens in a pass; threads split
// the output rows, never K (rows_mxfp4 gives the driver any row range, so a decode step
// splits all its routed experts' rows over the threads at once), and a row's order of
// operations depends only on K (batch invariance):
//   AVX-512 (moe_mxfp4_avx512.cpp): vpermps through the block's E2M1 table times its
//     scale (scaled_e2m1), x's blocks stored even columns then odd ones (split_block_pairs)
//     so that no weights are re-ordered;
//   AVX2 (here, the fallback): the 32 codes go through a byte shuffle into 2 * E2M1
//     (integers -12..12), widened to fp32 and multiplied by the scale / 2 (exact: powers of
//     two), then one FMA per token and 8 weights.
#include <algorithm>
#include <cmath>
#include <omp.h>

#include "moe_grouped.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

constexpr int kTokens = 4;  // tokens per pass over a row's blocks (accumulators in registers)

struct MoeMxfp4Params : MoeParams {
    Isa isa = Isa::AVX2;
    // AVX-512: [16 s + c] = the E2M1 value of code c times 2^(s - 127) (exact: a power of two
    // times a 2-bit mantissa), the table one block of scale byte s decodes through
    alignas(64) float scaled_e2m1[256 * 16];
    float half_scale_of[256];  // 2^(byte - 127) / 2: the AVX2 kernel's doubled codes
};

// 32 weights of one block, as fp32, times `scale`: w[0..3] hold elements 0-7, 8-15, 16-23, 24-31.
inline void decode_block(const uint8_t* bytes, __m256 scale, __m256 w[4]) {
    const __m128i lut = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0F));
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F));
    const __m128i v0 = _mm_shuffle_epi8(lut, _mm_unpacklo_epi8(lo, hi));  // elements 0-15
    const __m128i v1 = _mm_shuffle_epi8(lut, _mm_unpackhi_epi8(lo, hi));  // elements 16-31
    w[0] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)));
    w[1] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))));
    w[2] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)));
    w[3] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))));
}

template <int MT>
inline void row_tokens(const uint8_t* codes, const uint8_t* scales, const float* scale_of, int blocks,
                       const float* x, int64_t ldx, float* out) {
    __m256 acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
    for (int b = 0; b < blocks; ++b) {
        __m256 w[4];
        decode_block(codes + 16 * b, _mm256_set1_ps(scale_of[scales[b]]), w);
        for (int t = 0; t < MT; ++t) {
            const float* xb = x + t * ldx + 32 * b;
            acc[t] = _mm256_fmadd_ps(w[0], _mm256_loadu_ps(xb), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(xb + 8), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(xb + 16), acc[t]);
            acc[t] = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(xb + 24), acc[t]);
        }
    }
    for (int t = 0; t < MT; ++t) out[t] = hsum256(acc[t]);
}

// Output rows [n0, n1) of y (M, N) = x (M, K) @ W^T (+ bias) for expert e's `which` matrix, on
// the calling thread.
void rows_mxfp4(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                const float* bias, float* y, int64_t ldy, int64_t n0, int64_t n1) {
    const MoeMxfp4Params& P = c.get<MoeMxfp4Params>();
    const int64_t N = which == GATE_UP ? 2 * int64_t(P.I) : P.H, K = which == GATE_UP ? P.H : P.I;
    const int blocks = int(K / 32);
    const auto* codes = static_cast<const uint8_t*>(c.weights[2 * which]->data) + e * N * (K / 2);
    const auto* scales = static_cast<const uint8_t*>(c.weights[2 * which + 1]->data) + e * N * blocks;
    if (P.isa == Isa::AVX512) {
        moe_mxfp4_rows_avx512(codes, scales, P.scaled_e2m1, n0, n1, int(K), x, ldx, M, bias, y, ldy);
        return;
    }
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* rc = codes + n * (K / 2);
        const uint8_t* rs = scales + n * blocks;
        float r[kTokens];
        for (int m0 = 0; m0 < M; m0 += kTokens) {
            const int mt = std::min(kTokens, M - m0);
            const float* xm = x + m0 * ldx;
            switch (mt) {
                case 4: row_tokens<4>(rc, rs, P.half_scale_of, blocks, xm, ldx, r); break;
                case 3: row_tokens<3>(rc, rs, P.half_scale_of, blocks, xm, ldx, r); break;
                case 2: row_tokens<2>(rc, rs, P.half_scale_of, blocks, xm, ldx, r); break;
                default: row_tokens<1>(rc, rs, P.half_scale_of, blocks, xm, ldx, r); break;
            }
            for (int t = 0; t < mt; ++t) y[(m0 + t) * ldy + n] = r[t] + (bias ? bias[n] : 0.0f);
        }
    }
}

// The whole matrix, its rows split over nthreads in blocks of 16 (the driver's chunked path).
void matmul_mxfp4(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                  const float* bias, float* y, int64_t ldy, int nthreads) {
    const MoeParams& P = c.get<MoeParams>();
    const int64_t N = which == GATE_UP ? 2 * int64_t(P.I) : P.H, K = which == GATE_UP ? P.H : P.I;
    const int64_t tiles = (N + 15) / 16;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nthreads > 1 && N * K * M >= 32768)
    for (int64_t t = 0; t < tiles; ++t) rows_mxfp4(c, which, e, x, ldx, M, bias, y, ldy, 16 * t, std::min(N, 16 * t + 16));
}

// Each 32-column block of x's M rows re-ordered in place as the AVX-512 kernel reads it: its
// 16 even columns, then its 16 odd ones (the order vpermps decodes the codes in).
void split_block_pairs(float* x, int64_t ldx, int M, int K) {
    for (int m = 0; m < M; ++m)
        for (int k0 = 0; k0 < K; k0 += 32) {
            float* b = x + m * ldx + k0;
            float t[32];
            for (int j = 0; j < 16; ++j) {
                t[j] = b[2 * j];
                t[16 + j] = b[2 * j + 1];
            }
            std::copy(t, t + 32, b);
        }
}

}  // namespace

void prepare_moe_mxfp4(KernelCall& c, const PlanInfo& p) {
    MoeMxfp4Params& P = c.set_params<MoeMxfp4Params>();
    prepare_moe_routing(c, p, P, 4);
    if (!P.stacked) kernel_error(c, "MXFP4 experts are stored gpt-oss style (layout 1)");
    if (P.H % 32 || P.I % 32) kernel_error(c, "MXFP4 experts need hidden and expert sizes that are multiples of 32");
    const int64_t L = P.local, I2 = 2 * int64_t(P.I), H = P.H, I = P.I;
    expect_weight(c, 0, {DT_U8}, {LAYOUT_ROW_MAJOR}, {L * I2, H / 2});
    expect_weight(c, 1, {DT_U8}, {LAYOUT_ROW_MAJOR}, {L * I2, H / 32});
    expect_weight(c, 2, {DT_U8}, {LAYOUT_ROW_MAJOR}, {L * H, I / 2});
    expect_weight(c, 3, {DT_U8}, {LAYOUT_ROW_MAJOR}, {L * H, I / 32});
    const float e2m1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,  //
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int s = 0; s < 256; ++s) {
        for (int code = 0; code < 16; ++code) P.scaled_e2m1[16 * s + code] = std::ldexp(e2m1[code], s - 127);
        P.half_scale_of[s] = std::ldexp(0.5f, s - 127);
    }
    P.isa = p.isa;
}

void run_moe_mxfp4(const KernelCall& c, const StepContext& ctx) {
    const MoeMxfp4Params& P = c.get<MoeMxfp4Params>();
    run_moe_grouped(c, ctx, P, {matmul_mxfp4, rows_mxfp4, P.isa == Isa::AVX512 ? split_block_pairs : nullptr});
}

}  // namespace bessemer
