// int4_symmetric_scale_search: scale_search.int4_symmetric_scales(search=True) for one
// weight, group by group, in registers instead of NumPy's whole-tensor temporaries (the
// build's hot loop: 34 candidate scales x 2 roundings of every weight).
//
// Bit-identity with the NumPy reference (int4_symmetric_scales_reference) rests on three
// things: every elementwise step is the same fp32 operation in the same order (no FMA
// contraction: g++ fuses a * b + c into one rounding by default in C++, hence the pragma);
// sums over a group use NumPy's pairwise summation (pairwise below); and the candidate scale
// v / -d is computed in fp64 then rounded to fp32, as NumPy does for an fp32 array divided by
// an fp64 scalar. tests/test_scale_search.py checks it bit for bit, FMA included.
#pragma GCC optimize("fp-contract=off")

#include "int4_scale_search.h"
#include "bf16_round.h"
#include "row_threads.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace bessemer {
namespace {

constexpr float kLowest = -8.0f;  // levels -8..7: w = scale * level
constexpr float kHighest = 7.0f;

// NumPy's float32 add.reduce over n contiguous values (pairwise_sum in
// numpy/_core/src/umath/loops_utils.h.src): 8 running sums for blocks of up to 128, halves
// above that; the reduction starts from the identity 0.
float pairwise(const float* a, int64_t n) {
    if (n < 8) {
        float res = 0.0f;
        for (int64_t i = 0; i < n; ++i) res += a[i];
        return res;
    }
    if (n <= 128) {
        float r[8];
        for (int j = 0; j < 8; ++j) r[j] = a[j];
        int64_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; ++j) r[j] += a[i + j];
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; ++i) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

float numpy_sum(const float* a, int64_t n) { return 0.0f + pairwise(a, n); }

// One row's groups; tmp and levels: `group` floats of scratch each.
struct GroupSearch {
    int64_t group;
    const float* h;  // (group,) importance of this group's input channels
    float* tmp;
    float* levels;

    void round_levels(const float* g, float scale) const {
        for (int64_t i = 0; i < group; ++i)
            levels[i] = std::min(std::max(std::nearbyint(g[i] / scale), kLowest), kHighest);
    }

    // sum h (g - scale * L)^2 with L the levels of `scale`
    float error(const float* g, float scale) const {
        round_levels(g, scale);
        for (int64_t i = 0; i < group; ++i) {
            const float d = g[i] - scale * levels[i];
            tmp[i] = h[i] * (d * d);
        }
        return numpy_sum(tmp, group);
    }

    float best_scale(const float* g, const double* divisors, int64_t num_divisors) const {
        int64_t arg = 0;  // first weight of largest magnitude (np.argmax of |g|)
        for (int64_t i = 1; i < group; ++i)
            if (std::fabs(g[i]) > std::fabs(g[arg])) arg = i;
        const float vmax = g[arg];
        const bool zero = vmax == 0.0f;
        const float base = round_to_bf16(zero ? 1.0f : vmax / -8.0f);
        float best = base, best_err = error(g, base);
        for (int64_t c = 0; c < num_divisors; ++c) {
            const float cand = zero ? 1.0f : static_cast<float>(static_cast<double>(vmax) / -divisors[c]);
            round_levels(g, cand);
            for (int64_t i = 0; i < group; ++i) tmp[i] = (h[i] * g[i]) * levels[i];
            const float num = numpy_sum(tmp, group);
            for (int64_t i = 0; i < group; ++i) tmp[i] = (h[i] * levels[i]) * levels[i];
            const float den = numpy_sum(tmp, group);
            float refit = round_to_bf16(den > 0.0f ? num / den : cand);
            if (refit == 0.0f) refit = base;  // every code rounded to 0
            const float err = error(g, refit);
            if (err < best_err) {
                best = refit;
                best_err = err;
            }
        }
        return best;
    }
};


// The same search for a group of 8 * V weights (V <= 16, so NumPy's pairwise sum is one
// 8-wide running sum over the group's blocks, then the fixed tree of hsum8): the common
// group sizes 16..128, with the group held in registers.
inline float hsum8(__m256 r) {
    alignas(32) float v[8];
    _mm256_store_ps(v, r);
    return 0.0f + (((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7])));
}

inline __m256 levels8(__m256 g, __m256 scale) {
    const __m256 q = _mm256_round_ps(_mm256_div_ps(g, scale), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    return _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(kLowest)), _mm256_set1_ps(kHighest));
}

template <int V>
float best_scale_avx2(const float* gp, const float* hp, const double* divisors, int64_t num_divisors) {
    __m256 g[V], h[V], hg[V];
    for (int b = 0; b < V; ++b) {
        g[b] = _mm256_loadu_ps(gp + 8 * b);
        h[b] = _mm256_loadu_ps(hp + 8 * b);
        hg[b] = _mm256_mul_ps(h[b], g[b]);
    }
    auto error = [&](float scale) {
        const __m256 s = _mm256_set1_ps(scale);
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < V; ++b) {
            const __m256 d = _mm256_sub_ps(g[b], _mm256_mul_ps(s, levels8(g[b], s)));
            const __m256 t = _mm256_mul_ps(h[b], _mm256_mul_ps(d, d));
            acc = b == 0 ? t : _mm256_add_ps(acc, t);
        }
        return hsum8(acc);
    };
    int arg = 0;  // first weight of largest magnitude (np.argmax of |g|)
    for (int i = 1; i < 8 * V; ++i)
        if (std::fabs(gp[i]) > std::fabs(gp[arg])) arg = i;
    const float vmax = gp[arg];
    const bool zero = vmax == 0.0f;
    const float base = round_to_bf16(zero ? 1.0f : vmax / -8.0f);
    float best = base, best_err = error(base);
    for (int64_t c = 0; c < num_divisors; ++c) {
        const float cand = zero ? 1.0f : static_cast<float>(static_cast<double>(vmax) / -divisors[c]);
        const __m256 s = _mm256_set1_ps(cand);
        __m256 num = _mm256_setzero_ps(), den = _mm256_setzero_ps();
        for (int b = 0; b < V; ++b) {
            const __m256 lv = levels8(g[b], s);
            const __m256 n1 = _mm256_mul_ps(hg[b], lv);
            const __m256 d1 = _mm256_mul_ps(_mm256_mul_ps(h[b], lv), lv);
            num = b == 0 ? n1 : _mm256_add_ps(num, n1);
            den = b == 0 ? d1 : _mm256_add_ps(den, d1);
        }
        const float nsum = hsum8(num), dsum = hsum8(den);
        float refit = round_to_bf16(dsum > 0.0f ? nsum / dsum : cand);
        if (refit == 0.0f) refit = base;  // every code rounded to 0
        const float err = error(refit);
        if (err < best_err) {
            best = refit;
            best_err = err;
        }
    }
    return best;
}

using GroupFn = float (*)(const float*, const float*, const double*, int64_t);

// The register path for this group size, or nullptr (then GroupSearch's general loop).
GroupFn register_path(int64_t group) {
    switch (group) {
        case 16: return best_scale_avx2<2>;
        case 32: return best_scale_avx2<4>;
        case 48: return best_scale_avx2<6>;
        case 64: return best_scale_avx2<8>;
        case 96: return best_scale_avx2<12>;
        case 128: return best_scale_avx2<16>;
        default: return nullptr;
    }
}

}  // namespace

void int4_symmetric_scale_search(const float* w, int64_t n, int64_t k, int64_t group, const float* importance,
                                 const double* divisors, int64_t num_divisors, float* scales, int64_t threads) {
    const int64_t groups = k / group;
    const GroupFn fast = register_path(group);
    auto rows = [&](int64_t begin, int64_t end) {
        std::vector<float> scratch(2 * group);
        for (int64_t row = begin; row < end; ++row) {
            for (int64_t j = 0; j < groups; ++j) {
                const float* g = w + row * k + j * group;
                if (fast) {
                    scales[row * groups + j] = fast(g, importance + j * group, divisors, num_divisors);
                    continue;
                }
                const GroupSearch s{group, importance + j * group, scratch.data(), scratch.data() + group};
                scales[row * groups + j] = s.best_scale(g, divisors, num_divisors);
            }
        }
    };
    run_row_ranges(n, threads, rows);
}

}  // namespace bessemer
