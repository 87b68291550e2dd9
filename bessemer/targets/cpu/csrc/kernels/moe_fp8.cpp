// moe_fp8@1: the grouped expert driver (moe_grouped.h) on experts stored like linear_fp8@2's
// weights, one (N, K) matrix per expert stacked as (E*N, K) rows (gate_up N = 2I, down
// N = H; quantization/formats.py ExpertStack of Fp8E4M3). N is a multiple of 16, so expert
// e's panels are the contiguous e-th slice of the codes and every expert's GEMM is the dense
// fp8 kernel's own (linear_fp8.cpp AVX2, linear_fp8_avx512.cpp AVX-512 BF16) on it, or in a
// small batch on runs of whole panel groups of the routed experts, one thread each (as
// moe_quant.cpp).
//
//   weights [gate_up codes float8_e4m3 panel16 (E*2I, H), scales f32 (E*2I), down codes
//           (E*H, I), scales (E*H)] [gate_up_bias, down_bias]
//   attrs   act_group (0/absent, 16, 32, 64 or 128), as linear_fp8@2's
//
// Activations get a dynamic scale per token (max |x[t]| / 448 of the row the expert GEMM
// reads, refined per act_group columns when set), as linear_fp8@2: experts have no calibrated
// static scale (a static one is the linears' only). Every scale is a function of its own row,
// so a token's result does not depend on which other tokens share its expert's GEMM.
// Expert rows keep the graph's order: layout 0 gate rows then up rows, layout 1 (gpt-oss)
// gate/up interleaved.
#include <string>

#include "moe_grouped.h"

namespace bessemer {

namespace {

struct MoeFp8Params : MoeParams {
    bool bf16_kernel = false;  // the AVX-512 BF16 kernel (isa=avx512 on a CPU with AVX512_BF16)
    int act_group = 0;
};

// Stored rows [r0, r0 + N) of `which` (r0 a multiple of 16: whole panels) times x, as the dense
// kernel computes them: y (M, N) = x (M, K) @ W[r0:r0 + N]^T (+ bias, already offset). The
// activation scales are functions of x's rows alone, so a slice's are the whole matrix's.
void slice_fp8(const KernelCall& c, ExpertMatrix which, int64_t r0, int64_t N, const float* x, int64_t ldx, int M,
               const float* bias, float* y, int64_t ldy, int nthreads) {
    const MoeFp8Params& P = c.get<MoeFp8Params>();
    const int64_t K = expert_k(P, which);
    const auto* q = static_cast<const uint8_t*>(c.weights[2 * which]->data) + r0 * K;
    const auto* s = static_cast<const float*>(c.weights[2 * which + 1]->data) + r0;
    if (P.bf16_kernel)
        linear_fp8_avx512(x, ldx, M, q, s, 1.0f, true, P.act_group, int(N), int(K), bias, y, ldy, nthreads);
    else
        linear_fp8_avx2(x, ldx, M, q, s, 1.0f, true, P.act_group, int(N), int(K), bias, y, ldy, nthreads);
}

}  // namespace

void prepare_moe_fp8(KernelCall& c, const PlanInfo& p) {
    MoeFp8Params& P = c.set_params<MoeFp8Params>();
    prepare_moe_routing(c, p, P, 4);
    expect_panel_rows(c, P);
    P.act_group = fp8_act_group(c, true);
    P.bf16_kernel = p.isa == Isa::AVX512 && linear_fp8_avx512_bf16_available();
    expect_per_row_experts(c, P, DT_F8E4M3);
}

void run_moe_fp8(const KernelCall& c, const StepContext& ctx) {
    run_moe_grouped(c, ctx, c.get<MoeFp8Params>(), panel_kernel<slice_fp8>());
}

}  // namespace bessemer
