// int4_fake_quant: awq.fake_quant_int4 (AWQ's candidate weights, GRID of them per input group)
// group by group in registers instead of NumPy's weight-sized temporaries: the scaling by s,
// the grid of each group, its codes, their dequantized values and the division by s in one
// pass over the weight.
//
// Bit-identity with the NumPy reference (awq.fake_quant_int4_reference) rests on every
// elementwise step being the same fp32 operation in the same order: no FMA contraction (g++
// fuses a * b + c into one rounding by default in C++, hence the pragma); (v - offset) / scale
// and code * scale + offset rounded step by step; the grid's divisions in fp32 (NumPy keeps an
// fp32 array divided by a Python number in fp32); a code is +0 where NumPy's uint8 code is 0
// (its fp32 value is never -0, which would change the sign of a zero output). The min, max
// and largest magnitude of a group are exact in any order; the largest magnitude's sign is
// that of its first occurrence (np.argmax). tests/test_fake_quant.py checks it bit for bit.
#pragma GCC optimize("fp-contract=off")

#include "int4_fake_quant.h"
#include "bf16_round.h"
#include "row_threads.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace bessemer {
namespace {

constexpr float kTopCode = 15.0f;  // codes 0..15
constexpr float kSymZero = 8.0f;   // symmetric grid: offset = -8 * scale

struct Grid {
    float scale, offset;
};

// primitives.int4_group_params(zero_point=True), clip_ratio 1: the range [min(lo, 0), max(hi, 0)]
// on 16 codes, an integer zero code, both rounded to bf16.
Grid asymmetric_grid(const float* v, int64_t group) {
    float lo = v[0], hi = v[0];
    int64_t i = 0;
    if (group >= 8) {
        __m256 vlo = _mm256_loadu_ps(v), vhi = vlo;
        for (i = 8; i + 8 <= group; i += 8) {
            const __m256 x = _mm256_loadu_ps(v + i);
            vlo = _mm256_min_ps(vlo, x);
            vhi = _mm256_max_ps(vhi, x);
        }
        alignas(32) float l[8], h[8];
        _mm256_store_ps(l, vlo);
        _mm256_store_ps(h, vhi);
        for (int j = 0; j < 8; ++j) {
            lo = std::min(lo, l[j]);
            hi = std::max(hi, h[j]);
        }
    }
    for (; i < group; ++i) {
        lo = std::min(lo, v[i]);
        hi = std::max(hi, v[i]);
    }
    lo = std::min(lo, 0.0f);
    hi = std::max(hi, 0.0f);
    const float scale = round_to_bf16(hi > lo ? (hi - lo) / kTopCode : 1.0f);
    const float zero = std::min(std::max(std::nearbyint(-lo / scale), 0.0f), kTopCode);
    return {scale, round_to_bf16(-zero * scale)};
}

// scale_search.int4_symmetric_scales(search=False): v / -8 for the first weight v of largest
// magnitude, rounded to bf16 (1 for an all-zero group); offset -8 * scale.
Grid symmetric_grid(const float* v, int64_t group) {
    float amax = 0.0f;
    int64_t i = 0;
    if (group >= 8) {
        const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
        __m256 m = _mm256_setzero_ps();
        for (; i + 8 <= group; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + i), magnitude));
        alignas(32) float a[8];
        _mm256_store_ps(a, m);
        for (int j = 0; j < 8; ++j) amax = std::max(amax, a[j]);
    }
    for (; i < group; ++i) amax = std::max(amax, std::fabs(v[i]));
    int64_t arg = 0;  // the first weight of that magnitude
    while (arg + 1 < group && std::fabs(v[arg]) != amax) ++arg;
    const float vmax = v[arg];
    const float scale = round_to_bf16(vmax == 0.0f ? 1.0f : vmax / -kSymZero);
    return {scale, -kSymZero * scale};
}

// out[i] = (code(v[i]) * scale + offset) [/ cs[i]] for 8 values, code = clip(rint((v - offset) /
// scale), 0, 15): a NaN quotient gives code 0 (max(NaN, +0) is its second operand), as does -0
inline __m256 dequantized8(__m256 v, Grid grid, const float* cs) {
    const __m256 scale = _mm256_set1_ps(grid.scale), offset = _mm256_set1_ps(grid.offset);
    __m256 q = _mm256_div_ps(_mm256_sub_ps(v, offset), scale);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, _mm256_setzero_ps()), _mm256_set1_ps(kTopCode));
    const __m256 r = _mm256_add_ps(_mm256_mul_ps(q, scale), offset);
    return cs ? _mm256_div_ps(r, _mm256_loadu_ps(cs)) : r;
}

// dequantized8 over a group; its last group % 8 values through an 8-wide copy, so that one
// statement of the step serves every value
void dequantized(const float* v, int64_t group, Grid grid, const float* cs, float* out) {
    int64_t i = 0;
    for (; i + 8 <= group; i += 8) _mm256_storeu_ps(out + i, dequantized8(_mm256_loadu_ps(v + i), grid, cs ? cs + i : nullptr));
    if (i == group) return;
    alignas(32) float tail_v[8] = {}, tail_cs[8] = {1, 1, 1, 1, 1, 1, 1, 1}, tail_out[8];
    const int64_t rest = group - i;
    std::copy(v + i, v + group, tail_v);
    if (cs) std::copy(cs + i, cs + group, tail_cs);
    _mm256_store_ps(tail_out, dequantized8(_mm256_load_ps(tail_v), grid, cs ? tail_cs : nullptr));
    std::copy(tail_out, tail_out + rest, out + i);
}

}  // namespace

void int4_fake_quant(const float* w, int64_t n, int64_t k, int64_t group, bool zero_point, const float* col_scale,
                     float* out, int64_t threads) {
    auto rows = [&](int64_t begin, int64_t end) {
        std::vector<float> scaled(col_scale ? group : 0);
        for (int64_t row = begin; row < end; ++row) {
            for (int64_t j = 0; j < k; j += group) {
                const float* v = w + row * k + j;
                const float* cs = col_scale ? col_scale + j : nullptr;
                if (cs) {
                    for (int64_t i = 0; i < group; ++i) scaled[i] = v[i] * cs[i];
                    v = scaled.data();
                }
                const Grid grid = zero_point ? asymmetric_grid(v, group) : symmetric_grid(v, group);
                dequantized(v, group, grid, cs, out + row * k + j);
            }
        }
    };
    run_row_ranges(n, threads, rows);
}

}  // namespace bessemer
