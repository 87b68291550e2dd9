// moe_mxfp4@1's expert GEMM, AVX-512 (moe_mxfp4.cpp has the AVX2 fallback, the format and the
// dispatch; ops.ref_moe is the reference).
//
// Why: the AVX2 kernel spends about 25 instructions decoding and multiplying each 32-weight
// block (byte shuffle, sign-extend, convert, scale), so at batch 1 it is bound by the
// instruction rate, well below the memory bandwidth. Here a block of 16 code bytes is
// decoded by 4 instructions: one zero-extending load of its bytes to 16 dwords, one shift,
// and two vpermps through a 16-entry table (vpermps reads only an index's low 4 bits, so the
// low nibble needs no mask):
//   we = table[byte_j & 15] = element 2j,   wo = table[byte_j >> 4] = element 2j + 1.
// The table is the block's own: the E2M1 values times its E8M0 scale 2^(s - 127), one of 256
// made at prepare (scaled_e2m1; exact: a power of two times a 2-bit mantissa), loaded by the
// scale byte. So the scale costs a load instead of a multiply, and each token takes two FMAs
// per block, the fewest for 32 products (on a CPU that runs 512-bit vectors as two 256-bit
// halves, as AMD Zen 4 does, the block's vector work is the limit at batch 1):
//   even += we * x_even,   odd += wo * x_odd
// So that the inputs meet the weights in this order, the driver stores each 32-column block
// of x as its 16 even columns then its 16 odd ones (mxfp4_split_pairs, applied once per
// expert GEMM to the driver's own copy of x). The two accumulators per token are summed and
// reduced at the end of the row. The arithmetic of one (row, token) depends only on K: a
// token's result is the same whichever other tokens share its expert (batch invariance);
// the caller splits output rows over its threads.
//
// Compiled for AVX-512 by the pragma below and only called when the CPU has it; like
// linear_avx512.cpp this file includes no C++ standard library headers.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12 reports false positives inside avx512fintrin.h (_mm512_undefined_*, reduce_add).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <immintrin.h>
#include <stdint.h>

namespace bessemer {

void moe_mxfp4_rows_avx512(const uint8_t* codes, const uint8_t* scales, const float* scaled_e2m1, int64_t n0,
                           int64_t n1, int K, const float* x, int64_t ldx, int M, const float* bias, float* y,
                           int64_t ldy);

namespace {

constexpr int kTokens = 8;  // tokens per pass over a row (16 accumulators, table, 2 weight vectors)

// One block b of a row for MT tokens into even[0..MT) and odd[0..MT).
template <int MT>
inline void block(const uint8_t* codes, const float* scaled_e2m1, const uint8_t* scales, int b, const float* x,
                  int64_t ldx, __m512* even, __m512* odd) {
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 16 * b)));
    const __m512 table = _mm512_loadu_ps(scaled_e2m1 + 16 * scales[b]);
    const __m512 we = _mm512_permutexvar_ps(lo, table);
    const __m512 wo = _mm512_permutexvar_ps(_mm512_srli_epi32(lo, 4), table);
    for (int t = 0; t < MT; ++t) {
        const float* xb = x + t * ldx + 32 * b;
        even[t] = _mm512_fmadd_ps(we, _mm512_loadu_ps(xb), even[t]);
        odd[t] = _mm512_fmadd_ps(wo, _mm512_loadu_ps(xb + 16), odd[t]);
    }
}

template <int MT>
inline void row_tokens(const uint8_t* codes, const uint8_t* scales, const float* scaled_e2m1, int blocks,
                       const float* x, int64_t ldx, float* out) {
    __m512 even[MT], odd[MT];
    for (int t = 0; t < MT; ++t) even[t] = odd[t] = _mm512_setzero_ps();
    for (int b = 0; b < blocks; ++b) block<MT>(codes, scaled_e2m1, scales, b, x, ldx, even, odd);
    for (int t = 0; t < MT; ++t) out[t] = _mm512_reduce_add_ps(_mm512_add_ps(even[t], odd[t]));
}

}  // namespace

// Output rows [n0, n1) of y (M, N) = x (M, K, blocks split as split_block_pairs does) @ W^T
// (+ bias) for W's MXFP4 rows: codes (N, K/2), scales (N, K/32); on the calling thread.
void moe_mxfp4_rows_avx512(const uint8_t* codes, const uint8_t* scales, const float* scaled_e2m1, int64_t n0,
                           int64_t n1, int K, const float* x, int64_t ldx, int M, const float* bias, float* y,
                           int64_t ldy) {
    const int blocks = K / 32;
    for (int64_t n = n0; n < n1; ++n) {
        const uint8_t* rc = codes + n * (K / 2);
        const uint8_t* rs = scales + n * blocks;
        float r[kTokens];
        for (int m0 = 0; m0 < M; m0 += kTokens) {
            const int mt = M - m0 < kTokens ? M - m0 : kTokens;
            const float* xm = x + m0 * ldx;
            switch (mt) {
                case 8: row_tokens<8>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 7: row_tokens<7>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 6: row_tokens<6>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 5: row_tokens<5>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 4: row_tokens<4>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 3: row_tokens<3>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                case 2: row_tokens<2>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
                default: row_tokens<1>(rc, rs, scaled_e2m1, blocks, xm, ldx, r); break;
            }
            for (int t = 0; t < mt; ++t) y[(m0 + t) * ldy + n] = r[t] + (bias ? bias[n] : 0.0f);
        }
    }
}

}  // namespace bessemer
