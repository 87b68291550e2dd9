// int4_output_error_scale_search: scale_search.int4_symmetric_scales_for_inputs for one
// weight, group by group, with the group's (g, g) moment block held in L1 while every row of
// that group is searched (NumPy's einsum streams all of them through memory per candidate).
//
// The elementwise steps are the reference's fp32 operations in its order (levels
// rint(w / s) clipped to -8..7, e = w - s * L unfused, the refit num / den rounded to bf16,
// v / -d in fp64 rounded to fp32), so candidates agree wherever the sums do. The sums
// (w^T M L, L^T M L, e^T M e) are fp32 FMA chains in an order of their own: NumPy's einsum has
// another, so a near tie between two candidates can go the other way, and a refit num / den
// near a bf16 rounding midpoint can round to the other neighbour (one bf16 step apart, its
// error up to 9% off): there both neighbours are tried, so the reference's candidates stay
// among ours. tests/test_scale_search.py holds the result to the reference's error.
// AVX2 + FMA only: the cpu target's baseline ISA, so no run-time dispatch.
#pragma GCC optimize("fp-contract=off")

#include "int4_output_search.h"
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
// fp32 ulps either side of a bf16 rounding midpoint (1/512 of a bf16 step) within which a
// refit's other bf16 neighbour is tried as well: NumPy's fp32 refit was at most 15 ulps off an
// fp64 one on 2.6M refits (1536 x 2048 g32, 8 to 1000 calibration rows), ours likewise
constexpr int32_t kMidpointWindow = 128;

float bits_to_float(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}

inline float hsum8(__m256 r) {
    const __m128 s = _mm_add_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
    const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// sum_j (sum_i a_i M_ij) b_j over V * 8 columns from jc; M: (g, gp) padded with zero columns.
// Even and odd i accumulate apart: 2 V independent FMA chains hide the FMA latency.
template <int V>
inline __m256 bilinear_chunk(const float* a, const float* b, const float* m, int64_t g, int64_t gp, int64_t jc) {
    __m256 even[V], odd[V];
    for (int v = 0; v < V; ++v) even[v] = odd[v] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= g; i += 2) {
        const __m256 a0 = _mm256_broadcast_ss(a + i), a1 = _mm256_broadcast_ss(a + i + 1);
        const float* r0 = m + i * gp + jc;
        const float* r1 = r0 + gp;
        for (int v = 0; v < V; ++v) {
            even[v] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(r0 + 8 * v), even[v]);
            odd[v] = _mm256_fmadd_ps(a1, _mm256_loadu_ps(r1 + 8 * v), odd[v]);
        }
    }
    if (i < g) {
        const __m256 a0 = _mm256_broadcast_ss(a + i);
        for (int v = 0; v < V; ++v) even[v] = _mm256_fmadd_ps(a0, _mm256_loadu_ps(m + i * gp + jc + 8 * v), even[v]);
    }
    __m256 s = _mm256_mul_ps(_mm256_add_ps(even[0], odd[0]), _mm256_loadu_ps(b + jc));
    for (int v = 1; v < V; ++v) s = _mm256_fmadd_ps(_mm256_add_ps(even[v], odd[v]), _mm256_loadu_ps(b + jc + 8 * v), s);
    return s;
}

// a^T M b; a: (g,), b: (gp,) zero past g, M: (g, gp)
float bilinear(const float* a, const float* b, const float* m, int64_t g, int64_t gp) {
    __m256 total = _mm256_setzero_ps();
    int64_t jc = 0;
    for (; jc + 32 <= gp; jc += 32) total = _mm256_add_ps(total, bilinear_chunk<4>(a, b, m, g, gp, jc));
    switch ((gp - jc) / 8) {
        case 3: total = _mm256_add_ps(total, bilinear_chunk<3>(a, b, m, g, gp, jc)); break;
        case 2: total = _mm256_add_ps(total, bilinear_chunk<2>(a, b, m, g, gp, jc)); break;
        case 1: total = _mm256_add_ps(total, bilinear_chunk<1>(a, b, m, g, gp, jc)); break;
        default: break;
    }
    return hsum8(total);
}

float dot(const float* a, const float* b, int64_t gp) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t j = 0; j < gp; j += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc);
    return hsum8(acc);
}

// One thread's view of one group j: its moment block padded to gp = g rounded up to 8
// columns, and `gp`-float scratch vectors (zero past g, so padded lanes add nothing).
struct GroupSearch {
    int64_t g, gp;
    std::vector<float> m, w, wm, levels, err;

    GroupSearch(int64_t group)
        : g(group), gp((group + 7) / 8 * 8), m(group * gp), w(gp), wm(gp), levels(gp), err(gp) {}

    void load_moments(const float* block) {
        for (int64_t i = 0; i < g; ++i) std::copy(block + i * g, block + (i + 1) * g, m.data() + i * gp);
    }

    // levels of w on `scale`: rint(w / scale) clipped to -8..7 (0 in padded lanes)
    void round_levels(float scale) {
        const __m256 s = _mm256_set1_ps(scale), lo = _mm256_set1_ps(kLowest), hi = _mm256_set1_ps(kHighest);
        for (int64_t j = 0; j < gp; j += 8) {
            const __m256 q = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(w.data() + j), s),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_storeu_ps(levels.data() + j, _mm256_min_ps(_mm256_max_ps(q, lo), hi));
        }
    }

    // e^T M e for e = w - scale * L, L the levels of `scale` (as stored)
    float output_error(float scale) {
        round_levels(scale);
        const __m256 s = _mm256_set1_ps(scale);
        for (int64_t j = 0; j < gp; j += 8) {
            const __m256 q = _mm256_mul_ps(s, _mm256_loadu_ps(levels.data() + j));
            _mm256_storeu_ps(err.data() + j, _mm256_sub_ps(_mm256_loadu_ps(w.data() + j), q));
        }
        return bilinear(err.data(), err.data(), m.data(), g, gp);
    }

    // the candidate `scale` replaces best where its error is strictly less (0: skipped)
    void try_scale(float scale, float& best, float& best_err) {
        if (scale == 0.0f) return;
        const float err = output_error(scale);
        if (err < best_err) {
            best = scale;
            best_err = err;
        }
    }

    float best_scale(const float* row, float plain, const double* divisors, int64_t num_divisors) {
        std::copy(row, row + g, w.begin());
        int64_t arg = 0;  // first weight of largest magnitude (np.argmax of |w|)
        for (int64_t i = 1; i < g; ++i)
            if (std::fabs(row[i]) > std::fabs(row[arg])) arg = i;
        const float vmax = row[arg];
        // wm = w^T M (the numerator's half that no candidate changes)
        std::fill(wm.begin(), wm.end(), 0.0f);
        for (int64_t i = 0; i < g; ++i)
            for (int64_t j = 0; j < gp; ++j) wm[j] = std::fma(w[i], m[i * gp + j], wm[j]);
        float best = plain, best_err = output_error(plain);
        for (int64_t c = 0; c < num_divisors; ++c) {
            const float cand = vmax == 0.0f ? 1.0f : static_cast<float>(static_cast<double>(vmax) / -divisors[c]);
            round_levels(cand);
            const float num = dot(wm.data(), levels.data(), gp);
            const float den = bilinear(levels.data(), levels.data(), m.data(), g, gp);
            if (!(den > 0.0f)) continue;  // every code rounded to 0 (or an all-zero group)
            const float q = num / den;
            const float refit = round_to_bf16(q);
            try_scale(refit, best, best_err);
            // Near a bf16 rounding midpoint, NumPy's sums (in another order) may round q to the
            // other neighbour, whose error can differ by several percent: try it too, so the
            // reference's candidate is among ours wherever the two sums differ by less than the window.
            uint32_t u;
            std::memcpy(&u, &q, 4);
            const int32_t from_midpoint = static_cast<int32_t>(u & 0xFFFFu) - 0x8000;
            if (std::abs(from_midpoint) <= kMidpointWindow) {
                const uint32_t toward_zero = u & 0xFFFF0000u;
                const bool rounded_down = refit == bits_to_float(toward_zero);
                try_scale(bits_to_float(rounded_down ? toward_zero + 0x10000u : toward_zero), best, best_err);
            }
        }
        return best;
    }
};

}  // namespace

void int4_output_error_scale_search(const float* w, int64_t n, int64_t k, int64_t group, const float* moments,
                                    const float* plain, const double* divisors, int64_t num_divisors,
                                    int64_t threads, float* scales) {
    const int64_t groups = k / group;
    // Group-major within each thread's rows: one (g, g) block serves all of them from L1.
    auto rows = [&](int64_t begin, int64_t end) {
        GroupSearch s(group);
        for (int64_t j = 0; j < groups; ++j) {
            s.load_moments(moments + j * group * group);
            for (int64_t row = begin; row < end; ++row)
                scales[row * groups + j] =
                    s.best_scale(w + row * k + j * group, plain[row * groups + j], divisors, num_divisors);
        }
    };
    run_row_ranges(n, threads, rows);
}

}  // namespace bessemer
