// moe@1: mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE; gpt-oss's stacked layout).
// Per token: route (softmax + top-k as transformers does), then for each of its top_k
// experts gate/up = W_gu[e] x, act = silu(gate) * up (or gpt-oss's clamped swiglu),
// y += p_e * W_down[e] act. Only the routed experts' rows are read. Weights float32
// row_major as plugins/ops.py moe_weight_shapes stores them:
//   layout 0: gate_up (E*2I, H) (expert e's gate rows then up rows), down (E*H, I)
//   layout 1: gate_up (E, H, 2I) input-major, gate/up interleaved; down (E, I, H)
// optional biases (both or none): gate_up_bias (E*2I) / (E, 2I), down_bias (E*H) / (E, H).
// Tokens are split over threads; fp32 dot products and accumulation.
#include <algorithm>
#include <cmath>
#include <omp.h>

#include "kernels.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

constexpr int kMaxExperts = 1024;

struct MoeParams : KernelParams {
    int E, local, first, k, I, H;
    bool after_topk, renorm, stacked, swiglu_clamped, biases;
};

inline float dot(const float* a, const float* b, int n) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    float s = hsum256(_mm256_add_ps(acc0, acc1));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

inline void axpy(float a, const float* x, float* y, int n) {
    const __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; ++i) y[i] += a * x[i];
}

inline float expert_act(float g, float u, bool clamped) {
    if (clamped) {  // gpt-oss: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7)
        g = std::min(g, 7.0f);
        u = std::min(std::max(u, -7.0f), 7.0f);
        return (u + 1.0f) * g / (1.0f + std::exp(-1.702f * g));
    }
    return g / (1.0f + std::exp(-g)) * u;
}

// The top_k experts of one token and their weights, as ops.ref_moe_routing (ties: the lower
// expert index first, like a stable sort).
void route(const MoeParams& P, const float* logits, int* top, double* w) {
    double p[kMaxExperts];
    const int E = P.E;
    bool taken[kMaxExperts] = {};
    if (!P.after_topk) {  // softmax over every expert, then top-k of the probabilities
        double mx = logits[0];
        for (int e = 1; e < E; ++e) mx = std::max(mx, double(logits[e]));
        double sum = 0;
        for (int e = 0; e < E; ++e) sum += (p[e] = std::exp(double(logits[e]) - mx));
        for (int e = 0; e < E; ++e) p[e] /= sum;
    } else {
        for (int e = 0; e < E; ++e) p[e] = logits[e];
    }
    for (int j = 0; j < P.k; ++j) {
        int best = -1;
        for (int e = 0; e < E; ++e)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = true;
        top[j] = best;
        w[j] = p[best];
    }
    if (P.after_topk) {  // softmax over the top-k logits
        const double mx = w[0];  // the largest: chosen first
        double sum = 0;
        for (int j = 0; j < P.k; ++j) sum += (w[j] = std::exp(w[j] - mx));
        for (int j = 0; j < P.k; ++j) w[j] /= sum;
    } else if (P.renorm) {
        double sum = 0;
        for (int j = 0; j < P.k; ++j) sum += w[j];
        for (int j = 0; j < P.k; ++j) w[j] /= sum;
    }
}

}  // namespace

void prepare_moe(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 2, 1, 2, 4);
    same_rows(c, p);
    MoeParams& P = c.set_params<MoeParams>();
    P.E = int(attr(c, "num_experts"));
    P.k = int(attr(c, "top_k"));
    P.I = int(attr(c, "expert_size"));
    P.H = c.outs[0].width;
    P.after_topk = attr_or(c, "softmax_after_topk", 0.0) != 0.0;
    P.renorm = attr_or(c, "norm_topk_prob", 0.0) != 0.0;
    P.stacked = attr_or(c, "layout", 0.0) == 1.0;
    P.swiglu_clamped = attr_or(c, "activation", 0.0) == 1.0;
    P.first = int(attr_or(c, "first_expert", 0.0));
    P.local = int(attr_or(c, "local_experts", double(P.E)));
    if (P.E <= 0 || P.E > kMaxExperts || P.k <= 0 || P.k > P.E || P.I <= 0)
        kernel_error(c, "num_experts (at most 1024), top_k and expert_size must fit");
    if (P.first < 0 || P.local <= 0 || P.first + P.local > P.E)
        kernel_error(c, "first_expert / local_experts outside num_experts");
    if (!P.stacked && (P.first != 0 || P.local != P.E))
        kernel_error(c, "layout 0 holds every expert (first_expert 0, local_experts num_experts)");
    expect_width(c, c.ins[0], P.H, "x");
    expect_width(c, c.ins[1], P.E, "router_logits");
    if (views_overlap(c.outs[0], c.ins[0]) || views_overlap(c.outs[0], c.ins[1]))
        kernel_error(c, "output view overlaps an input view");
    if (c.weights.size() == 3) kernel_error(c, "gate_up_bias and down_bias come together or not at all");
    P.biases = c.weights.size() == 4;
    const int64_t L = P.local, I2 = 2 * int64_t(P.I), H = P.H, I = P.I;
    if (P.stacked) {
        expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, H, I2});
        expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, I, H});
        if (P.biases) {
            expect_weight(c, 2, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, I2});
            expect_weight(c, 3, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, H});
        }
    } else {
        expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * I2, H});
        expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * H, I});
        if (P.biases) {
            expect_weight(c, 2, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * I2});
            expect_weight(c, 3, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * H});
        }
    }
    c.needs.thread_floats = I2 + I + H + 64;  // gate/up, activations, the token's output
}

void run_moe(const KernelCall& c, const StepContext& ctx) {
    const MoeParams& P = c.get<MoeParams>();
    const int rows = ctx.rows(c.rows), H = P.H, I = P.I;
    const float* x = ctx.ptr(c.ins[0]);
    const float* logits = ctx.ptr(c.ins[1]);
    float* out = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldl = ctx.ld(c.ins[1]), ldo = ctx.ld(c.outs[0]);
    const float* wgu = static_cast<const float*>(c.weights[0]->data);
    const float* wd = static_cast<const float*>(c.weights[1]->data);
    const float* bgu = P.biases ? static_cast<const float*>(c.weights[2]->data) : nullptr;
    const float* bd = P.biases ? static_cast<const float*>(c.weights[3]->data) : nullptr;
    const int64_t I2 = 2 * int64_t(I);
#pragma omp parallel for num_threads(ctx.nthreads) schedule(dynamic, 1) if (ctx.nthreads > 1 && rows > 1)
    for (int r = 0; r < rows; ++r) {
        float* gu = ctx.scratch[omp_get_thread_num()];  // (2I)
        float* act = gu + I2;                           // (I)
        float* y = act + I;                             // (H)
        int top[kMaxExperts];
        double w[kMaxExperts];
        route(P, logits + r * ldl, top, w);
        const float* xr = x + r * ldx;
        std::fill(y, y + H, 0.0f);
        for (int j = 0; j < P.k; ++j) {
            const int e = top[j] - P.first;
            if (e < 0 || e >= P.local) continue;  // another rank's expert (tensor parallelism)
            const float pe = float(w[j]);
            if (P.stacked) {
                std::fill(gu, gu + I2, 0.0f);
                const float* W = wgu + int64_t(e) * H * I2;  // (H, 2I)
                for (int h = 0; h < H; ++h) axpy(xr[h], W + h * I2, gu, int(I2));
                if (bgu) axpy(1.0f, bgu + e * I2, gu, int(I2));
                for (int i = 0; i < I; ++i) act[i] = expert_act(gu[2 * i], gu[2 * i + 1], P.swiglu_clamped);
                const float* D = wd + int64_t(e) * I * H;  // (I, H)
                for (int i = 0; i < I; ++i) axpy(pe * act[i], D + int64_t(i) * H, y, H);
                if (bd) axpy(pe, bd + int64_t(e) * H, y, H);
            } else {
                const float* W = wgu + int64_t(e) * I2 * H;  // (2I, H): gate rows, then up rows
                for (int64_t i = 0; i < I2; ++i) gu[i] = dot(W + i * H, xr, H) + (bgu ? bgu[e * I2 + i] : 0.0f);
                for (int i = 0; i < I; ++i) act[i] = expert_act(gu[i], gu[I + i], P.swiglu_clamped);
                const float* D = wd + int64_t(e) * H * I;  // (H, I)
                for (int h = 0; h < H; ++h)
                    y[h] += pe * (dot(D + int64_t(h) * I, act, I) + (bd ? bd[int64_t(e) * H + h] : 0.0f));
            }
        }
        std::copy(y, y + H, out + r * ldo);
    }
}

}  // namespace bessemer
