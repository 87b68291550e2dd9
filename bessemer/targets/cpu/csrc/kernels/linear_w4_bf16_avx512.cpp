// linear_w4a16@2, AVX-512 BF16 + VBMI kernel (see linear_quant.cpp for the math and the
// fallback that runs @2 on other CPUs).
//
// Why: @1 widens every int4 code to fp32 (a shift and a shuffle per 16 weights) and does
// one fp32 FMA per weight; on 2 cores that is compute bound well below the memory
// bandwidth. Here the activations are rounded to bf16 once per block (by the driver's
// XPrepFn) and each vdpbf16ps does 16 outputs x 2 k. The codes are turned into bf16
// without any arithmetic: a code c in mantissa bits 3-6 of a bf16 whose exponent and
// sign bits are those of 1.0 is exactly 1 + c/16. So, per group g of G columns,
//     acc = sum_k xb[k] * (1 + c[k]/16)   =>   sum_k xb[k] c[k] = 16 (acc - sum_k xb[k])
//     y  += 16 s_g (acc - sx_g) + o_g sx_g,  sx_g = sum_k xb[k]
// (an offset of 1 rather than 128 + c keeps the cancellation small: acc is at most about
// twice the signal). Products and fp32 accumulation are exact up to fp32 rounding; the
// only approximation against @1 is xb = bf16(x) (round to nearest even).
// linear_w4a16@3 (symmetric codes, no offsets: w = s (c - 8)) is the same loop with the
// epilogue y += 16 s_g (acc - 1.5 sx_g) (= s_g (16 acc - 16 sx_g - 8 sx_g)): the offsets are
// neither stored nor read.
// linear_w4k@1 (two-level parameters) is the asymmetric loop over sub-blocks of 32 whose
// epilogue makes each sub-block's scale and offset from its uint8 codes and its
// super-block's fp16 values: s = d * sc, o = -(dmin * m) (one fp32 rounding each, what the
// fallback computes once at prepare); its partial sums stay in registers across the
// call's sub-blocks instead of going through y after each (two_level_step), and its
// sub-blocks' sums of x are made once per x block with the bf16 rounding (prep_bf16_sums)
// instead of once per panel group (the same sum_bf16 values; remaking them was about 9% of
// the GEMV microkernel's samples in a SmolLM2 decode profile).
//
// Decoding (panel16_int4: 8 bytes per panel and k; byte j = row j in the low nibble,
// row 8 + j in the high nibble), for a 64-byte block (8 k) and a k pair p of it:
// vpermb puts byte (2p)*8 + (r & 7) into both bytes of the low word of dword r and byte
// (2p+1)*8 + (r & 7) into both bytes of its high word; a right shift by 5 (rows 0-7: the
// low nibble of the word's high byte) or 1 (rows 8-15: the high nibble of its low byte)
// moves the code to bits 3-6 of each word; one vpternlogd keeps those bits and sets the
// bits of 1.0 (0x3F80). Three instructions per 32 weights, no unpermuting afterwards.
//
// panel16_int4_k8 (the layout the builder picks for this kernel; format/layouts.py) puts
// the four k pairs of an 8-k block into the four nibbles of each 16-bit word: word 2r + e
// holds row r at k = 2j + e in nibble j. Decoding pair j is then one 16-bit shift (left 3
// for j = 0, right 4j - 3 otherwise) and the same vpternlogd: two instructions per 32
// weights instead of three, and no VBMI.
//
// Compiled for AVX-512 + BF16 + VBMI by the pragma below and only called when the CPU has
// what the layout's decode needs (prepare checks at run time). Like linear_avx512.cpp this file includes no C++
// standard library headers.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>
#include <stdint.h>

#include "linear_driver.h"
#include "simd_avx512.h"

namespace bessemer {

void linear_w4_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, bool k8, const void* scales,
                           const void* offsets, bool bf16_params, int group, int N, int K, const float* bias,
                           float* y, int64_t ldy, int nthreads);
bool linear_w4_bf16_avx512_available(bool k8);
void linear_w4k_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const uint8_t* scales,
                            const uint8_t* offsets, const uint16_t* super_scales, const uint16_t* super_offsets,
                            int super_block, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads);

namespace {

constexpr int kMR = 8;   // max rows per microkernel
constexpr int kNR = 4;   // max panels (16 outputs each) per microkernel, M <= 4
constexpr int kNR8 = 2;  // panels when M > 4 (8 x 2 accumulators + decode constants fit 32 zmm)
// A GEMV streams each panel's codes once; the next panel group's are prefetched into L2 one
// group ahead (UkArgs::pf_next), and the current panels' this many cache lines ahead into L1:
// measured 7-15% faster at one thread on an expert's gate_up (1536 x 2048) from DRAM, Zen 4
// (2 to 16 lines alike): L1's own prefetcher lags behind four streams of L2 hits.
constexpr int kNearLines = 4;

struct alignas(64) PairIndex {
    uint8_t v[4][64];  // [k pair p of an 8-k block][byte of the decoded zmm]
    constexpr PairIndex() : v{} {
        for (int p = 0; p < 4; ++p)
            for (int r = 0; r < 16; ++r) {
                const int b0 = 2 * p * 8 + (r & 7), b1 = b0 + 8;
                v[p][4 * r] = v[p][4 * r + 1] = uint8_t(b0);
                v[p][4 * r + 2] = v[p][4 * r + 3] = uint8_t(b1);
            }
    }
};

constexpr PairIndex kPairIndex;

struct DecodeConsts {
    __m512i idx[4];
    __m512i shift;  // per dword: 5 (rows 0-7), 1 (rows 8-15)
    __m512i keep;   // code bits 3-6 of both words
    __m512i one;    // bf16 1.0 in both words
};

inline DecodeConsts decode_consts() {
    DecodeConsts c;
    for (int p = 0; p < 4; ++p) c.idx[p] = _mm512_load_si512(kPairIndex.v[p]);
    c.shift = _mm512_setr_epi32(5, 5, 5, 5, 5, 5, 5, 5, 1, 1, 1, 1, 1, 1, 1, 1);
    c.keep = _mm512_set1_epi32(0x00780078);
    c.one = _mm512_set1_epi32(0x3F803F80);
    return c;
}

// 16 rows x k pair p of the 64-byte block at blk as bf16 pairs (1 + c/16).
inline __m512bh decode_pair(__m512i blk, int p, const DecodeConsts& c) {
    const __m512i v = _mm512_srlv_epi32(_mm512_permutexvar_epi8(c.idx[p], blk), c.shift);
    return (__m512bh)_mm512_ternarylogic_epi32(v, c.keep, c.one, 0xEA);  // (v & keep) | one
}

// panel16_int4_k8: 16 rows x k pair j of the 64-byte block at blk (j a constant after
// unrolling).
inline __m512bh decode_pair_k8(__m512i blk, int j, const DecodeConsts& c) {
    __m512i v;
    switch (j) {
        case 0: v = _mm512_slli_epi16(blk, 3); break;
        case 1: v = _mm512_srli_epi16(blk, 1); break;
        case 2: v = _mm512_srli_epi16(blk, 5); break;
        default: v = _mm512_srli_epi16(blk, 9); break;
    }
    return (__m512bh)_mm512_ternarylogic_epi32(v, c.keep, c.one, 0xEA);  // (v & keep) | one
}

template <bool K8>
inline __m512bh decode(__m512i blk, int p, const DecodeConsts& c) {
    return K8 ? decode_pair_k8(blk, p, c) : decode_pair(blk, p, c);
}

inline __m512i bcast_pair(const uint16_t* xb) {
    int v;
    __builtin_memcpy(&v, xb, 4);
    return _mm512_set1_epi32(v);
}

// 16 group parameters at element i of p: fp32 (pbytes 4) or bf16 (pbytes 2) widened.
inline __m512 load_params(const float* p, int64_t i, int pbytes) {
    if (pbytes == 2)
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(param_at(p, i, 2)))), 16));
    return _mm512_loadu_ps(p + i);
}

// sum of n bf16 values as fp32.
inline float sum_bf16(const uint16_t* p, int n) {
    __m512 s = _mm512_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16)
        s = _mm512_add_ps(s, _mm512_castsi512_ps(_mm512_slli_epi32(
                                 _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))), 16)));
    if (i < n) {
        const __m256i h = _mm256_maskz_loadu_epi16(__mmask16((1u << (n - i)) - 1u), p + i);
        s = _mm512_add_ps(s, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
    }
    return _mm512_reduce_add_ps(s);
}

// TWO_LEVEL x blocks (QuantParams::x_sums = 32): a prepared row of kc bf16 values (even
// padded) is followed by the fp32 sums of its sub-blocks of 32 (sum_bf16, the same values
// the other modes make per panel group), made once per block by prep_bf16_sums.
constexpr int kSub = 32;

// where the sum of sub-block j of a prepared row of kc columns lies, in bf16 elements from
// the row's start: after its even-padded values (linear_driver.h: XPrepFn, ldq).
inline int64_t block_sum_at(int kc, int j) { return (kc + 1) / 2 * 2 + 2 * j; }

// the sum of sub-block j of the prepared row xr (kc columns).
inline float block_sum(const uint16_t* xr, int kc, int j) {
    float v;
    __builtin_memcpy(&v, xr + block_sum_at(kc, j), 4);
    return v;
}

// Group parameters: bf16/fp32 scale and offset, scale only, or two-level (linear_w4k).
enum ParamKind { PK_ASYM = 0, PK_SYM = 1, PK_TWO_LEVEL = 2 };

// 16 fp16 values at p widened to fp32.
inline __m512 load_half16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 uint8 codes at p times the fp32 values v (one rounding).
inline __m512 times_u8(__m512 v, const void* p) {
    const __m512 c = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    return _mm512_mul_ps(v, c);
}

// TWO_LEVEL epilogue of sub-block g of the call's ng (per sub-blocks a super-block). The
// asymmetric epilogue's arithmetic with s16 = (16 d) sc, o = (-dmin) m
// (16 d and -dmin are exact, so these are 16 (d sc) and -(dmin m) rounded once, what the
// fallback computes at prepare), but the running sums stay in Y (registers) across the
// call's sub-blocks: y is read once (when accumulating) and written once per call instead
// of loaded, masked and stored after every sub-block; the additions are the same, in the
// same order, so the result is bit-identical. d16 / ndmin: the super-block's values,
// widened from fp16 at its first sub-block.
template <int MR, int NR>
inline void two_level_step(const UkArgs& a, int g, int ng, int per, const __m512 (&acc)[MR][NR],
                           const float (&sx)[MR], __m512 (&d16)[NR], __m512 (&ndmin)[NR], __m512 (&Y)[MR][NR]) {
    const int64_t ppanel = a.qpstride * per;  // code bytes between panels: 16 rows x K/32
    const bool last = g == ng - 1;
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) {
        const int col0 = n * 16;
        const __mmask16 mask = simd512::panel_mask_or_none(a.ncols - col0);
        if (g % per == 0) {  // the super-block's first sub-block
            const int64_t pi = n * a.qpstride + (g / per) * 16;
            d16[n] = _mm512_mul_ps(load_half16(a.qds + pi), _mm512_set1_ps(16.0f));
            ndmin[n] = _mm512_sub_ps(_mm512_setzero_ps(), load_half16(a.qdo + pi));
        }
        const __m512 s16 = times_u8(d16[n], reinterpret_cast<const uint8_t*>(a.qs) + n * ppanel + g * 16);
        const __m512 o = times_u8(ndmin[n], reinterpret_cast<const uint8_t*>(a.qo) + n * ppanel + g * 16);
        const __m512 b = simd512::load_bias16(last && a.bias ? a.bias + col0 : nullptr, mask);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
            const __m512 sb = _mm512_set1_ps(sx[r]);
            const __m512 v = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][n], sb), s16, _mm512_fmadd_ps(o, sb, b));
            if (g > 0) Y[r][n] = _mm512_add_ps(Y[r][n], v);
            else Y[r][n] = a.accumulate ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, a.y + r * a.ldy + col0)) : v;
            if (last) _mm512_mask_storeu_ps(a.y + r * a.ldy + col0, mask, Y[r][n]);
        }
    }
}

// One call covers a.kc columns (a.kc / G groups) of MR rows x NR panels; a.x is the driver's
// bf16 block (row stride a.ldx elements, even, zero pad), a.w the codes at its first k.
// K8: panel16_int4_k8 codes (G and K multiples of 8: no partial block). SYM: symmetric
// codes, w = s (c - 8): a.qo is null and never read. TWO_LEVEL: a.group is the super-block
// (the driver's unit for the parameter pointers), the loop's groups are its sub-blocks of 32.
template <int MR, int NR, bool K8, int MODE>
void ukr_w4_bf16(const UkArgs& a) {
    constexpr bool SYM = MODE == PK_SYM;
    const DecodeConsts dc = decode_consts();
    const uint16_t* xr[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) xr[r] = reinterpret_cast<const uint16_t*>(a.x) + r * a.ldx;
    const char* wp[NR];
#pragma GCC unroll 4
    for (int n = 0; n < NR; ++n) wp[n] = a.w + n * a.pstride;
    const int G = MODE == PK_TWO_LEVEL ? kSub : a.group, ng = a.kc / G;
    const int per = a.group / kSub;  // TWO_LEVEL: sub-blocks per super-block
    // GEMV prefetch as in linear_quant_avx512.cpp (one cache line = 8 k of a panel) into L2,
    // and the current panels' codes kNearLines lines ahead into L1 (see kNearLines).
    const int64_t pq_len = a.pf_next ? NR * a.qpstride : 0;
    const float* pq_s = param_at(a.qs, pq_len, a.pbytes);
    const float* pq_o = SYM ? nullptr : param_at(a.qo, pq_len, a.pbytes);
    const int lines = (a.kc + 7) / 8;
    // parameters per prefetch: 16 (one group's of a panel: 32 or 64 bytes), or a cache line
    // of TWO_LEVEL codes (16 x a.pbytes bytes, 96 or 128 with super-blocks of 192 or 256,
    // would skip lines, each then a DRAM miss at a sub-block end: about 6% of a 1-thread
    // GEMV over SmolLM2's decoder weights streamed from DRAM)
    const int pq_inc = MODE == PK_TWO_LEVEL ? 64 / a.pbytes : 16;
    const int64_t pq_step = (pq_len / pq_inc + lines - 1) / lines * pq_inc;
    // TWO_LEVEL: GEMV prefetches the next panel group's fp16 d and dmin (sparse reads the
    // hardware prefetcher does not follow, like the sub-block codes above).
    if (MODE == PK_TWO_LEVEL && a.pf_next) {
        const int64_t bytes = int64_t(a.kc / a.group) * 32;  // fp16 x 16 rows per super-block
        for (int n = 0; n < NR; ++n)
            for (int64_t b = 0; b < bytes; b += 64) {
                _mm_prefetch(reinterpret_cast<const char*>(a.qds + (NR + n) * a.qpstride) + b, _MM_HINT_T0);
                _mm_prefetch(reinterpret_cast<const char*>(a.qdo + (NR + n) * a.qpstride) + b, _MM_HINT_T0);
            }
    }
    __m512 d16[NR], ndmin[NR], Y[MR][NR];  // TWO_LEVEL (two_level_step)
    // One chain of vdpbf16ps per output tile for every MR: extra accumulators for small MR
    // (fewer dependent steps at M = 1) would sum a row's k in another order than when the
    // row is in a larger batch (batch invariance, linear_driver.h).
    for (int g = 0; g < ng; ++g) {
        __m512 acc[MR][NR];
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
            for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_setzero_ps();
        const int k0 = g * G, k1 = k0 + G;
        for (int k = k0; k < k1; k += 8) {
            __m512i blk[NR];
            if (K8 || k + 8 <= k1) {
                if (a.gemv)
#pragma GCC unroll 4
                    for (int n = 0; n < NR; ++n) _mm_prefetch(wp[n] + k * 8 + kNearLines * 64, _MM_HINT_T0);
                if (a.pf_next) {
#pragma GCC unroll 4
                    for (int n = 0; n < NR; ++n) _mm_prefetch(wp[n] + k * 8 + a.pf_next, _MM_HINT_T1);
                    const int64_t i0 = (k / 8) * pq_step, i1 = i0 + pq_step < pq_len ? i0 + pq_step : pq_len;
                    for (int64_t i = i0; i < i1; i += pq_inc) {
                        _mm_prefetch(reinterpret_cast<const char*>(param_at(pq_s, i, a.pbytes)), _MM_HINT_T0);
                        if (!SYM) _mm_prefetch(reinterpret_cast<const char*>(param_at(pq_o, i, a.pbytes)), _MM_HINT_T0);
                    }
                }
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) blk[n] = _mm512_loadu_si512(wp[n] + k * 8);
#pragma GCC unroll 4
                for (int p = 0; p < 4; ++p) {
                    __m512bh wv[NR];
#pragma GCC unroll 4
                    for (int n = 0; n < NR; ++n) wv[n] = decode<K8>(blk[n], p, dc);
#pragma GCC unroll 8
                    for (int r = 0; r < MR; ++r) {
                        const __m512bh xv = (__m512bh)bcast_pair(xr[r] + k + 2 * p);
#pragma GCC unroll 4
                        for (int n = 0; n < NR; ++n)
                            acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xv);
                    }
                }
            } else {  // last (k1 - k) < 8 columns of a group that is not a multiple of 8 (G == K):
                      // codes past k1 load as 0, the x pad past an odd k1 is 0
                const int rem = k1 - k;
                const __mmask64 m = (__mmask64(1) << (rem * 8)) - 1;
#pragma GCC unroll 4
                for (int n = 0; n < NR; ++n) blk[n] = _mm512_maskz_loadu_epi8(m, wp[n] + k * 8);
                for (int p = 0; 2 * p < rem; ++p) {
                    __m512bh wv[NR];
#pragma GCC unroll 4
                    for (int n = 0; n < NR; ++n) wv[n] = decode<K8>(blk[n], p, dc);
#pragma GCC unroll 8
                    for (int r = 0; r < MR; ++r) {
                        const __m512bh xv = (__m512bh)bcast_pair(xr[r] + k + 2 * p);
#pragma GCC unroll 4
                        for (int n = 0; n < NR; ++n) acc[r][n] = _mm512_dpbf16_ps(acc[r][n], wv[n], xv);
                    }
                }
            }
        }
        float sx[MR];
        if (MODE == PK_TWO_LEVEL) {  // the sums made once per x block (prep_bf16_sums)
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) sx[r] = block_sum(xr[r], a.kc, g);
            two_level_step<MR, NR>(a, g, ng, per, acc, sx, d16, ndmin, Y);
            continue;
        }
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) sx[r] = sum_bf16(xr[r] + k0, G);
        const bool load_y = g > 0 || a.accumulate;
        const float* bias = g == ng - 1 ? a.bias : nullptr;
#pragma GCC unroll 4
        for (int n = 0; n < NR; ++n) {
            const int col0 = n * 16;
            const int nc = a.ncols - col0;
            if (nc <= 0) break;
            const __mmask16 mask = simd512::panel_mask(nc);
            // panel16 params: padded to whole panels
            const __m512 b = simd512::load_bias16(bias ? bias + col0 : nullptr, mask);
            const int64_t pi = n * a.qpstride + g * 16;
            const __m512 s16 = _mm512_mul_ps(load_params(a.qs, pi, a.pbytes), _mm512_set1_ps(16.0f));
            const __m512 o = SYM ? b : load_params(a.qo, pi, a.pbytes);  // (unused when SYM)
#pragma GCC unroll 8
            for (int r = 0; r < MR; ++r) {
                __m512 v;
                if (SYM) {  // w = s (c - 8): y += 16 s (acc - 1.5 sx), see the top of the file
                    v = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][n], _mm512_set1_ps(1.5f * sx[r])), s16, b);
                } else {
                    const __m512 sb = _mm512_set1_ps(sx[r]);
                    v = _mm512_fmadd_ps(_mm512_sub_ps(acc[r][n], sb), s16, _mm512_fmadd_ps(o, sb, b));
                }
                simd512::store_row16(a.y + r * a.ldy + col0, mask, v, load_y);
            }
        }
    }
}

template <bool K8, int MODE>
struct UkTableW4Bf16 {
    UkFn f[(kMR + 1) * (kNR + 1)];
    template <int MR, int NR>
    constexpr void set() { f[MR * (kNR + 1) + NR] = ukr_w4_bf16<MR, NR, K8, MODE>; }
    template <int MR>
    constexpr void row() {
        set<MR, 1>(); set<MR, 2>();
        if (MR <= 4) { set<MR, 3>(); set<MR, 4>(); }
    }
    constexpr UkTableW4Bf16() : f{} {
        row<1>(); row<2>(); row<3>(); row<4>(); row<5>(); row<6>(); row<7>(); row<8>();
    }
};

const UkTableW4Bf16<false, PK_ASYM> kTable;
const UkTableW4Bf16<true, PK_ASYM> kTableK8;
const UkTableW4Bf16<false, PK_SYM> kTableSym;
const UkTableW4Bf16<true, PK_SYM> kTableK8Sym;
const UkTableW4Bf16<true, PK_TWO_LEVEL> kTableK8TwoLevel;

// XPrepFn: rows of fp32 -> bf16 (round to nearest even, vcvtneps2bf16), zero pad to ldq.
void prep_bf16(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq) {
    for (int r = 0; r < rows; ++r) {
        const float* s = x + r * ldx;
        uint16_t* d = static_cast<uint16_t*>(out) + r * ldq;
        int i = 0;
        for (; i + 16 <= kc; i += 16)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + i)));
        if (i < kc) {
            const __mmask16 m = __mmask16((1u << (kc - i)) - 1u);
            _mm256_mask_storeu_epi16(d + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, s + i)));
        }
        for (int j = kc; j < ldq; ++j) d[j] = 0;
    }
}

// XPrepFn of TWO_LEVEL: prep_bf16, then each row's sub-block sums after its values (see
// block_sum; kc is whole super-blocks, so whole sub-blocks).
void prep_bf16_sums(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq) {
    prep_bf16(x, ldx, rows, kc, out, ldq);
    for (int r = 0; r < rows; ++r) {
        uint16_t* d = static_cast<uint16_t*>(out) + r * ldq;
        for (int j = 0; j < kc / kSub; ++j) {
            const float v = sum_bf16(d + j * kSub, kSub);
            __builtin_memcpy(d + block_sum_at(kc, j), &v, 4);
        }
    }
}

}  // namespace

void linear_w4_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, bool k8, const void* scales,
                           const void* offsets, bool bf16_params, int group, int N, int K, const float* bias,
                           float* y, int64_t ldy, int nthreads) {
    const QuantParams qp{static_cast<const float*>(scales), static_cast<const float*>(offsets), group,
                         bf16_params ? 2 : 4};
    const UkFn* table = offsets ? (k8 ? kTableK8.f : kTable.f) : (k8 ? kTableK8Sym.f : kTableSym.f);
    linear_drive_q(x, ldx, M, codes, 8, N, K, bias, y, ldy, nthreads, kMR, M <= 4 ? kNR : kNR8, table, kNR + 1, &qp,
                   prep_bf16, 2);
}

void linear_w4k_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const uint8_t* scales,
                            const uint8_t* offsets, const uint16_t* super_scales, const uint16_t* super_offsets,
                            int super_block, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    // the driver offsets qs/qo by elements of super_block / 32 bytes (a super-block's
    // sub-block codes of one row) and qds/qdo by fp16 elements, per (panel, super-block)
    QuantParams qp{reinterpret_cast<const float*>(scales), reinterpret_cast<const float*>(offsets), super_block,
                   super_block / 32};
    qp.super_scales = super_scales;
    qp.super_offsets = super_offsets;
    qp.x_sums = kSub;
    linear_drive_q(x, ldx, M, codes, 8, N, K, bias, y, ldy, nthreads, kMR, M <= 4 ? kNR : kNR8, kTableK8TwoLevel.f,
                   kNR + 1, &qp, prep_bf16_sums, 2);
}

bool linear_w4_bf16_avx512_available(bool k8) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
           (k8 || __builtin_cpu_supports("avx512vbmi"));
}

}  // namespace bessemer
