// linear_fp8@1, AVX-512 BF16 kernel (see linear_fp8.cpp for the math and the AVX2 kernel).
//
// E4M3 values are exact in bf16, so both operands go to vdpbf16ps: each instruction does
// 16 outputs x 2 k (products exact, fp32 accumulation). The activations are quantized to
// E4M3 and stored as bf16 by the driver (row-major, k pairs adjacent: one 32-bit broadcast
// per row and k pair). The weights of a panel at k and k+1 (two 16-byte rows of panel16)
// are interleaved bytewise, widened to 16 bits and mapped to bf16 by a 128-entry table of
// magnitudes (two vpermt2w over 64 entries each, the 7th bit selects) plus the sign bit.
//
// Compiled for AVX-512 + BF16 by the pragma below and only called when the CPU has them
// (prepare checks avx512bf16 at run time). Like linear_avx512.cpp this file includes no
// C++ standard library headers.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_fp8_family.h"
#include "simd_avx512.h"

namespace bessemer {

void linear_fp8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, float xs,
                       bool dynamic, int act_group, int N, int K, const float* bias, float* y, int64_t ldy,
                       int nthreads);

namespace {

constexpr int kMR = 8;   // max rows per microkernel
constexpr int kNR = 4;   // max panels per microkernel (M <= 4)
constexpr int kNR8 = 2;  // panels when M > 4

// bf16 bits of the E4M3 magnitude with bits m7 (exponent 4 bits, mantissa 3 bits).
constexpr uint16_t e4m3_mag_to_bf16(int m7) {
    const int e = m7 >> 3, m = m7 & 7;
    if (e > 0) return uint16_t(((e - 7 + 127) << 7) | (m << 4));
    if (m == 0) return 0;
    const int t = m >= 4 ? 2 : (m >= 2 ? 1 : 0);  // subnormal m * 2^-9 = 2^(t-9) * (m / 2^t)
    return uint16_t(((t - 9 + 127) << 7) | (((m << (3 - t)) & 7) << 4));
}

struct alignas(64) Bf16Lut {
    uint16_t v[128];
    constexpr Bf16Lut() : v{} {
        for (int i = 0; i < 128; ++i) v[i] = e4m3_mag_to_bf16(i);
    }
};

constexpr Bf16Lut kLut;

struct LutRegs {
    __m512i t0, t1, t2, t3;  // entries 0-31, 32-63, 64-95, 96-127
};

inline LutRegs lut_regs() {
    LutRegs l;
    l.t0 = _mm512_load_si512(kLut.v);
    l.t1 = _mm512_load_si512(kLut.v + 32);
    l.t2 = _mm512_load_si512(kLut.v + 64);
    l.t3 = _mm512_load_si512(kLut.v + 96);
    return l;
}

// E4M3 bytes (b0: 16 rows at k, b1: at k + 1) -> 32 bf16: lane j = (row j at k, at k + 1).
inline __m512bh pair_bf16(__m128i b0, __m128i b1, const LutRegs& l) {
    const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(b0, b1)),
                                               _mm_unpackhi_epi8(b0, b1), 1);
    const __m512i h = _mm512_cvtepu8_epi16(ab);
    __m512i r = _mm512_permutex2var_epi16(l.t0, h, l.t1);
    r = _mm512_mask_mov_epi16(r, _mm512_test_epi16_mask(h, _mm512_set1_epi16(0x40)),
                              _mm512_permutex2var_epi16(l.t2, h, l.t3));
    r = _mm512_ternarylogic_epi32(r, _mm512_slli_epi16(h, 8), _mm512_set1_epi16(short(0x8000)), 0xF8);  // r | sign
    return (__m512bh)r;
}

// 16 values -> their E4M3 values (saturating, ties to even) as fp32 (same steps as AVX2).
inline __m512 e4m3_round16(__m512 v) {
    const __m512i vi = _mm512_castps_si512(v);
    const __m512i sign = _mm512_and_si512(vi, _mm512_set1_epi32(int(0x80000000u)));
    const __m512 a = _mm512_min_ps(_mm512_castsi512_ps(_mm512_andnot_si512(sign, vi)), _mm512_set1_ps(448.0f));
    __m512i b = _mm512_castps_si512(a);
    b = _mm512_add_epi32(b, _mm512_add_epi32(_mm512_set1_epi32(0x7FFFF),
                                             _mm512_and_si512(_mm512_srli_epi32(b, 20), _mm512_set1_epi32(1))));
    const __m512 nrm = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(int(0xFFF00000u))));
    const __m512 magic = _mm512_set1_ps(16384.0f);
    const __m512 sub = _mm512_sub_ps(_mm512_add_ps(a, magic), magic);
    const __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_set1_ps(0.015625f), _CMP_LT_OQ), nrm, sub);
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
}

// Rows of E4M3(x / s) as bf16 (exact: the upper half of the fp32 bits); one zero pad
// column when kc is odd (the kernel reads k in pairs).
void quantize_rows_bf16(const float* x, int64_t ldx, int rows, int kc, const float* s, const Fp8Groups& g, char* out,
                        int64_t ldq) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        uint16_t* q = reinterpret_cast<uint16_t*>(out) + r * ldq;
        fp8_segments(g, r, kc, s[r], [&](int a, int b, float sd, float post) {
            const __m512 sv = _mm512_set1_ps(sd), pv = _mm512_set1_ps(post);
            for (int k = a; k < b; k += 16) {
                const int n = b - k < 16 ? b - k : 16;
                const __mmask16 m = __mmask16((1u << n) - 1u);
                const __m512 v = _mm512_mul_ps(e4m3_round16(_mm512_div_ps(_mm512_maskz_loadu_ps(m, xr + k), sv)), pv);
                _mm256_mask_storeu_epi16(q + k, m,
                                         _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
            }
        });
        if (kc & 1) q[kc] = 0;
    }
}

void row_scales_avx512(const float* x, int64_t ldx, int rows, int K, float* s) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        __m512 m = _mm512_setzero_ps();
        for (int k = 0; k < K; k += 16) {
            const __mmask16 mk = K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1u);
            m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_maskz_loadu_ps(mk, xr + k)));
        }
        const float amax = _mm512_reduce_max_ps(m);
        s[r] = amax > 0.0f ? amax / kE4M3Max : 1.0f;
    }
}

template <int MR, int NR>
void ukr_fp8_bf16(const Fp8Args& a) {
    const LutRegs lut = lut_regs();
    const uint16_t* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = reinterpret_cast<const uint16_t*>(a.xq) + r * a.ldq;
    const uint8_t* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    // A later K block (starting at an even k) resumes the unscaled partial sums the previous
    // one stored in y; the last scales them: one dot-product chain over k = 0..K-1 per row.
    __m512 acc[MR][NR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n)
            acc[r][n] = a.accumulate ? _mm512_maskz_loadu_ps(simd512::panel_mask_or_none(a.ncols - n * 16),
                                                             a.y + r * a.ldy + n * 16)
                                     : _mm512_setzero_ps();
    const int kp = a.kc & ~1;
    for (int k = 0; k <= kp; k += 2) {
        if (k == kp && !(a.kc & 1)) break;
        if (a.pf_next && (k & 3) == 0)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n)
                _mm_prefetch(reinterpret_cast<const char*>(wp[n] + k * 16 + a.pf_next), _MM_HINT_T0);
        __m512bh wv[NR];
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const __m128i b0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[n] + k * 16));
            // the odd tail k has no k + 1 row in the panel: pair it with zero weights
            const __m128i b1 = k < kp ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp[n] + k * 16 + 16))
                                      : _mm_setzero_si128();
            wv[n] = pair_bf16(b0, b1, lut);
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            uint32_t pair;
            __builtin_memcpy(&pair, xr[r] + k, 4);
            const __m512bh xb = (__m512bh)_mm512_set1_epi32(int(pair));
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xb);
        }
    }
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16;
        const int nc = a.ncols - col0;
        if (nc <= 0) break;
        const __mmask16 mask = simd512::panel_mask(nc);
        if (!a.last) {  // partial sums, finished by the last K block
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(a.y + r * a.ldy + col0, mask, acc[r][n]);
            continue;
        }
        const __m512 wsv = _mm512_maskz_loadu_ps(mask, a.ws + col0);
        const __m512 b = simd512::load_bias16(a.bias ? a.bias + col0 : nullptr, mask);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512 s = _mm512_mul_ps(wsv, _mm512_set1_ps(a.xs[r]));
            simd512::store_row16(a.y + r * a.ldy + col0, mask, _mm512_fmadd_ps(acc[r][n], s, b), false);
        }
    }
}

struct UkTableFp8 {
    Fp8Fn f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_fp8_bf16<MR, NR>; }
    template <int MR>
    constexpr void row() { set<MR, 1>(); set<MR, 2>(); if (MR <= 4) { set<MR, 3>(); set<MR, 4>(); } }
    constexpr UkTableFp8() : f{} {
        row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>(); row<7>(); row<8>();
    }
};

const UkTableFp8 kTableFp8;

}  // namespace

void linear_fp8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, float xs,
                       bool dynamic, int act_group, int N, int K, const float* bias, float* y, int64_t ldy,
                       int nthreads) {
    linear_fp8_drive(x, ldx, M, codes, scales, xs, dynamic ? row_scales_avx512 : nullptr, act_group, N, K, bias, y,
                     ldy, nthreads, kMR, M <= 4 ? kNR : kNR8, kTableFp8.f, kNR + 1, quantize_rows_bf16, 2);
}

}  // namespace bessemer
