// rope@1: rotate-half rotary embedding on q and k, in place.
#include <cmath>

#include "kernels.h"

namespace bessemer {

namespace {
constexpr int kMaxHalf = 1024;  // rotary_dim / 2 limit (stack tables)
}

namespace {
struct RopeParams : KernelParams {
    int H, Hkv, D, R;  // heads, KV heads, head_dim, rotary_dim
    float scaling;     // attention_scaling
};
}  // namespace

void prepare_rope(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 2, 0, 1, 1);
    if (same_rows(c, p) != ROWS_TOKENS) kernel_error(c, "q and k must be tokens buffers");
    const int64_t H = attr_int(c, "num_heads"), Hkv = attr_int(c, "num_kv_heads");
    const int64_t D = attr_int(c, "head_dim");
    const int64_t R = int64_t(attr_or(c, "rotary_dim", double(D)));
    if (H <= 0 || Hkv <= 0 || D <= 0) kernel_error(c, "num_heads, num_kv_heads, head_dim must be > 0");
    if (R <= 0 || R > D || R % 2 != 0 || R / 2 > kMaxHalf)
        kernel_error(c, "rotary_dim must be even, > 0 and <= head_dim (and <= 2048)");
    expect_width(c, c.ins[0], int(H * D), "q");
    expect_width(c, c.ins[1], int(Hkv * D), "k");
    if (views_overlap(c.ins[0], c.ins[1])) kernel_error(c, "q and k views overlap");
    expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {R / 2});
    RopeParams& a = c.set_params<RopeParams>();
    a.H = int(H);
    a.Hkv = int(Hkv);
    a.D = int(D);
    a.R = int(R);
    a.scaling = float(attr_or(c, "attention_scaling", 1.0));
}

void run_rope(const KernelCall& c, const StepContext& ctx) {
    const RopeParams& a = c.get<RopeParams>();
    const int H = a.H, Hkv = a.Hkv, D = a.D, half = a.R / 2;
    const float scaling = a.scaling;
    const float* inv_freq = static_cast<const float*>(c.weights[0]->data);
    float* q = ctx.ptr(c.ins[0]);
    float* k = ctx.ptr(c.ins[1]);
    const int64_t ldq = ctx.ld(c.ins[0]), ldk = ctx.ld(c.ins[1]);
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (ctx.nthreads > 1 && ctx.T >= 16)
    for (int t = 0; t < ctx.T; ++t) {
        float cs[kMaxHalf], sn[kMaxHalf];
        const float pos = float(ctx.positions[t]);
        for (int i = 0; i < half; ++i) {
            const float f = pos * inv_freq[i];  // fp32 angle, as torch computes it
            cs[i] = float(std::cos(double(f))) * scaling;
            sn[i] = float(std::sin(double(f))) * scaling;
        }
        auto rotate = [&](float* x) {
            for (int i = 0; i < half; ++i) {
                const float a = x[i], b = x[i + half];
                const float ac = a * cs[i], bs = b * sn[i], bc = b * cs[i], as = a * sn[i];
                x[i] = ac - bs;
                x[i + half] = bc + as;
            }
        };
        float* qr = q + t * ldq;
        for (int h = 0; h < H; ++h) rotate(qr + h * D);
        float* kr = k + t * ldk;
        for (int h = 0; h < Hkv; ++h) rotate(kr + h * D);
    }
}

}  // namespace bessemer
