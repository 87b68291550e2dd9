// The grouped mixture-of-experts driver shared by every expert kernel (moe@1 on fp32 weights,
// moe_w8a16, moe_w4a16 and moe_mxfp4 on stored codes; plugins/ops.py ref_moe is the reference).
//
// A step: route every token (softmax + top-k as transformers does), then a counting sort of
// the (token, slot) pairs by expert, then per active expert one small GEMM over its tokens
// for gate/up, the activation, one for down, and y[token] += p * down. So each active
// expert's weights are read once per step (per kExpertChunk of its tokens), a decode step
// reads only its routed experts, and the GEMMs split their output rows over the threads
// (never the reduction). Every kernel variant supplies ExpertMatmul: how to multiply a
// block of rows by expert e's gate_up or down matrix in its stored format (and optionally
// ExpertRows, ExpertInputOrder below).
#pragma once

#include <cstdint>

#include "kernels.h"

namespace bessemer {

constexpr int kMoeMaxExperts = 1024;
constexpr int kExpertChunk = 64;  // tokens of one expert per GEMM: scratch is chunk x (2H + 3I)

struct MoeParams : KernelParams {
    int E, local, first, k, I, H;
    bool after_topk, renorm, stacked, swiglu_clamped;
    int bias_at = -1;  // weight index of gate_up_bias (down_bias follows); -1: no biases
};

enum ExpertMatrix { GATE_UP = 0, DOWN = 1 };

// One expert's (N, K) for gate_up (2I, H) and down (H, I).
inline int64_t expert_rows(const MoeParams& P, ExpertMatrix which) { return which == GATE_UP ? 2 * int64_t(P.I) : P.H; }
inline int64_t expert_k(const MoeParams& P, ExpertMatrix which) { return which == GATE_UP ? P.H : P.I; }

// Experts stored in the dense kernels' panel layouts: each expert's rows must be whole panels
// of 16, so that expert e's slice of every stored part is contiguous.
void expect_panel_rows(const KernelCall& c, const MoeParams& P);
// Weights 0-3 as gate_up and down codes of `codes` (one byte each, panel16, (local * N, K))
// with a float32 scale per row: int8 (moe_w8a16) and E4M3 (moe_fp8) experts.
void expect_per_row_experts(const KernelCall& c, const MoeParams& P, DType codes);

// y (M, N) = x (M, K) @ W^T (+ bias) for expert e's `which` matrix (gate_up: N = 2I, K = H;
// down: N = H, K = I), its rows split over nthreads.
using ExpertMatmul = void (*)(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                              const float* bias, float* y, int64_t ldy, int nthreads);

// Reads the attrs and views every expert kernel shares into P, checks them, and declares the
// scratch and workspaces run_moe_grouped needs. `matrix_weights`: weights before the
// optional two biases (2 for fp32, 4 for int8 / mxfp4 codes + scales, ...).
void prepare_moe_routing(KernelCall& c, const PlanInfo& p, MoeParams& P, int matrix_weights);

// Optional: output rows [n0, n1) of the same product on the calling thread (n0 and n1
// multiples of ExpertKernel::row_granule). A kernel that has it gets the small-batch path:
// when a step's (token, expert) pairs fit one chunk (decode: top_k experts per token), one
// parallel region computes them all: each thread takes whole experts when they split evenly
// over the threads (no barrier), else all active experts' gate_up rows, then their down rows,
// are split over the threads together (two barriers, not two fork-joins per expert). Each
// output row is computed as by ExpertMatmul, so results do not change.
using ExpertRows = void (*)(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                            const float* bias, float* y, int64_t ldy, int64_t n0, int64_t n1);

// Optional: re-orders the columns of a matmul's input (M rows of K, row stride ldx) in place
// before the kernel reads it, for a kernel that wants its inputs in its weights' element
// order; the inputs are the driver's own copies (gathered x, activations).
using ExpertInputOrder = void (*)(float* x, int64_t ldx, int M, int K);

struct ExpertKernel {
    ExpertMatmul matmul;
    ExpertRows rows = nullptr;
    ExpertInputOrder input_order = nullptr;
    // The threads' shares of rows are cut only at multiples of this: panel kernels (whose
    // experts are whole panels, expect_panel_rows) take rows in whole panel groups.
    int row_granule = 1;
};

// Rows (a multiple of 16, from 0) of every per-expert kernel that runs a dense linear kernel
// on a slice of an expert's panels: 4 panels, the dense GEMV's widest microkernel.
constexpr int kPanelGroupRows = 64;

void run_moe_grouped(const KernelCall& c, const StepContext& ctx, const MoeParams& P, const ExpertKernel& kernel);

// Rows [r0, r0 + N) of the stacked experts' matrix `which` (r0 and N whole panel groups) on
// nthreads threads, by a dense linear kernel. A kernel family that has one gets its
// ExpertMatmul and ExpertRows from it (panel_kernel below), computing each row the same way.
using ExpertSlice = void (*)(const KernelCall& c, ExpertMatrix which, int64_t r0, int64_t N, const float* x,
                             int64_t ldx, int M, const float* bias, float* y, int64_t ldy, int nthreads);

template <ExpertSlice slice>
void slice_matmul(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                  const float* bias, float* y, int64_t ldy, int nthreads) {
    const int64_t N = expert_rows(c.get<MoeParams>(), which);
    slice(c, which, e * N, N, x, ldx, M, bias, y, ldy, nthreads);
}

template <ExpertSlice slice>
void slice_rows(const KernelCall& c, ExpertMatrix which, int e, const float* x, int64_t ldx, int M,
                const float* bias, float* y, int64_t ldy, int64_t n0, int64_t n1) {
    const int64_t N = expert_rows(c.get<MoeParams>(), which);
    slice(c, which, e * N + n0, n1 - n0, x, ldx, M, bias ? bias + n0 : nullptr, y + n0, ldy, 1);
}

// The ExpertKernel of a panel-layout family: whole products and the small-batch row path.
template <ExpertSlice slice>
ExpertKernel panel_kernel() {
    return {slice_matmul<slice>, slice_rows<slice>, nullptr, kPanelGroupRows};
}

}  // namespace bessemer
