// AVX-512 inner loops of attention@1's decode path (attention_avx512.cpp); kind is the
// cache element kind of kv_codec.h (0 fp32, 1 bf16, 2 int8, 3 E4M3), head_dim % 16 == 0.
#pragma once

#include <stdint.h>

namespace bessemer {

// sc[h * ncap + u] = kmul[(h / G) * 8 + u] * q[h].K[ko[u] + kvh * D ..] for the 8 keys at
// element offsets ko[0..8) and every head h (q: the row's H * D query values).
void attn_dec_scores8_avx512(int kind, const void* Kc, const int64_t* ko, const float* q, int H, int Hkv, int D,
                             const float* kmul, float* sc, int64_t ncap);
// acc[g * D + d] += sum_i w[g * wstride + i] * V[voff[i] + d] for the `heads` query heads
// g of one KV head (V already offset to it); each V element is converted once for all.
void attn_dec_pv_avx512(int kind, const void* Vc, const int64_t* voff, int n, const float* w, int64_t wstride,
                        int heads, int D, float* acc);

}  // namespace bessemer
