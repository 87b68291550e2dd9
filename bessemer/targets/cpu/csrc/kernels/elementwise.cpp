// add@1, silu_mul@1, gather_rows@1, embedding@1.
#include <cstring>

#include "kernels.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

// ---------------------------------------------------------------- add@1
void prepare_add(KernelCall& c, const PlanInfo& p) { prepare_same_width_pair(c, p, "a", "b"); }

void run_add(const KernelCall& c, const StepContext& ctx) {
    for_each_row2(c, ctx, [](const float* ar, const float* br, float* orow, int W) {
        int i = 0;
        for (; i + 8 <= W; i += 8)
            _mm256_storeu_ps(orow + i, _mm256_add_ps(_mm256_loadu_ps(ar + i), _mm256_loadu_ps(br + i)));
        for (; i < W; ++i) orow[i] = ar[i] + br[i];
    });
}

// ---------------------------------------------------------------- silu_mul@1
void prepare_silu_mul(KernelCall& c, const PlanInfo& p) { prepare_same_width_pair(c, p, "gate", "up"); }

void run_silu_mul(const KernelCall& c, const StepContext& ctx) {
    for_each_row2(c, ctx, [](const float* gr, const float* ur, float* orow, int W) {
        const __m256 one = _mm256_set1_ps(1.0f);
        const __m256 sign = _mm256_set1_ps(-0.0f);
        int i = 0;
        for (; i + 8 <= W; i += 8) {
            __m256 gv = _mm256_loadu_ps(gr + i);
            __m256 e = exp256(_mm256_xor_ps(gv, sign));  // exp(-g)
            __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(orow + i, _mm256_mul_ps(s, _mm256_loadu_ps(ur + i)));
        }
        for (; i < W; ++i) {
            float gv = gr[i];
            orow[i] = gv / (1.0f + exp_scalar(-gv)) * ur[i];
        }
    });
}

// ---------------------------------------------------------------- gather_rows@1
void prepare_gather_rows(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 0, 0);
    if (view_rows(c, p, c.ins[0]) != ROWS_TOKENS) kernel_error(c, "input must be a tokens buffer");
    if (view_rows(c, p, c.outs[0]) != ROWS_SELECTED) kernel_error(c, "output must be a selected buffer");
    expect_width(c, c.ins[0], c.outs[0].width, "x");
    if (c.ins[0].buf == c.outs[0].buf) kernel_error(c, "input and output must be different buffers");
    c.rows = ROWS_SELECTED;
}

void run_gather_rows(const KernelCall& c, const StepContext& ctx) {
    const int W = c.outs[0].width;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldy = ctx.ld(c.outs[0]);
    for (int i = 0; i < ctx.L; ++i)
        std::memcpy(y + i * ldy, x + int64_t(ctx.logits_indices[i]) * ldx, sizeof(float) * W);
}

// ---------------------------------------------------------------- embedding@1
namespace {
struct EmbeddingParams : KernelParams {
    int64_t H;  // table width
};
}  // namespace

void prepare_embedding(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 0, 1, 1, 1);
    if (same_rows(c, p) != ROWS_TOKENS) kernel_error(c, "output must be a tokens buffer");
    expect_weight(c, 0, {DT_F32, DT_BF16}, {LAYOUT_ROW_MAJOR, LAYOUT_PANEL16}, {});
    const TensorRef* t = c.weights[0];
    if (t->shape.size() != 2) kernel_error(c, "weight " + t->name + ": table must be 2-D [V, H]");
    expect_width(c, c.outs[0], int(t->shape[1]), "out");
    c.set_params<EmbeddingParams>().H = t->shape[1];
    c.needs.token_limit = t->shape[0];  // token ids index the table's rows
}

void run_embedding(const KernelCall& c, const StepContext& ctx) {
    const TensorRef* t = c.weights[0];
    const int64_t H = c.get<EmbeddingParams>().H;
    float* out = ctx.ptr(c.outs[0]);
    const int64_t ldo = ctx.ld(c.outs[0]);
    const bool bf16 = t->dtype == DT_BF16;
    const bool panel = t->layout == LAYOUT_PANEL16;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(ctx.T, H, ctx.nthreads))
    for (int r = 0; r < ctx.T; ++r) {
        const int64_t v = ctx.token_ids[r];
        float* o = out + r * ldo;
        if (!panel) {
            if (bf16) {
                const uint16_t* src = static_cast<const uint16_t*>(t->data) + v * H;
                int64_t i = 0;
                for (; i + 8 <= H; i += 8) _mm256_storeu_ps(o + i, load_bf16x8(src + i));
                for (; i < H; ++i) o[i] = bf16_to_f32(src[i]);
            } else {
                std::memcpy(o, static_cast<const float*>(t->data) + v * H, sizeof(float) * H);
            }
        } else {
            const int64_t base = (v / 16) * H * 16 + (v % 16);
            if (bf16) {
                const uint16_t* src = static_cast<const uint16_t*>(t->data) + base;
                for (int64_t i = 0; i < H; ++i) o[i] = bf16_to_f32(src[i * 16]);
            } else {
                const float* src = static_cast<const float*>(t->data) + base;
                for (int64_t i = 0; i < H; ++i) o[i] = src[i * 16];
            }
        }
    }
}

}  // namespace bessemer
