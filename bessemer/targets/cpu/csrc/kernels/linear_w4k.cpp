// linear_w4k@1: fp32 activations rounded to bf16 times two-level 4-bit weights
// (quantization/superblock.py):
//
//   weights codes (int4 panel16_int4_k8 [N, K]), scales, offsets (uint8 panel16 [N, K/32]),
//   super_scales, super_offsets (float16 panel16 [N, K/B]), bias?; attrs super_block (B)
//   w[n, k] = (d * sc) * code - (dmin * m),  sc/m of sub-block k/32, d/dmin of super-block k/B
//   y = sum over sub-blocks j in order of s_j * (xb_j @ codes_j^T) + o_j * sum(xb_j) (+ bias)
//
// which is linear_w4a16@2's arithmetic with group 32 and s_j = d * sc, o_j = -(dmin * m)
// (fp32 products). With AVX512_BF16 the kernel reads the stored parameters as they are
// (linear_w4_bf16_avx512.cpp: 4.6 bits per weight streamed, as much as w4a16 g32's 4.5);
// elsewhere s_j and o_j are made once here as fp32 and @2's fp32 microkernels run on
// bf16(x) (linear_quant.cpp / linear_quant_avx512.cpp): the same products, the same order.
#include <cstring>

#include "kernels.h"

namespace bessemer {

namespace {
struct W4kParams : KernelParams {
    int N, K, B;
    bool bf16_kernel;
    // fallback only: panel16_int4 codes, then fp32 [scales | offsets] panel16 [N, K/32]
    std::vector<uint8_t> relaid;
    std::vector<float> params;
};

float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    uint32_t u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {  // subnormal: normalise
        int e = -1;
        uint32_t m = man;
        do { ++e; m <<= 1; } while ((m & 0x400u) == 0);
        u = sign | (uint32_t(112 - e) << 23) | ((m & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
}  // namespace

void prepare_linear_w4k(KernelCall& c, const PlanInfo& p) {
    int N, K;
    expect_linear(c, p, 5, 6, &N, &K);
    const int64_t B = attr_int(c, "super_block");
    if (B < 32 || B % 32 != 0 || B > K || K % B != 0)
        kernel_error(c, "super_block " + std::to_string(B) + " must be a multiple of 32 dividing K = " +
                            std::to_string(K));
    if (B > linear_w4a16_v2_max_group())
        kernel_error(c, "super_block " + std::to_string(B) + " is larger than linear_w4k supports (" +
                            std::to_string(linear_w4a16_v2_max_group()) + ")");
    expect_weight(c, 0, {DT_I4}, {LAYOUT_PANEL16_INT4_K8}, {int64_t(N), int64_t(K)});
    expect_weight(c, 1, {DT_U8}, {LAYOUT_PANEL16}, {int64_t(N), int64_t(K / 32)});
    expect_weight(c, 2, {DT_U8}, {LAYOUT_PANEL16}, {int64_t(N), int64_t(K / 32)});
    expect_weight(c, 3, {DT_F16}, {LAYOUT_PANEL16}, {int64_t(N), K / B});
    expect_weight(c, 4, {DT_F16}, {LAYOUT_PANEL16}, {int64_t(N), K / B});
    if (c.weights.size() == 6) expect_weight(c, 5, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(N)});
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "input and output views overlap");
    W4kParams& a = c.set_params<W4kParams>();
    a.N = N;
    a.K = K;
    a.B = int(B);
    a.bf16_kernel = p.isa == Isa::AVX512 && linear_w4_bf16_avx512_available(true);
    if (a.bf16_kernel) return;
    // Fallback: codes re-laid for the fp32 microkernels and each sub-block's s, o made once.
    a.relaid.resize(size_t((N + 15) / 16) * size_t(K) * 8);
    repack_int4_k8_to_panel16(static_cast<const uint8_t*>(c.weights[0]->data), N, K, a.relaid.data());
    const int P = (N + 15) / 16, nsub = K / 32, per = int(B / 32);
    const size_t n = size_t(P) * 16 * size_t(nsub);
    a.params.resize(2 * n);
    const auto* sc = static_cast<const uint8_t*>(c.weights[1]->data);
    const auto* m = static_cast<const uint8_t*>(c.weights[2]->data);
    const auto* d = static_cast<const uint16_t*>(c.weights[3]->data);
    const auto* dmin = static_cast<const uint16_t*>(c.weights[4]->data);
    for (int pn = 0; pn < P; ++pn)
        for (int j = 0; j < nsub; ++j)
            for (int r = 0; r < 16; ++r) {  // panel16: [panel][column][row of 16]
                const size_t i = (size_t(pn) * nsub + j) * 16 + r;
                const size_t is = (size_t(pn) * (nsub / per) + j / per) * 16 + r;
                a.params[i] = half_to_float(d[is]) * float(sc[i]);
                a.params[n + i] = -(half_to_float(dmin[is]) * float(m[i]));
            }
}

void run_linear_w4k(const KernelCall& c, const StepContext& ctx) {
    const int M = ctx.rows(c.rows);
    if (M == 0) return;
    const W4kParams& a = c.get<W4kParams>();
    const float* bias = c.weights.size() == 6 ? static_cast<const float*>(c.weights[5]->data) : nullptr;
    const float* x = ctx.ptr(c.ins[0]);
    float* y = ctx.ptr(c.outs[0]);
    if (a.bf16_kernel) {
        linear_w4k_bf16_avx512(x, ctx.ld(c.ins[0]), M, static_cast<const uint8_t*>(c.weights[0]->data),
                               static_cast<const uint8_t*>(c.weights[1]->data),
                               static_cast<const uint8_t*>(c.weights[2]->data),
                               static_cast<const uint16_t*>(c.weights[3]->data),
                               static_cast<const uint16_t*>(c.weights[4]->data), a.B, a.N, a.K, bias, y,
                               ctx.ld(c.outs[0]), ctx.nthreads);
        return;
    }
    const float* scales = a.params.data();
    const float* offsets = a.params.data() + a.params.size() / 2;
    if (ctx.isa == Isa::AVX512)
        linear_w4_avx512(x, ctx.ld(c.ins[0]), M, a.relaid.data(), scales, offsets, 32, a.N, a.K, bias, y,
                         ctx.ld(c.outs[0]), ctx.nthreads, true);
    else
        linear_w4_avx2(x, ctx.ld(c.ins[0]), M, a.relaid.data(), scales, offsets, 32, a.N, a.K, bias, y,
                       ctx.ld(c.outs[0]), ctx.nthreads, true);
}

}  // namespace bessemer
