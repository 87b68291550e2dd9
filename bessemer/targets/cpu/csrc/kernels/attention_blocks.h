// attention@1's key blocks and the AVX-512 inner loops of its decode-row path, declared
// without any C++ standard library header (attention_row_avx512.cpp includes this).
#pragma once

#include <stdint.h>

namespace bessemer {

// Keys per block. A query's keys are cut into blocks at absolute multiples of kKB (never
// where a batch, a chunk or a thread count would cut them); each block gives a partial
// (max, sum of exps, unnormalised P.V) and the partials merge in block order (attention_merge.h),
// so the rounding depends only on the query's own position.
constexpr int kKB = 64;
// A decode row's partials, one per (row, block, head): max, sum, then head_dim values.
constexpr int kPartialHead = 2;  // floats before the values

// AVX-512 inner loops of the decode-row path (attention_row_avx512.cpp), head_dim % 16 == 0.
// Scores: sg[g * kKB + i] = sum over d (one FMA chain, d in order) of qs[g * D + d] * kt[d * kKB + i]
// for the heads g < G and the keys i < 16 * ceil(nk / 16) (kt: the block's keys transposed).
void attn_row_scores_avx512(const float* qs, int G, int D, const float* kt, int nk, float* sg);
// The same scores read straight from an fp32 (kind 0) or bf16 (kind 1) cache kc, key i's
// elements at element offset koff[i] (the same bits: the block is transposed in registers).
void attn_row_scores_cache_avx512(int kind, const float* qs, int G, int D, const void* kc, const int64_t* koff,
                                  int nk, float* sg);
// P.V: og[g * D + d] = sum over keys i < nk in order (one FMA chain from 0) of
// sg[g * kKB + i] * V_i[d], and lg[g] = the keys' sum of sg[g * kKB + i] in order; V_i: the
// cache vc's (kind: kv_codec.h's 0 fp32, 1 bf16, 2 int8, 3 E4M3) elements from offset voff[i],
// times vmul[i] for the one-byte kinds.
void attn_row_pv_avx512(int kind, const float* sg, int G, int D, const void* vc, const int64_t* voff,
                        const float* vmul, int nk, float* og, float* lg);

}  // namespace bessemer
