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
BESSEMER_KERNEL(all_gather)
BESSEMER_KERNEL(all_reduce)
BESSEMER_KERNEL(add_rms_norm)
BESSEMER_KERNEL(attention)
// attention_sinks@1 runs attention@1's run_attention (its prepare sets the sinks)
void prepare_attention_sinks(KernelCall& c, const PlanInfo& p);
BESSEMER_KERNEL(embedding)
BESSEMER_KERNEL(embedding_w4a16)
BESSEMER_KERNEL(embedding_w8a16)
BESSEMER_KERNEL(gather_rows)
BESSEMER_KERNEL(gelu_tanh_mul)
BESSEMER_KERNEL(linear)
BESSEMER_KERNEL(linear_fp8)
BESSEMER_KERNEL(linear_w4a16)
BESSEMER_KERNEL(linear_w4a8)
BESSEMER_KERNEL(linear_w4k)
BESSEMER_KERNEL(linear_w8a16)
BESSEMER_KERNEL(linear_w8a8)
BESSEMER_KERNEL(moe)
BESSEMER_KERNEL(moe_fp8)
BESSEMER_KERNEL(moe_mxfp4)
BESSEMER_KERNEL(moe_w4a16)
BESSEMER_KERNEL(moe_w8a16)
BESSEMER_KERNEL(rms_norm)
BESSEMER_KERNEL(rms_norm_heads)
BESSEMER_KERNEL(rope)
BESSEMER_KERNEL(scale)
BESSEMER_KERNEL(sigmoid_gate_mul)
BESSEMER_KERNEL(silu_mul)

#undef BESSEMER_KERNEL

// y[M, N] (row stride ldy) = x[M, K] (row stride ldx) @ W^T (+ bias); W panel16 [N, K],
// fp32 (bf16 == false) or bf16 bit patterns. Only N columns of y are written.
void linear_avx2(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                 const float* bias, float* y, int64_t ldy, int nthreads);
void linear_avx512(const float* x, int64_t ldx, int M, const void* w, bool bf16, int N, int K,
                   const float* bias, float* y, int64_t ldy, int nthreads);

// Quantized linears (linear_quant.cpp, linear_quant_avx512.cpp); x, y, bias as above.
// int8: q int8 panel16 [N, K], scales [N]: y = (x @ q^T) * scales.
void linear_w8_avx2(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N,
                    int K, const float* bias, float* y, int64_t ldy, int nthreads);
void linear_w8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* scales, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads);
// int4: codes panel16_int4 [N, K]; scales, offsets panel16 [N, K/group]:
// w = scale * code + offset per group.
// round_x: linear_w4a16@2 on a CPU without AVX512_BF16 + VBMI: x rounded to bf16 values
// first (round_rows_to_bf16_f32), so every CPU computes @2's products.
// linear_w4_avx2 also reads its parameters as stored: pbytes 2 when scales and offsets are
// bf16 (widened in registers), and offsets null for symmetric codes (w = scale * (code - 8)).
void linear_w4_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                    const float* offsets, int group, int N, int K, const float* bias, float* y,
                    int64_t ldy, int nthreads, bool round_x, int pbytes = 4);
void linear_w4_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales,
                      const float* offsets, int group, int N, int K, const float* bias, float* y,
                      int64_t ldy, int nthreads, bool round_x);
// linear_w4a16@2 (linear_w4_bf16_avx512.cpp): bf16 activations, vdpbf16ps; codes
// panel16_int4 (k8 false: needs AVX512_BF16 and AVX512_VBMI) or panel16_int4_k8 (k8 true:
// AVX512_BF16); scales and offsets fp32 or (bf16_params) bf16; offsets null: symmetric
// codes, w = scale * (code - 8) (linear_w4a16@3);
// linear_w4_bf16_avx512_available(k8) says whether this CPU runs it.
void linear_w4_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, bool k8, const void* scales,
                           const void* offsets, bool bf16_params, int group, int N, int K, const float* bias,
                           float* y, int64_t ldy, int nthreads);
bool linear_w4_bf16_avx512_available(bool k8);
// linear_w4k@1 on AVX512_BF16 (linear_w4_bf16_avx512.cpp): panel16_int4_k8 codes, uint8
// sub-block scale / minimum codes panel16 [N, K/32], fp16 super-scales / super-minimums
// panel16 [N, K/super_block] (fp16 bits); available when linear_w4_bf16_avx512_available(true).
void linear_w4k_bf16_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const uint8_t* scales,
                            const uint8_t* offsets, const uint16_t* super_scales, const uint16_t* super_offsets,
                            int super_block, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads);
// moe_mxfp4@1's expert GEMM on AVX-512 (moe_mxfp4_avx512.cpp), one thread: output rows
// [n0, n1) of y[M, N] = x[M, K] @ W^T (+ bias), W's MXFP4 rows: codes (N, K/2), E8M0 scales
// (N, K/32), scaled_e2m1[16 s + c] = E2M1 value of code c times 2^(s - 127); each 32-column
// block of x holds its even columns then its odd ones (moe_mxfp4.cpp).
void moe_mxfp4_rows_avx512(const uint8_t* codes, const uint8_t* scales, const float* scaled_e2m1, int64_t n0,
                           int64_t n1, int K, const float* x, int64_t ldx, int M, const float* bias, float* y,
                           int64_t ldy);
// panel16_int4_k8 codes of an [N, K] matrix (K a multiple of 8) re-laid as panel16_int4
// into out (ceil(N/16) * K * 8 bytes): for the kernels that read only panel16_int4.
void repack_int4_k8_to_panel16(const uint8_t* k8, int N, int K, uint8_t* out);
// rows x kc of x (row stride ldx) rounded to bf16 (nearest even, denormals to zero: what
// vcvtneps2bf16 does) and stored as fp32 at out (row stride ldq, columns kc..ldq-1 zero).
void round_rows_to_bf16_f32(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq);
// Largest group_size of linear_w4a16@2 (its prepared activations live on the stack).
int linear_w4a16_v2_max_group();

// int8 x int8 (linear_w8a8.cpp, linear_w8a8_avx512.cpp): q int8 vnni16 [N, K], ws [N], wsum
// [N] = sum_k q[n, k], smooth [K] or null; activations quantized per row inside.
constexpr int kW8A8MaxK = 32768;
void linear_w8a8_avx2(const float* x, int64_t ldx, int M, const int8_t* q, const float* ws, const int32_t* wsum,
                      const float* smooth, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads);
void linear_w8a8_avx512(const float* x, int64_t ldx, int M, const int8_t* q, const float* ws, const int32_t* wsum,
                        const float* smooth, int N, int K, const float* bias, float* y, int64_t ldy, int nthreads);

// int4 x int8 (linear_w4a8.cpp, linear_w4a8_avx512.cpp): codes panel16_int4_k8 [N, K] (w =
// scale * (code - 8)), scales fp32 panel16 [N, K/G]; activations quantized per row and
// group of G inside (G a multiple of 8 dividing K <= kW8A8MaxK).
void linear_w4a8_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                      int K, const float* bias, float* y, int64_t ldy, int nthreads);
void linear_w4a8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, int G, int N,
                        int K, const float* bias, float* y, int64_t ldy, int nthreads);

// FP8 (linear_fp8.cpp, linear_fp8_avx512.cpp): codes E4M3 panel16 [N, K], scales [N], xs the
// static activation scale: y = (e4m3(x / xs) @ decode(codes)^T) * xs * scales; dynamic: xs
// unused, each row r has its own xs_r = max|x[r]| / 448, refined by a power of two per group
// of act_group columns when act_group > 0 (linear_fp8_family.h). The AVX-512 kernel needs
// AVX512_BF16 (linear_fp8_avx512_bf16_available()).
void linear_fp8_avx2(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, float xs,
                     bool dynamic, int act_group, int N, int K, const float* bias, float* y, int64_t ldy,
                     int nthreads);
void linear_fp8_avx512(const float* x, int64_t ldx, int M, const uint8_t* codes, const float* scales, float xs,
                       bool dynamic, int act_group, int N, int K, const float* bias, float* y, int64_t ldy,
                       int nthreads);
bool linear_fp8_avx512_bf16_available();
// The validated attr act_group of an fp8 kernel call (0: absent): 16, 32, 64 or 128, and only
// with dynamic per-token scales (linear_fp8@2, moe_fp8); a one-line kernel error otherwise.
int fp8_act_group(const KernelCall& c, bool dynamic);

}  // namespace bessemer
