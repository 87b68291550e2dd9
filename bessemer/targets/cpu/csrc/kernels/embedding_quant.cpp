// embedding_w8a16@1: rows of an int8 per-channel table, dequantized while gathered.
//
// The table is the int8 panel16 lm_head of a tied model (passes/quantize.py), stored once
// for both uses: q [V, H] int8 panel16, scales [V] f32.  x[t] = q[token_ids[t]] * scales[..]
// (one fp32 multiply per element, bit-identical to primitives.dequantize_int8_per_channel).
// Row v lies in panel v / 16 at byte offset v % 16 of each 16-byte k slot: a strided gather,
// H bytes of H cache lines per token, negligible next to the GEMMs of the same step.
#include <cstring>

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

// embedding_w4a16@1: rows of a symmetric int4 table (the tied lm_head stored as linear_w4a16@3
// reads it: codes [V, H] int4 panel16_int4_k8, scales [V, H / G] bf16 panel16), dequantized
// while gathered: x[t][k] = scale[v][k / G] * (code[v][k] - 8), v = token_ids[t], one fp32
// multiply per element as primitives.dequantize_int4 computes it. No reduction: each output
// element depends on its own code and scale only, so the result is the same at any batch.
// Scalar on purpose: one strided row per token, next to the GEMMs of the same step.
namespace bessemer {

namespace {
inline float bf16_value(uint16_t bits) {
    const uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

struct EmbeddingW4Params : KernelParams {
    int64_t H;  // table width
    int64_t G;  // group size along H
};
}  // namespace

void prepare_embedding_w4a16(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 0, 1, 2, 2);
    if (same_rows(c, p) != ROWS_TOKENS) kernel_error(c, "output must be a tokens buffer");
    expect_weight(c, 0, {DT_I4}, {LAYOUT_PANEL16_INT4_K8}, {});
    const TensorRef* t = c.weights[0];
    if (t->shape.size() != 2) kernel_error(c, "weight " + t->name + ": table must be 2-D [V, H]");
    const int64_t V = t->shape[0], H = t->shape[1];
    const int64_t G = attr_int(c, "group_size");
    if (G <= 0 || H % G != 0)
        kernel_error(c, "group_size " + std::to_string(G) + " must be > 0 and divide H = " + std::to_string(H));
    expect_weight(c, 1, {DT_BF16}, {LAYOUT_PANEL16}, {V, H / G});
    expect_width(c, c.outs[0], int(H), "out");
    auto& a = c.set_params<EmbeddingW4Params>();
    a.H = H;
    a.G = G;
    c.needs.token_limit = V;  // token ids index the table's rows
}

void run_embedding_w4a16(const KernelCall& c, const StepContext& ctx) {
    const auto& a = c.get<EmbeddingW4Params>();
    const int64_t H = a.H, G = a.G, groups = H / G;
    const auto* codes = static_cast<const uint8_t*>(c.weights[0]->data);
    const auto* scales = static_cast<const uint16_t*>(c.weights[1]->data);  // bf16 bits
    float* out = ctx.ptr(c.outs[0]);
    const int64_t ldo = ctx.ld(c.outs[0]);
    const bool par = ctx.nthreads > 1 && ctx.T > 1 && int64_t(ctx.T) * H >= 32768;
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (par)
    for (int t = 0; t < ctx.T; ++t) {
        const int64_t v = ctx.token_ids[t], panel = v / 16, r = v % 16;
        // panel16_int4_k8 (format/layouts.py): block b (8 k) of the panel is 64 bytes; byte
        // 4r + 2e + h holds k = 8b + 4h + e (low nibble) and k = 8b + 4h + 2 + e (high nibble)
        const uint8_t* blocks = codes + panel * (H / 8) * 64 + 4 * r;
        const uint16_t* srow = scales + panel * groups * 16 + r;  // panel16: [panel, group, 16]
        float* o = out + t * ldo;
        for (int64_t b = 0; b < H / 8; ++b) {
            const uint8_t* blk = blocks + b * 64;
            for (int e = 0; e < 2; ++e)
                for (int h = 0; h < 2; ++h) {
                    const uint8_t byte = blk[2 * e + h];
                    const int64_t k = 8 * b + 4 * h + e;
                    o[k] = float(int(byte & 0xF) - 8) * bf16_value(srow[(k / G) * 16]);
                    o[k + 2] = float(int(byte >> 4) - 8) * bf16_value(srow[((k + 2) / G) * 16]);
                }
        }
    }
}

}  // namespace bessemer
