// rms_norm@1, add_rms_norm@1 and rms_norm_heads@1 (fp32 accumulation, float32 row_major weights).
#include <cmath>

#include "kernels.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

// y = x * rsqrt(mean(x^2) + eps) * (w + offset); x may alias y.
inline void rms_row(const float* x, float* y, const float* w, int H, float eps, float offset) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= H; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
        acc1 = _mm256_fmadd_ps(b, b, acc1);
    }
    for (; i + 8 <= H; i += 8) {
        __m256 a = _mm256_loadu_ps(x + i);
        acc0 = _mm256_fmadd_ps(a, a, acc0);
    }
    float ss = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < H; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / float(H) + eps);
    const __m256 vinv = _mm256_set1_ps(inv), voff = _mm256_set1_ps(offset);
    i = 0;
    for (; i + 8 <= H; i += 8) {
        __m256 wv = _mm256_add_ps(_mm256_loadu_ps(w + i), voff);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv), wv));
    }
    for (; i < H; ++i) y[i] = (x[i] * inv) * (w[i] + offset);
}

struct NormParams : KernelParams {
    float eps, offset;  // eps, weight_offset
    int heads = 1;      // rms_norm_heads: num_heads (each of width head_dim normalised alone)
};

NormParams& prepare_norm_common(KernelCall& c, int H) {
    NormParams& a = c.set_params<NormParams>();
    a.eps = float(attr(c, "eps"));
    a.offset = float(attr_or(c, "weight_offset", 0.0));
    expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(H)});
    return a;
}

}  // namespace

void prepare_rms_norm(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 1, 1);
    same_rows(c, p);
    const int H = c.outs[0].width;
    expect_width(c, c.ins[0], H, "x");
    if (views_overlap(c.ins[0], c.outs[0]) && c.ins[0].col != c.outs[0].col)
        kernel_error(c, "output view partially overlaps the input view");
    prepare_norm_common(c, H);
}

void run_rms_norm(const KernelCall& c, const StepContext& ctx) {
    const int rows = ctx.rows(c.rows), H = c.outs[0].width;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldy = ctx.ld(c.outs[0]);
    const float* w = static_cast<const float*>(c.weights[0]->data);
    const float eps = c.get<NormParams>().eps, off = c.get<NormParams>().offset;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(rows, H, ctx.nthreads))
    for (int r = 0; r < rows; ++r) rms_row(x + r * ldx, y + r * ldy, w, H, eps, off);
}

void prepare_add_rms_norm(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 2, 2, 1, 1);
    same_rows(c, p);
    const int H = c.outs[0].width;
    expect_width(c, c.ins[0], H, "x");
    expect_width(c, c.ins[1], H, "residual");
    expect_width(c, c.outs[1], H, "residual_out");
    // y must not overlap the residual input/output; residual_out may equal x or residual.
    if (views_overlap(c.outs[0], c.outs[1])) kernel_error(c, "y and residual_out overlap");
    for (const ViewRef& in : c.ins)
        if (views_overlap(c.outs[1], in) && c.outs[1].col != in.col)
            kernel_error(c, "residual_out partially overlaps an input view");
    if (views_overlap(c.outs[0], c.ins[1]) && c.outs[0].col != c.ins[1].col)
        kernel_error(c, "y partially overlaps the residual view");
    prepare_norm_common(c, H);
}

void run_add_rms_norm(const KernelCall& c, const StepContext& ctx) {
    const int rows = ctx.rows(c.rows), H = c.outs[0].width;
    const float* x = ctx.ptr(c.ins[0]);
    const float* res = ctx.ptr(c.ins[1]);
    float* y = ctx.ptr(c.outs[0]);
    float* ro = ctx.ptr(c.outs[1]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldr = ctx.ld(c.ins[1]), ldy = ctx.ld(c.outs[0]),
                  ldro = ctx.ld(c.outs[1]);
    const float* w = static_cast<const float*>(c.weights[0]->data);
    const float eps = c.get<NormParams>().eps, off = c.get<NormParams>().offset;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(rows, H, ctx.nthreads))
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        const float* rr = res + r * ldr;
        float* ror = ro + r * ldro;
        int i = 0;
        for (; i + 8 <= H; i += 8)
            _mm256_storeu_ps(ror + i, _mm256_add_ps(_mm256_loadu_ps(xr + i), _mm256_loadu_ps(rr + i)));
        for (; i < H; ++i) ror[i] = xr[i] + rr[i];
        rms_row(ror, y + r * ldy, w, H, eps, off);
    }
}

// Each head of a (T, num_heads * head_dim) row normalised alone, one (head_dim,) weight for
// every head (Qwen3's and Gemma 3's q/k norms). y may be x (in place).
void prepare_rms_norm_heads(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 1, 1);
    same_rows(c, p);
    const int W = c.outs[0].width;
    expect_width(c, c.ins[0], W, "x");
    if (views_overlap(c.ins[0], c.outs[0]) && c.ins[0].col != c.outs[0].col)
        kernel_error(c, "output view partially overlaps the input view");
    const int heads = int(attr(c, "num_heads")), d = int(attr(c, "head_dim"));
    if (heads <= 0 || d <= 0 || int64_t(heads) * d != W)
        kernel_error(c, "num_heads x head_dim does not equal the row width " + std::to_string(W));
    prepare_norm_common(c, d).heads = heads;
}

void run_rms_norm_heads(const KernelCall& c, const StepContext& ctx) {
    const NormParams& a = c.get<NormParams>();
    const int rows = ctx.rows(c.rows), W = c.outs[0].width, d = W / a.heads;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldy = ctx.ld(c.outs[0]);
    const float* w = static_cast<const float*>(c.weights[0]->data);
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(rows, W, ctx.nthreads))
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < a.heads; ++h) rms_row(x + r * ldx + h * d, y + r * ldy + h * d, w, d, a.eps, a.offset);
}

}  // namespace bessemer
