// int4_superblock_search: superblock.sub_block_params_reference (the NumPy statement of the
// two-level grid's per-sub-block range search) one sub-block at a time, in a few stack
// arrays of 32 floats instead of NumPy's (rows, K / 32, 32) temporaries: about 25 of them
// per range factor were most of an int4-k build and of the mixed-precision measurement.
//
// Bit-identity with the reference rests on the same three things as int4_scale_search.cpp:
// each elementwise step is the same IEEE operation in the same order and precision (no FMA
// contraction, hence the pragma; the candidate codes of a range factor are computed in fp64,
// as NumPy does for fp32 arrays times an fp64 scalar); sums over a sub-block are NumPy's
// pairwise fp32 sum of 32 contiguous values (8 running sums, then a fixed tree, added to
// the identity 0); and np.clip / np.where / np.maximum keep NumPy's choice on ties.
// tests/test_superblock.py checks it bit for bit.
#pragma GCC optimize("fp-contract=off")

#include "int4_superblock_search.h"
#include "row_threads.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace bessemer {
namespace {

constexpr int kSub = static_cast<int>(kSuperblockSub);
constexpr float kTop = 15.0f;  // INT4_LEVELS - 1: codes 0..15

// NumPy's float32 add.reduce of 32 contiguous values: 8 running sums over the 4 blocks of 8,
// the tree ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), added to the identity 0.
inline float sum32(const float* a) {
    float r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    for (int i = 8; i < kSub; i += 8)
        for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    return 0.0f + (((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])));
}

// np.clip(q, 0, 15) (max(q, 0) keeps the bound on a tie: -0 becomes +0), then
// np.where(scale > 0, ., 0)
template <typename T>
inline float clip_code(T q, bool live) {
    q = q > T(0) ? q : T(0);
    q = q < T(kTop) ? q : T(kTop);
    return live ? static_cast<float>(q) : 0.0f;
}

// superblock._codes with fp32 scale and minimum
inline void codes_f32(const float* g, float scale, float minimum, float* c) {
    const bool live = scale > 0.0f;
    const float safe = live ? scale : 1.0f;
    for (int i = 0; i < kSub; ++i) c[i] = clip_code(std::nearbyint((g[i] - minimum) / safe), live);
}

// superblock._codes with the fp64 scale and minimum of a range factor
inline void codes_f64(const float* g, double scale, double minimum, float* c) {
    const bool live = scale > 0.0;
    const double safe = live ? scale : 1.0;
    for (int i = 0; i < kSub; ++i)
        c[i] = clip_code(std::nearbyint((static_cast<double>(g[i]) - minimum) / safe), live);
}

// superblock._error: sum h (g - (scale * c + minimum))^2
inline float error(const float* g, const float* h, float scale, float minimum, const float* c) {
    float t[kSub];
    for (int i = 0; i < kSub; ++i) {
        const float d = g[i] - (scale * c[i] + minimum);
        t[i] = h[i] * (d * d);
    }
    return sum32(t);
}

// One sub-block g (32,) with importance h (32,); sw = sum h and shg = sum h * g, which the
// reference recomputes for every factor (the same value each time).
struct SubBlock {
    const float* g;
    const float* h;
    float sw, shg;

    // superblock._weighted_fit of codes c
    void fit(const float* c, float& scale, float& minimum) const {
        float hc[kSub], t[kSub];
        for (int i = 0; i < kSub; ++i) hc[i] = h[i] * c[i];
        const float sq = sum32(hc);
        for (int i = 0; i < kSub; ++i) t[i] = hc[i] * c[i];
        const float sqq = sum32(t);
        for (int i = 0; i < kSub; ++i) t[i] = hc[i] * g[i];
        const float sqw = sum32(t);
        const float det = sw * sqq - sq * sq;
        const bool ok = det > 0.0f;
        const float safe = ok ? det : 1.0f;
        float s = ok ? (sw * sqw - sq * shg) / safe : 0.0f;
        float m = ok ? (sqq * shg - sq * sqw) / safe : 0.0f;
        if (m > 0.0f) {  // a positive minimum is not on the grid: the scale alone, minimum 0
            s = sqq > 0.0f ? sqw / sqq : 0.0f;
            m = 0.0f;
        }
        scale = s >= 0.0f ? s : 0.0f;  // np.maximum(s, 0.0)
        minimum = m;
    }

    void search(const double* factors, int64_t num_factors, float& best_s, float& best_m) const {
        float gmin = g[0], gmax = g[0];
        for (int i = 1; i < kSub; ++i) {
            gmin = std::min(gmin, g[i]);
            gmax = std::max(gmax, g[i]);
        }
        const float lo = gmin < 0.0f ? gmin : 0.0f;
        const float hi = gmax > lo ? gmax : lo;
        float c[kSub];
        best_s = (hi - lo) / kTop;
        best_m = lo;
        codes_f32(g, best_s, best_m, c);
        float best_e = error(g, h, best_s, best_m, c);
        const double range = static_cast<double>(hi - lo);
        for (int64_t f = 0; f < num_factors; ++f) {
            codes_f64(g, range * factors[f] / static_cast<double>(kTop), static_cast<double>(lo) * factors[f], c);
            float s, m;
            fit(c, s, m);
            codes_f32(g, s, m, c);
            const float e = error(g, h, s, m, c);
            if (e < best_e) {
                best_s = s;
                best_m = m;
                best_e = e;
            }
        }
    }
};

}  // namespace

void int4_superblock_search(const float* w, int64_t n, int64_t k, const float* importance, const double* factors,
                            int64_t num_factors, float* scale, float* minimum, int64_t threads) {
    const int64_t subs = k / kSuperblockSub;
    // sum h per sub-block: the same for every row
    std::vector<float> sw(subs);
    for (int64_t j = 0; j < subs; ++j) sw[j] = sum32(importance + j * kSub);
    auto rows = [&](int64_t begin, int64_t end) {
        float hg[kSub];
        for (int64_t row = begin; row < end; ++row) {
            for (int64_t j = 0; j < subs; ++j) {
                const float* g = w + row * k + j * kSub;
                const float* h = importance + j * kSub;
                for (int i = 0; i < kSub; ++i) hg[i] = h[i] * g[i];
                const SubBlock b{g, h, sw[j], sum32(hg)};
                b.search(factors, num_factors, scale[row * subs + j], minimum[row * subs + j]);
            }
        }
    };
    run_row_ranges(n, threads, rows);
}

}  // namespace bessemer
