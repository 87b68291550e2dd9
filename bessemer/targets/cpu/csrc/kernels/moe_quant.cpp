// moe_w8a16@1 and moe_w4a16@1: the grouped expert driver (moe_grouped.h) on experts stored
// like the dense quantized linears, one (N, K) matrix per expert stacked as (E*N, K) rows
// (gate_up N = 2I, down N = H; quantization/formats.py ExpertStack). N is a multiple of 16,
// so expert e's panels are the contiguous e-th slice of each stored part and every expert's
// GEMM is the dense kernels' own (linear_quant*.cpp, linear_w4_bf16_avx512.cpp) on it. In a
// small batch (decode) the driver hands each thread whole routed experts (or a run of whole
// panel groups of their rows), and the dense kernel computes them on that thread: the same
// arithmetic per row as the whole GEMM (the dense kernels split rows over threads, never K),
// in one parallel region per step instead of two fork-joins per expert.
//
//   w8: weights [gate_up codes int8 panel16 (E*2I, H), scales f32 (E*2I), down codes (E*H, I),
//       scales (E*H)] [gate_up_bias, down_bias]
//   w4: weights [gate_up codes int4 panel16_int4(_k8), scales bf16 panel16 (E*2I, H/G)
//       (, offsets likewise when attrs zero_point), down codes, scales (, offsets)] [biases];
//       activations rounded to bf16, as linear_w4a16@2/@3 read them; G from the scales' shape.
// Expert rows keep the graph's order: layout 0 gate rows then up rows, layout 1 (gpt-oss)
// gate/up interleaved.
#include <cstring>
#include <string>
#include <vector>

#include "moe_grouped.h"

namespace bessemer {

namespace {

// ---------------------------------------------------------------- int8
struct MoeW8Params : MoeParams {
    Isa isa = Isa::AVX2;
};

// Stored rows [r0, r0 + N) of `which` (r0 a multiple of 16: whole panels) times x, as the dense
// kernel computes them: y (M, N) = x (M, K) @ W[r0:r0 + N]^T (+ bias, already offset).
void slice_w8(const KernelCall& c, ExpertMatrix which, int64_t r0, int64_t N, const float* x, int64_t ldx, int M,
              const float* bias, float* y, int64_t ldy, int nthreads) {
    const MoeW8Params& P = c.get<MoeW8Params>();
    const int64_t K = expert_k(P, which);
    const auto* q = static_cast<const int8_t*>(c.weights[2 * which]->data) + r0 * K;
    const auto* s = static_cast<const float*>(c.weights[2 * which + 1]->data) + r0;
    if (P.isa == Isa::AVX512)
        linear_w8_avx512(x, ldx, M, q, s, int(N), int(K), bias, y, ldy, nthreads);
    else
        linear_w8_avx2(x, ldx, M, q, s, int(N), int(K), bias, y, ldy, nthreads);
}

// ---------------------------------------------------------------- int4
struct W4Matrix {
    int G = 0;
    bool k8 = false;
    const uint8_t* codes = nullptr;
    const void* scales = nullptr;   // bf16 as stored
    const void* offsets = nullptr;  // bf16 as stored; null: symmetric, w = scale * (code - 8)
    // A CPU without the bf16 kernel: codes re-laid as panel16_int4 and fp32 scales / offsets
    // (offsets = -8 * scales when symmetric), made once at prepare like linear_w4a16's.
    std::vector<uint8_t> relaid;
    std::vector<float> scales_f, offsets_f;
};

struct MoeW4Params : MoeParams {
    Isa isa = Isa::AVX2;
    bool bf16_kernel = false;
    W4Matrix m[2];
};

float bf16_to_float(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

void prepare_w4_matrix(KernelCall& c, const PlanInfo& p, MoeW4Params& P, ExpertMatrix which, int at, bool zp) {
    const int64_t rows = P.local * expert_rows(P, which), K = expert_k(P, which);
    const TensorRef& sc = *c.weights[at + 1];
    const int64_t groups = sc.shape.size() == 2 ? sc.shape[1] : 0;
    if (groups <= 0 || K % groups)
        kernel_error(c, "expert scales must have (rows, K / group_size) shape");
    W4Matrix& w = P.m[which];
    w.G = int(K / groups);
    if ((w.G % 16 && w.G != K) || w.G > linear_w4a16_v2_max_group())
        kernel_error(c, "expert group_size " + std::to_string(w.G) + " must be a multiple of 16 (or K) and at most " +
                            std::to_string(linear_w4a16_v2_max_group()) + "; rebuild with another --group-size");
    expect_weight(c, at, {DT_I4}, {LAYOUT_PANEL16_INT4, LAYOUT_PANEL16_INT4_K8}, {rows, K});
    expect_weight(c, at + 1, {DT_BF16}, {LAYOUT_PANEL16}, {rows, groups});
    if (zp) expect_weight(c, at + 2, {DT_BF16}, {LAYOUT_PANEL16}, {rows, groups});
    w.k8 = c.weights[at]->layout == LAYOUT_PANEL16_INT4_K8;
    w.codes = static_cast<const uint8_t*>(c.weights[at]->data);
    w.scales = sc.data;
    w.offsets = zp ? c.weights[at + 2]->data : nullptr;
    P.bf16_kernel = p.isa == Isa::AVX512 && linear_w4_bf16_avx512_available(true) &&
                    linear_w4_bf16_avx512_available(false);
    if (P.bf16_kernel) return;
    if (w.k8) {
        w.relaid.resize(size_t(rows / 16) * size_t(K) * 8);
        repack_int4_k8_to_panel16(w.codes, int(rows), int(K), w.relaid.data());
    }
    const size_t n = size_t(rows) * size_t(groups);
    w.scales_f.resize(n);
    w.offsets_f.resize(n);
    for (size_t i = 0; i < n; ++i) {
        w.scales_f[i] = bf16_to_float(static_cast<const uint16_t*>(w.scales)[i]);
        w.offsets_f[i] = zp ? bf16_to_float(static_cast<const uint16_t*>(w.offsets)[i]) : -8.0f * w.scales_f[i];
    }
}

// Stored rows [r0, r0 + N) of `which` (r0 a multiple of 16: whole panels) times x, as the dense
// kernels compute them: y (M, N) = x (M, K) @ W[r0:r0 + N]^T (+ bias, already offset).
void slice_w4(const KernelCall& c, ExpertMatrix which, int64_t r0, int64_t N, const float* x, int64_t ldx, int M,
              const float* bias, float* y, int64_t ldy, int nthreads) {
    const MoeW4Params& P = c.get<MoeW4Params>();
    const W4Matrix& w = P.m[which];
    const int64_t K = expert_k(P, which);
    const int64_t code_bytes = r0 * K / 2, params = r0 * (K / w.G);  // the slice's panels
    if (P.bf16_kernel) {
        const auto* s = static_cast<const uint16_t*>(w.scales) + params;
        const auto* o = w.offsets ? static_cast<const uint16_t*>(w.offsets) + params : nullptr;
        linear_w4_bf16_avx512(x, ldx, M, w.codes + code_bytes, w.k8, s, o, true, w.G, int(N), int(K), bias, y, ldy,
                              nthreads);
        return;
    }
    const uint8_t* codes = (w.relaid.empty() ? w.codes : w.relaid.data()) + code_bytes;
    const float* s = w.scales_f.data() + params;
    const float* o = w.offsets_f.data() + params;
    if (P.isa == Isa::AVX512)
        linear_w4_avx512(x, ldx, M, codes, s, o, w.G, int(N), int(K), bias, y, ldy, nthreads, true);
    else
        linear_w4_avx2(x, ldx, M, codes, s, o, w.G, int(N), int(K), bias, y, ldy, nthreads, true);
}

}  // namespace

void prepare_moe_w8a16(KernelCall& c, const PlanInfo& p) {
    MoeW8Params& P = c.set_params<MoeW8Params>();
    prepare_moe_routing(c, p, P, 4);
    expect_panel_rows(c, P);
    P.isa = p.isa;
    expect_per_row_experts(c, P, DT_I8);
}

void run_moe_w8a16(const KernelCall& c, const StepContext& ctx) {
    run_moe_grouped(c, ctx, c.get<MoeW8Params>(), panel_kernel<slice_w8>());
}

void prepare_moe_w4a16(KernelCall& c, const PlanInfo& p) {
    MoeW4Params& P = c.set_params<MoeW4Params>();
    const bool zp = attr_or(c, "zero_point", 0.0) != 0.0;
    const int per = zp ? 3 : 2;  // codes, scales (, offsets) of each matrix
    prepare_moe_routing(c, p, P, 2 * per);
    expect_panel_rows(c, P);
    P.isa = p.isa;
    prepare_w4_matrix(c, p, P, GATE_UP, 0, zp);
    prepare_w4_matrix(c, p, P, DOWN, per, zp);
}

void run_moe_w4a16(const KernelCall& c, const StepContext& ctx) {
    run_moe_grouped(c, ctx, c.get<MoeW4Params>(), panel_kernel<slice_w4>());
}

}  // namespace bessemer
