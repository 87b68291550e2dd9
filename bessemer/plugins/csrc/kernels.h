// Declarations of every kernel's prepare/run (one .cpp per op family) and of the ISA
// specific linear entry points.
#pragma once

#include <cstdint>

#include "kernel_api.h"

namespace bessemer {

#define BESSEMER_KERNEL(name)                              \
    void prepare_##name(KernelCall& c, const PlanInfo& p); \
    void run_##name(const KernelCall& c, const StepContext& ctx);

BESSEMER_KERNEL(add)
BESSEMER_KERNEL(add_rms_norm)
BESSEMER_KERNEL(attention)
BESSEMER_KERNEL(embedding)
BESSEMER_KERNEL(gather_rows)
BESSEMER_KERNEL(linear)
BESSEMER_KERNEL(rms_norm)
BESSEMER_KERNEL(rope)
BESSEMER_KERNEL(silu_mul)

#undef BESSEMER_KERNEL

// y[M, N] (row stride ldy) = x[M, K] (row stride ldx) @ W^T (+ bias); W panel16 [N, K],
// fp32 (bf16 == false) or bf16 bit patterns. Only N columns of y are written.
void linear_avx2(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                 const float* bias, float* y, int64_t ldy, int nthreads);
void linear_avx512(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                   const float* bias, float* y, int64_t ldy, int nthreads);

}  // namespace bessemer
