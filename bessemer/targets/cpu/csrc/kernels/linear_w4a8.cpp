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
// of them (low and high nibbles) 7620, stay far below 32767, so every step is exact; the
// 4-row kernel of groups of a multiple of 32 adds 4 blocks' int16 sums (30480) before it
// widens them to int32, which is exact too.
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

// Group g's epilogue, the one statement of the fp32 steps every AVX2 kernel takes (so that a
// row's bits do not depend on which kernel ran it): accf[r] += float(acc[r] - xc) * (xs * ws),
// acc the group's exact int32 sums of MR rows (columns 0-7, 8-15).
template <int MR>
inline void w4a8_add_group(const W4A8Args& a, int g, const __m256i (&acc)[MR][2], __m256 (&accf)[MR][2]) {
    const __m256 w0 = _mm256_loadu_ps(a.ws + g * 16), w1 = _mm256_loadu_ps(a.ws + g * 16 + 8);
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

// y (+ bias) of MR rows from their fp32 accumulators (columns 0-7, 8-15), ncols of them.
template <int MR>
inline void w4a8_store_rows(const W4A8Args& a, const __m256 (&accf)[MR][2]) {
    const int nc = a.ncols;
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
        float* yp = a.y + r * a.ldy;
        if (nc >= 16) {
            store_row16(yp, accf[r][0], accf[r][1], a.bias);
        } else {
            alignas(32) float t[16];
            _mm256_store_ps(t, accf[r][0]);
            _mm256_store_ps(t + 8, accf[r][1]);
            store_row_tail(yp, t, nc, a.bias);
        }
    }
}

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
        w4a8_add_group<MR>(a, g, acc, accf);
    }
    w4a8_store_rows<MR>(a, accf);
}

// The 4-row kernel for groups of a multiple of 32: per 32 k (4 blocks of 8 k) each row's two
// int16 sums per column add up the 4 blocks before one widening to int32 (4 * 7620 <= 32767:
// exact), where ukr_w4a8_avx2 widens every block (a third of its vector operations). The
// block is inline assembly because GCC spills the eight int16 sums of the intrinsics version
// (it hoists the next blocks' loads above them): eight sums, the nibble mask, four decoded
// nibble vectors, two activation broadcasts and a product fill the 16 ymm registers exactly.
//   ymm9/ymm10: low/high nibbles of columns 0-7, ymm11/ymm12: of columns 8-15;
//   ymm13/ymm14: a row's activation dwords A (low nibbles' k) and B (high nibbles' k).
#define W4A8_DECODE                            \
    "vpand (%[p]), %[low], %%ymm9\n\t"         \
    "vmovdqu (%[p]), %%ymm10\n\t"              \
    "vpsrlw $4, %%ymm10, %%ymm10\n\t"          \
    "vpand %%ymm10, %[low], %%ymm10\n\t"       \
    "vpand 32(%[p]), %[low], %%ymm11\n\t"      \
    "vmovdqu 32(%[p]), %%ymm12\n\t"            \
    "vpsrlw $4, %%ymm12, %%ymm12\n\t"          \
    "vpand %%ymm12, %[low], %%ymm12\n\t"
// one row's block, the sums S0 (columns 0-7) and S1 (8-15) set (SET) or added to (ADD)
#define W4A8_ROW_SET(S0, S1, X)                    \
    "vpbroadcastd (" X "), %%ymm13\n\t"            \
    "vpbroadcastd 4(" X "), %%ymm14\n\t"           \
    "vpmaddubsw %%ymm13, %%ymm9, %" S0 "\n\t"      \
    "vpmaddubsw %%ymm13, %%ymm11, %" S1 "\n\t"     \
    "vpmaddubsw %%ymm14, %%ymm10, %%ymm15\n\t"     \
    "vpmaddubsw %%ymm14, %%ymm12, %%ymm14\n\t"     \
    "vpaddw %%ymm15, %" S0 ", %" S0 "\n\t"         \
    "vpaddw %%ymm14, %" S1 ", %" S1 "\n\t"
#define W4A8_ROW_ADD(S0, S1, X)                    \
    "vpbroadcastd (" X "), %%ymm13\n\t"            \
    "vpbroadcastd 4(" X "), %%ymm14\n\t"           \
    "vpmaddubsw %%ymm13, %%ymm9, %%ymm15\n\t"      \
    "vpmaddubsw %%ymm13, %%ymm11, %%ymm13\n\t"     \
    "vpaddw %%ymm15, %" S0 ", %" S0 "\n\t"         \
    "vpaddw %%ymm13, %" S1 ", %" S1 "\n\t"         \
    "vpmaddubsw %%ymm14, %%ymm10, %%ymm15\n\t"     \
    "vpmaddubsw %%ymm14, %%ymm12, %%ymm14\n\t"     \
    "vpaddw %%ymm15, %" S0 ", %" S0 "\n\t"         \
    "vpaddw %%ymm14, %" S1 ", %" S1 "\n\t"
#define W4A8_OPS(ROW)                                                                        \
    W4A8_DECODE ROW("[s00]", "[s01]", "%[x0]") ROW("[s10]", "[s11]", "%[x1]")               \
        ROW("[s20]", "[s21]", "%[x2]") ROW("[s30]", "[s31]", "%[x3]")
#define W4A8_SUMS(C)                                                                         \
    [s00] C(s[0][0]), [s01] C(s[0][1]), [s10] C(s[1][0]), [s11] C(s[1][1]), [s20] C(s[2][0]), \
        [s21] C(s[2][1]), [s30] C(s[3][0]), [s31] C(s[3][1])
#define W4A8_IN [p] "r"(p), [x0] "r"(x[0] + o), [x1] "r"(x[1] + o), [x2] "r"(x[2] + o), [x3] "r"(x[3] + o), [low] "x"(low)
// "memory": the block reads the codes and activations through its pointer operands
#define W4A8_CLOBBER "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "memory"
#define W4A8_OUT(v) "=x"(v)
#define W4A8_INOUT(v) "+x"(v)

// Block at p (64 bytes of codes), activations at x[r] + o: s = (FIRST) or += its int16 sums.
template <bool FIRST>
inline void w4a8_block_rows4(const char* p, const int8_t* const* x, int64_t o, __m256i low, __m256i (&s)[4][2]) {
    if (FIRST)
        __asm__(W4A8_OPS(W4A8_ROW_SET) : W4A8_SUMS(W4A8_OUT) : W4A8_IN : W4A8_CLOBBER);
    else
        __asm__(W4A8_OPS(W4A8_ROW_ADD) : W4A8_SUMS(W4A8_INOUT) : W4A8_IN : W4A8_CLOBBER);
}
#undef W4A8_DECODE
#undef W4A8_ROW_SET
#undef W4A8_ROW_ADD
#undef W4A8_OPS
#undef W4A8_SUMS
#undef W4A8_IN
#undef W4A8_CLOBBER
#undef W4A8_OUT
#undef W4A8_INOUT

// The 32 k from o (4 blocks at p) of 4 rows: acc = (ADD: acc +) their int32 sums.
template <bool ADD>
inline void w4a8_chunk_rows4(const char* p, const int8_t* const* x, int64_t o, __m256i low, __m256i (&acc)[4][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s[4][2];
    w4a8_block_rows4<true>(p, x, o, low, s);
    w4a8_block_rows4<false>(p + 64, x, o + 8, low, s);
    w4a8_block_rows4<false>(p + 128, x, o + 16, low, s);
    w4a8_block_rows4<false>(p + 192, x, o + 24, low, s);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m256i t = _mm256_madd_epi16(s[r][h], ones);
            acc[r][h] = ADD ? _mm256_add_epi32(acc[r][h], t) : t;
        }
}

// 4 rows x one panel, G a multiple of 32: a group's int32 sums from its chunks of 32 k (ONE:
// G = 32, one chunk), then w4a8_add_group (the same int32 sums as ukr_w4a8_avx2, so the same
// fp32 steps and bits).
template <bool ONE>
void ukr_w4a8_avx2_g32(const W4A8Args& a) {
    __m256 accf[4][2];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) accf[r][0] = accf[r][1] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0F);
    const int8_t* x[4] = {a.xq, a.xq + a.ldq, a.xq + 2 * a.ldq, a.xq + 3 * a.ldq};
    const char* w = reinterpret_cast<const char*>(a.w);
    for (int g = 0; g < a.ng; ++g) {
        const int64_t k0 = int64_t(g) * a.G;  // 8 k = 64 bytes of codes
        __m256i acc[4][2];
        w4a8_chunk_rows4<false>(w + k0 * 8, x, k0, low, acc);
        if (!ONE)
            for (int64_t k = k0 + 32; k < k0 + a.G; k += 32) w4a8_chunk_rows4<true>(w + k * 8, x, k, low, acc);
        w4a8_add_group<4>(a, g, acc, accf);
    }
    w4a8_store_rows<4>(a, accf);
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

// The 4-row kernel of groups of 32 (G32) or of a multiple of 32 (G32N).
template <bool ONE>
struct UkTableW4A8G32 : UkTableW4A8 {
    constexpr UkTableW4A8G32() { f[4 * 2 + 1] = ukr_w4a8_avx2_g32<ONE>; }
};

const UkTableW4A8G32<true> kTableG32;
const UkTableW4A8G32<false> kTableG32N;

}  // namespace

void linear_w4a8_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads) {
    const W4A8Uk* table = G == 32 ? kTableG32.f : G % 32 == 0 ? kTableG32N.f : kTable.f;
    linear_w4a8_drive(x, ldx, M, codes, scales, G, N, K, bias, y, ldy, nthreads, kMR, 1, table, 2);
}

}  // namespace bessemer
