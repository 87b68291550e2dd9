// moe@1: mixture of experts on fp32 weights (Mixtral, Qwen2-MoE, Qwen3-MoE; gpt-oss's stacked
// layout), and the grouped driver every expert kernel runs under (moe_grouped.h).
// Weights float32 row_major as plugins/ops.py moe_weight_shapes stores them:
//   layout 0: gate_up (E*2I, H) (expert e's gate rows then up rows), down (E*H, I)
//   layout 1: gate_up (E, H, 2I) input-major, gate/up interleaved; down (E, I, H)
// optional biases (both or none): gate_up_bias (E*2I) / (E, 2I), down_bias (E*H) / (E, H).
// act = silu(gate) * up, or gpt-oss's clamped swiglu; fp32 dot products and accumulation.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <omp.h>

#include "moe_grouped.h"
#include "simd_avx2.h"

namespace bessemer {

using namespace simd;

namespace {

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
    double p[kMoeMaxExperts];
    const int E = P.E;
    bool taken[kMoeMaxExperts] = {};
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

// fp32 row_major weights. Layout 0 stores output rows (N, K): one dot product per (row, token),
// rows split over the threads. Layout 1 stores input rows (K, N): each thread owns a block
// of output columns and adds x[m][k] * W[k, block] for every k, so W is read once for all
// the expert's tokens.
void matmul_f32(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                const float* bias, float* y, int64_t ldy, int nthreads) {
    const MoeParams& P = c.get<MoeParams>();
    const int N = which == GATE_UP ? 2 * P.I : P.H, K = which == GATE_UP ? P.H : P.I;
    const float* W = static_cast<const float*>(c.weights[which]->data) + int64_t(e) * N * K;
    const bool threads = nthreads > 1 && int64_t(N) * K * M >= 32768;
    if (!P.stacked) {
#pragma omp parallel for num_threads(nthreads) schedule(static) if (threads)
        for (int n = 0; n < N; ++n)
            for (int m = 0; m < M; ++m)
                y[m * ldy + n] = dot(W + int64_t(n) * K, x + m * ldx, K) + (bias ? bias[n] : 0.0f);
        return;
    }
    constexpr int kCols = 64;
    const int blocks = (N + kCols - 1) / kCols;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (threads)
    for (int b = 0; b < blocks; ++b) {
        const int n0 = b * kCols, nc = std::min(kCols, N - n0);
        for (int m = 0; m < M; ++m) {
            float* ym = y + m * ldy + n0;
            for (int j = 0; j < nc; ++j) ym[j] = bias ? bias[n0 + j] : 0.0f;
        }
        for (int k = 0; k < K; ++k)
            for (int m = 0; m < M; ++m) axpy(x[m * ldx + k], W + int64_t(k) * N + n0, y + m * ldy + n0, nc);
    }
}

// The row, in the active experts' rows laid end to end, where granule u of them starts (an
// expert's last granule may be short: N not a multiple of g).
inline int64_t cut_rows(int64_t u, int64_t N, int64_t g) {
    const int64_t per = (N + g - 1) / g;
    return u / per * N + std::min(u % per * g, N);
}

// act rows [m0, m1) from gate_up rows: silu(gate) * up or gpt-oss's clamped swiglu.
void activate(const MoeParams& P, const float* gu, float* act, int m0, int m1) {
    const int I = P.I;
    for (int m = m0; m < m1; ++m) {
        const float* g = gu + int64_t(m) * 2 * I;
        float* a = act + int64_t(m) * I;
        if (P.stacked)  // gate and up interleaved
            for (int i = 0; i < I; ++i) a[i] = expert_act(g[2 * i], g[2 * i + 1], P.swiglu_clamped);
        else
            for (int i = 0; i < I; ++i) a[i] = expert_act(g[i], g[I + i], P.swiglu_clamped);
    }
}

// This thread's share of the active experts' output rows of `which`, taken together: the
// experts' rows laid end to end and cut into nt contiguous parts at multiples of the kernel's
// row granule (N is a multiple of it, or the granule is cut short at each expert's end);
// expert e reads its sorted pairs' rows [start[e], start[e + 1]) of x and writes the same
// rows of y.
void rows_share(const KernelCall& c, const ExpertKernel& kernel, ExpertMatrix which, int64_t N, const int* active,
                int count, const int32_t* start, const float* x, int64_t ldx, const float* bias, int64_t bias_ld,
                float* y, int64_t ldy, int tid, int nt) {
    const int64_t g = kernel.row_granule, units = count * ((N + g - 1) / g);
    const int64_t lo = cut_rows(units * tid / nt, N, g), hi = cut_rows(units * (tid + 1) / nt, N, g);
    for (int a = 0; a < count; ++a) {
        const int64_t n0 = std::max<int64_t>(lo - a * N, 0), n1 = std::min<int64_t>(hi - a * N, N);
        if (n0 >= n1) continue;
        const int e = active[a];
        kernel.rows(c, which, e, x + start[e] * ldx, ldx, start[e + 1] - start[e], bias ? bias + e * bias_ld : nullptr,
                    y + start[e] * ldy, ldy, n0, n1);
    }
}

// Expert e's gate_up, activation and down on the calling thread: its sorted pairs' rows
// [start[e], start[e + 1]) of xs, gu, act and ys.
void whole_expert(const KernelCall& c, const MoeParams& P, const ExpertKernel& kernel, int e, const int32_t* start,
                  const float* xs, float* gu, float* act, float* ys, const float* bgu, const float* bd) {
    const int64_t H = P.H, I = P.I, m0 = start[e];
    const int M = start[e + 1] - start[e];
    kernel.rows(c, GATE_UP, e, xs + m0 * H, H, M, bgu ? bgu + e * 2 * I : nullptr, gu + m0 * 2 * I, 2 * I, 0, 2 * I);
    activate(P, gu, act, int(m0), int(m0) + M);
    if (kernel.input_order) kernel.input_order(act + m0 * I, I, M, I);
    kernel.rows(c, DOWN, e, act + m0 * I, I, M, bd ? bd + e * H : nullptr, ys + m0 * H, H, 0, H);
}

// Thread tid's share of the step when the active experts do not split evenly over the nt
// threads: their gate_up rows, then the activations, then their down rows, split over the
// threads (a barrier between: each needs the others' results). Called by every thread.
void split_rows(const KernelCall& c, const MoeParams& P, const ExpertKernel& kernel, const int* active, int count,
                const int32_t* start, const float* xs, float* gu, float* act, float* ys, const float* bgu,
                const float* bd, int tid, int nt) {
    const int64_t H = P.H, I = P.I;
    const int pairs = start[P.local];
    rows_share(c, kernel, GATE_UP, 2 * I, active, count, start, xs, H, bgu, 2 * I, gu, 2 * I, tid, nt);
#pragma omp barrier
    const int m0 = pairs * tid / nt, m1 = pairs * (tid + 1) / nt;
    activate(P, gu, act, m0, m1);
    if (kernel.input_order && m1 > m0) kernel.input_order(act + m0 * I, I, m1 - m0, I);
#pragma omp barrier
    rows_share(c, kernel, DOWN, H, active, count, start, act, I, bd, H, ys, H, tid, nt);
}

// Every (token, expert) pair of the step at once (at most kExpertChunk, in expert order) in
// one parallel region; then each token sums its pairs in expert order, as the chunked path
// does. When the active experts split evenly over the threads (batch-1 decode: top_k of
// them), each thread takes whole experts: it streams its experts' weights alone and waits
// for no other thread before the region ends (split_rows waits twice per step, and a thread
// that is descheduled there, on a loaded machine, holds the other up). A row is computed the
// same way either way, so results do not change.
void run_small_batch(const KernelCall& c, const StepContext& ctx, const MoeParams& P, const ExpertKernel& kernel,
                     const int32_t* order, const int32_t* start, const float* weight, const float* x, int64_t ldx,
                     float* out, int64_t ldo, float* xs, float* gu, float* act, float* ys, const float* bgu,
                     const float* bd) {
    const int H = P.H, k = P.k, L = P.local, pairs = start[L];
    int active[kMoeMaxExperts], count = 0;
    for (int e = 0; e < L; ++e)
        if (start[e + 1] > start[e]) active[count++] = e;
    for (int q = 0; q < pairs; ++q) std::memcpy(xs + int64_t(q) * H, x + (order[q] / k) * ldx, sizeof(float) * H);
    if (kernel.input_order) kernel.input_order(xs, H, pairs, H);
#pragma omp parallel num_threads(ctx.nthreads) if (ctx.nthreads > 1)
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        if (count % nt == 0) {
            for (int a = count * tid / nt; a < count * (tid + 1) / nt; ++a)
                whole_expert(c, P, kernel, active[a], start, xs, gu, act, ys, bgu, bd);
        } else {
            split_rows(c, P, kernel, active, count, start, xs, gu, act, ys, bgu, bd, tid, nt);
        }
    }
    for (int q = 0; q < pairs; ++q) axpy(weight[order[q]], ys + int64_t(q) * H, out + (order[q] / k) * ldo, H);
}

}  // namespace

void expect_panel_rows(const KernelCall& c, const MoeParams& P) {
    if ((2 * P.I) % 16 || P.H % 16)
        kernel_error(c, "quantized experts need 2 * expert_size and the hidden size to be multiples of 16 "
                        "(an expert's rows are whole panels); rebuild with the experts in float32");
}

void expect_per_row_experts(const KernelCall& c, const MoeParams& P, DType codes) {
    for (ExpertMatrix which : {GATE_UP, DOWN}) {
        const int64_t rows = P.local * expert_rows(P, which);
        expect_weight(c, 2 * which, {codes}, {LAYOUT_PANEL16}, {rows, expert_k(P, which)});
        expect_weight(c, 2 * which + 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {rows});
    }
}

void prepare_moe_routing(KernelCall& c, const PlanInfo& p, MoeParams& P, int matrix_weights) {
    expect_arity(c, 2, 1, size_t(matrix_weights), size_t(matrix_weights) + 2);
    same_rows(c, p);
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
    if (P.E <= 0 || P.E > kMoeMaxExperts || P.k <= 0 || P.k > P.E || P.I <= 0)
        kernel_error(c, "num_experts (at most 1024), top_k and expert_size must fit");
    if (P.first < 0 || P.local <= 0 || P.first + P.local > P.E)
        kernel_error(c, "first_expert / local_experts outside num_experts");
    if (!P.stacked && (P.first != 0 || P.local != P.E))
        kernel_error(c, "layout 0 holds every expert (first_expert 0, local_experts num_experts)");
    expect_width(c, c.ins[0], P.H, "x");
    expect_width(c, c.ins[1], P.E, "router_logits");
    if (views_overlap(c.outs[0], c.ins[0]) || views_overlap(c.outs[0], c.ins[1]))
        kernel_error(c, "output view overlaps an input view");
    const int extra = int(c.weights.size()) - matrix_weights;
    if (extra == 1) kernel_error(c, "gate_up_bias and down_bias come together or not at all");
    P.bias_at = extra == 2 ? matrix_weights : -1;
    const int64_t L = P.local, I2 = 2 * int64_t(P.I), H = P.H;
    if (P.bias_at >= 0) {  // (E, 2I) and (E, H) in layout 1; flat (E*2I) and (E*H) in layout 0
        if (P.stacked) {
            expect_weight(c, P.bias_at, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, I2});
            expect_weight(c, P.bias_at + 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, H});
        } else {
            expect_weight(c, P.bias_at, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * I2});
            expect_weight(c, P.bias_at + 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * H});
        }
    }
    // the chunk's gathered x, gate/up, activations and down rows (moe_grouped.h)
    c.needs.thread_floats = int64_t(kExpertChunk) * (2 * H + 3 * int64_t(P.I)) + 64;
    // per (token, slot): expert, weight, sorted pair; per expert: its first sorted pair
    c.needs.ints_per_row = 3 * int64_t(P.k);
    c.needs.ints_per_seq = L + 1;
}

void run_moe_grouped(const KernelCall& c, const StepContext& ctx, const MoeParams& P, const ExpertKernel& kernel) {
    const int T = ctx.rows(c.rows), H = P.H, I = P.I, k = P.k, L = P.local;
    const float* x = ctx.ptr(c.ins[0]);
    const float* logits = ctx.ptr(c.ins[1]);
    float* out = ctx.ptr(c.outs[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldl = ctx.ld(c.ins[1]), ldo = ctx.ld(c.outs[0]);
    int32_t* expert = ctx.iwork;                  // [T*k] local expert of each pair (-1: another rank's)
    float* weight = reinterpret_cast<float*>(expert + int64_t(T) * k);  // [T*k] its routing weight
    int32_t* order = expert + 2 * int64_t(T) * k;  // [T*k] pairs sorted by expert, then token, then slot
    int32_t* start = order + int64_t(T) * k;       // [L+1] each expert's first sorted pair
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (ctx.nthreads > 1 && T >= 16)
    for (int r = 0; r < T; ++r) {
        int top[kMoeMaxExperts];
        double w[kMoeMaxExperts];
        route(P, logits + r * ldl, top, w);
        for (int j = 0; j < k; ++j) {
            const int e = top[j] - P.first;
            expert[r * k + j] = e >= 0 && e < L ? e : -1;  // outside: tensor parallelism's other ranks
            weight[r * k + j] = float(w[j]);
        }
    }
    std::fill(start, start + L + 1, 0);
    for (int64_t q = 0; q < int64_t(T) * k; ++q)
        if (expert[q] >= 0) ++start[expert[q] + 1];
    for (int e = 0; e < L; ++e) start[e + 1] += start[e];
    {
        int32_t* next = start;  // counting sort: start[e] advances while its pairs are placed...
        for (int64_t q = 0; q < int64_t(T) * k; ++q)
            if (expert[q] >= 0) order[next[expert[q]]++] = int32_t(q);
        for (int e = L; e > 0; --e) start[e] = start[e - 1];  // ...so shift it back afterwards
        start[0] = 0;
    }
    for (int r = 0; r < T; ++r) std::fill(out + r * ldo, out + r * ldo + H, 0.0f);

    float* xs = ctx.scratch[0];               // (chunk, H) the expert's tokens
    float* gu = xs + int64_t(kExpertChunk) * H;     // (chunk, 2I)
    float* act = gu + int64_t(kExpertChunk) * 2 * I;  // (chunk, I)
    float* ys = act + int64_t(kExpertChunk) * I;    // (chunk, H)
    const float* bgu = P.bias_at >= 0 ? static_cast<const float*>(c.weights[P.bias_at]->data) : nullptr;
    const float* bd = P.bias_at >= 0 ? static_cast<const float*>(c.weights[P.bias_at + 1]->data) : nullptr;
    const ExpertInputOrder input_order = kernel.input_order;
    if (kernel.rows && start[L] <= kExpertChunk) {
        run_small_batch(c, ctx, P, kernel, order, start, weight, x, ldx, out, ldo, xs, gu, act, ys, bgu, bd);
        return;
    }
    for (int e = 0; e < L; ++e)
        for (int c0 = start[e]; c0 < start[e + 1]; c0 += kExpertChunk) {
            const int M = std::min(kExpertChunk, start[e + 1] - c0);
            for (int m = 0; m < M; ++m)
                std::memcpy(xs + int64_t(m) * H, x + (order[c0 + m] / k) * ldx, sizeof(float) * H);
            if (input_order) input_order(xs, H, M, H);
            kernel.matmul(c, GATE_UP, e, xs, H, M, bgu ? bgu + int64_t(e) * 2 * I : nullptr, gu, 2 * I, ctx.nthreads);
            activate(P, gu, act, 0, M);
            if (input_order) input_order(act, I, M, I);
            kernel.matmul(c, DOWN, e, act, I, M, bd ? bd + int64_t(e) * H : nullptr, ys, H, ctx.nthreads);
            for (int m = 0; m < M; ++m) {
                const int q = order[c0 + m];
                axpy(weight[q], ys + int64_t(m) * H, out + (q / k) * ldo, H);
            }
        }
}

void prepare_moe(KernelCall& c, const PlanInfo& p) {
    MoeParams& P = c.set_params<MoeParams>();
    prepare_moe_routing(c, p, P, 2);
    const int64_t L = P.local, I2 = 2 * int64_t(P.I), H = P.H, I = P.I;
    if (P.stacked) {
        expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, H, I2});
        expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L, I, H});
    } else {
        expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * I2, H});
        expect_weight(c, 1, {DT_F32}, {LAYOUT_ROW_MAJOR}, {L * H, I});
    }
}

void run_moe(const KernelCall& c, const StepContext& ctx) {
    run_moe_grouped(c, ctx, c.get<MoeParams>(), {matmul_f32});
}

}  // namespace bessemer
