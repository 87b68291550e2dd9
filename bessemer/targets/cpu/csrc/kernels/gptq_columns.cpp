// gptq_block_columns: GPTQ's per-column rounding and in-block error updates in registers
// instead of NumPy temporaries (a SmolLM2 GPTQ build spent most of its GPTQ time there).
//
// Bit-identity with the NumPy reference (gptq.gptq_columns_reference) rests on every
// elementwise step being the same fp32 operation in the same order: no FMA contraction (g++
// fuses a * b + c by default in C++, hence the pragma), rint in the default round-to-nearest-
// even mode, clip written so that a NaN passes through as np.clip lets it.
#pragma GCC optimize("fp-contract=off")

#include "gptq_columns.h"
#include "row_threads.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace bessemer {
namespace {

constexpr float kE4m3Max = 448.0f;
constexpr float kE4m3MinNormal = 1.0f / 64.0f;  // 2^-6; below it the subnormal steps of 2^-9

// clip(v, lo, hi) as np.clip: a NaN stays NaN (std::max(nan, lo) returns its first argument)
inline float clip(float v, float lo, float hi) { return std::min(std::max(v, lo), hi); }

// Nearest E4M3 value of v, |v| <= 448 (the caller clips), ties to even, as torch's cast to
// float8_e4m3fn: the 23-bit mantissa rounded to 3 bits by integer arithmetic above 2^-6 (a
// carry moves the exponent up, as it should), the subnormal grid of 2^-9 below.
inline float round_e4m3(float v) {
    if (std::isnan(v)) return v;
    const float a = std::fabs(v);
    float r;
    if (a < kE4m3MinNormal) {
        r = std::nearbyint(a * 512.0f) * (1.0f / 512.0f);  // both exact: powers of two
    } else {
        uint32_t bits;
        std::memcpy(&bits, &a, 4);
        bits = (bits + 0x7FFFFu + ((bits >> 20) & 1u)) & ~0xFFFFFu;
        std::memcpy(&r, &bits, 4);
    }
    return std::copysign(r, v);
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
            for (int64_t c = n0; c < n1; ++c)
                q[c] = round_e4m3(clip(col[c] / g.scale[c], -kE4m3Max, kE4m3Max)) * g.scale[c];
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
