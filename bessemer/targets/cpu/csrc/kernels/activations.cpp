// gelu_tanh_mul@1, scale@1, sigmoid_gate_mul@1: the elementwise ops of Gemma 3 (GELU-tanh
// gated MLP, sqrt(hidden) embedding scale), Granite (multipliers) and Qwen2-MoE (the shared
// expert's sigmoid gate). fp32 math with the vector exp of simd_avx2.h.
#include "kernels.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

// gelu_tanh(g) = 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3), computed as
// g / (1 + exp(-2z)) (the same value; no cancellation in 1 + tanh near -1).
constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

inline float gelu_tanh_scalar(float g) {
    const float z = kGeluC * (g + kGeluA * g * g * g);
    return g / (1.0f + exp_scalar(-2.0f * z));
}

struct ScaleParams : KernelParams {
    float factor;
};

}  // namespace

// ---------------------------------------------------------------- gelu_tanh_mul@1
void prepare_gelu_tanh_mul(KernelCall& c, const PlanInfo& p) { prepare_same_width_pair(c, p, "gate", "up"); }

void run_gelu_tanh_mul(const KernelCall& c, const StepContext& ctx) {
    for_each_row2(c, ctx, [](const float* gr, const float* ur, float* orow, int W) {
        const __m256 one = _mm256_set1_ps(1.0f), a = _mm256_set1_ps(kGeluA);
        const __m256 m2c = _mm256_set1_ps(-2.0f * kGeluC);
        int i = 0;
        for (; i + 8 <= W; i += 8) {
            const __m256 gv = _mm256_loadu_ps(gr + i);
            const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
            const __m256 e = exp256(_mm256_mul_ps(m2c, _mm256_fmadd_ps(a, g3, gv)));  // exp(-2z)
            _mm256_storeu_ps(orow + i, _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)),
                                                     _mm256_loadu_ps(ur + i)));
        }
        for (; i < W; ++i) orow[i] = gelu_tanh_scalar(gr[i]) * ur[i];
    });
}

// ---------------------------------------------------------------- scale@1
void prepare_scale(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 0, 0);
    same_rows(c, p);
    expect_width(c, c.ins[0], c.outs[0].width, "x");
    check_inplace_or_disjoint(c, c.outs[0], c.ins[0]);
    c.set_params<ScaleParams>().factor = float(attr(c, "factor"));
}

void run_scale(const KernelCall& c, const StepContext& ctx) {
    const int rows = ctx.rows(c.rows), W = c.outs[0].width;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldy = ctx.ld(c.outs[0]);
    const float f = c.get<ScaleParams>().factor;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(rows, W, ctx.nthreads))
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float* yr = y + r * ldy;
        const __m256 vf = _mm256_set1_ps(f);
        int i = 0;
        for (; i + 8 <= W; i += 8) _mm256_storeu_ps(yr + i, _mm256_mul_ps(_mm256_loadu_ps(xr + i), vf));
        for (; i < W; ++i) yr[i] = xr[i] * f;
    }
}

// ---------------------------------------------------------------- sigmoid_gate_mul@1
// y (T, W) times sigmoid(g), g one column (T, 1) per row.
void prepare_sigmoid_gate_mul(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 2, 1, 0, 0);
    same_rows(c, p);
    expect_width(c, c.ins[0], c.outs[0].width, "y");
    expect_width(c, c.ins[1], 1, "gate");
    check_inplace_or_disjoint(c, c.outs[0], c.ins[0]);
    if (views_overlap(c.outs[0], c.ins[1])) kernel_error(c, "output view overlaps the gate column");
}

void run_sigmoid_gate_mul(const KernelCall& c, const StepContext& ctx) {
    for_each_row2(c, ctx, [](const float* yr, const float* gr, float* orow, int W) {  // gr: one gate column
        const float s = 1.0f / (1.0f + exp_scalar(-gr[0]));
        const __m256 vs = _mm256_set1_ps(s);
        int i = 0;
        for (; i + 8 <= W; i += 8) _mm256_storeu_ps(orow + i, _mm256_mul_ps(_mm256_loadu_ps(yr + i), vs));
        for (; i < W; ++i) orow[i] = yr[i] * s;
    });
}

}  // namespace bessemer
