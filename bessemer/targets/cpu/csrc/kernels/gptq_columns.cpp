// gptq_block_columns: GPTQ's per-column rounding and in-block error updates in registers
// instead of NumPy temporaries (a SmolLM2 GPTQ build spent most of its GPTQ time there).
//
// Bit-identity with the NumPy reference (gptq.gptq_columns_reference) rests on every
// elementwise step being the same fp32 operation in the same order: no FMA contraction (g++
// fuses a * b + c by default in C++, hence the pragma), rint in the default round-to-nearest-
// even mode, clip written so that a NaN passes through as np.clip lets it.
#pragma GCC optimize("fp-contract=off")

#include "gptq_columns.h"
#include "kv_codec.h"
#include "row_threads.h"

#include <immintrin.h>

#include <cmath>
#include <vector>

namespace bessemer {
namespace {

// clip(v, lo, hi) as np.clip: a NaN stays NaN (std::max(nan, lo) returns its first argument)
inline float clip(float v, float lo, float hi) { return std::min(std::max(v, lo), hi); }

// q[c] = e4m3(clip(w[c] / s[c], -448, 448)) * s[c] for c in [c0, c1): the KV cache's E4M3
// encoder (kv_codec.h: round to nearest even, |y| clamped to 448 as the clip does) and its exact
// decoder, which gives the value times 2^-8; a NaN quotient stays NaN, as np.clip leaves it.
void round_e4m3_columns(const float* w, const float* s, float* q, int64_t c0, int64_t c1) {
    const __m256 unscale = _mm256_set1_ps(kv::value_mul<kv::F8>());
    int64_t c = c0;
    for (; c + 8 <= c1; c += 8) {
        const __m256 sc = _mm256_loadu_ps(s + c);
        const __m256 y = _mm256_div_ps(_mm256_loadu_ps(w + c), sc);
        alignas(8) uint8_t codes[8];
        kv::store_bytes8(kv::f32x8_to_e4m3(y), codes, true);
        __m256 v = _mm256_mul_ps(kv::e4m3x8_to_f32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes))), unscale);
        v = _mm256_blendv_ps(v, y, _mm256_cmp_ps(y, y, _CMP_UNORD_Q));
        _mm256_storeu_ps(q + c, _mm256_mul_ps(v, sc));
    }
    for (; c < c1; ++c) {
        const float y = w[c] / s[c];
        const float v = std::isnan(y) ? y : kv::e4m3_to_f32_scaled(kv::f32_to_e4m3(y)) * kv::value_mul<kv::F8>();
        q[c] = v * s[c];
    }
}

// The rows [n0, n1) of the block, every column in order.
void block_rows(float* wt, int64_t b, int64_t n, const float* hinv, int64_t ldh, const int64_t* cols,
                const GptqGrid& g, float* qt, float* err, int64_t n0, int64_t n1) {
    std::vector<float> e(size_t(n1 - n0));
    for (int64_t i = 0; i < b; ++i) {
        float* col = wt + i * n;
        float* q = qt + i * n;
        const int64_t j = cols[i];
        if (g.kind == GptqGrid::kInt4) {
            const int64_t base = (j / g.group) * n;
            const float* s = g.scale + base;
            const float* o = g.offset + base;
            const float* d = g.divisor + base;
            for (int64_t c = n0; c < n1; ++c)
                q[c] = clip(std::nearbyint((col[c] - o[c]) / d[c]), 0.0f, 15.0f) * s[c] + o[c];
        } else {
            round_e4m3_columns(col, g.scale, q, n0, n1);
        }
        const float hii = hinv[i * ldh + i];
        for (int64_t c = n0; c < n1; ++c) e[size_t(c - n0)] = (col[c] - q[c]) / hii;
        // the later columns of the block (row i itself is not read again)
        for (int64_t r = i + 1; r < b; ++r) {
            const float h = hinv[i * ldh + r];
            float* w = wt + r * n;
            for (int64_t c = n0; c < n1; ++c) w[c] = w[c] - h * e[size_t(c - n0)];
        }
        for (int64_t c = n0; c < n1; ++c) err[c * b + i] = e[size_t(c - n0)];
    }
}

}  // namespace

void gptq_block_columns(float* wt, int64_t b, int64_t n, const float* hinv, int64_t ldh, const int64_t* cols,
                        const GptqGrid& grid, float* qt, float* err, int64_t threads) {
    // Ranges of at least 64 outputs: a thread's start costs more than a narrower slice saves.
    const int64_t cap = std::max<int64_t>(1, n / 64);
    run_row_ranges(n, threads > 0 ? std::min(threads, cap) : std::min<int64_t>(cap, std::thread::hardware_concurrency()),
                   [&](int64_t n0, int64_t n1) { block_rows(wt, b, n, hinv, ldh, cols, grid, qt, err, n0, n1); });
}

}  // namespace bessemer
