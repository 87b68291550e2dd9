// embedding_w8a16@1: rows of an int8 per-channel table, dequantized while gathered.
//
// The table is the int8 panel16 lm_head of a tied model (passes/quantize.py), stored once
// for both uses: q [V, H] int8 panel16, scales [V] f32.  x[t] = q[token_ids[t]] * scales[..]
// (one fp32 multiply per element, bit-identical to primitives.dequantize_int8_per_channel).
// Row v lies in panel v / 16 at byte offset v % 16 of each 16-byte k slot: a strided gather,
// H bytes of H cache lines per token, negligible next to the GEMMs of the same step.
#include "kernels.h"

namespace bessemer {

namespace {
struct EmbeddingW8Params : KernelParams {
    int64_t H;  // table width
};
}  // namespace

void prepare_embedding_w8a16(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 0, 1, 2, 2);
    if (same_rows(c, p) != ROWS_TOKENS) kernel_error(c, "output must be a tokens buffer");
    expect_weight(c, 0, {DT_I8}, {LAYOUT_PANEL16}, {});
    const TensorRef* t = c.weights[0];
    if (t->shape.size() != 2) kernel_error(c, "weight " + t->name + ": table must be 2-D [V, H]");
    expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {t->shape[0]});
    expect_width(c, c.outs[0], int(t->shape[1]), "out");
    c.set_params<EmbeddingW8Params>().H = t->shape[1];
    c.needs.token_limit = t->shape[0];  // token ids index the table's rows
}

void run_embedding_w8a16(const KernelCall& c, const StepContext& ctx) {
    const int64_t H = c.get<EmbeddingW8Params>().H;
    const auto* q = static_cast<const int8_t*>(c.weights[0]->data);
    const auto* scales = static_cast<const float*>(c.weights[1]->data);
    float* out = ctx.ptr(c.outs[0]);
    const int64_t ldo = ctx.ld(c.outs[0]);
    const bool par = ctx.nthreads > 1 && ctx.T > 1 && int64_t(ctx.T) * H >= 32768;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (par)
    for (int r = 0; r < ctx.T; ++r) {
        const int64_t v = ctx.token_ids[r];
        const int8_t* src = q + (v / 16) * H * 16 + (v % 16);
        const float s = scales[v];
        float* o = out + r * ldo;
        for (int64_t i = 0; i < H; ++i) o[i] = float(src[i * 16]) * s;
    }
}

}  // namespace bessemer
