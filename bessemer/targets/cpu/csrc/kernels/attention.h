// attention@1's (and attention_sinks@1's) parameters and tile constants, shared by its prepare (attention_prepare.cpp)
// and its run (attention.cpp).
#pragma once

#include <cstdint>

#include "attention_blocks.h"
#include "kernel_api.h"

namespace bessemer {

constexpr int kLanes = 16;  // query vectors per tile (the tiled path, attention.cpp)
// Floats of a thread's scratch on the decode-row path (attention.cpp's RowScratch): the block's
// V rows and transposed keys, G heads' queries, scores, P.V, sums, partials and running state,
// the keys' value multipliers, and the block's cache rows and V offsets (int64).
constexpr int64_t row_scratch_floats(int64_t G, int64_t D) {
    return 2 * int64_t(kKB) * D + G * (4 * D + kKB + 5) + kKB + 1 + 4 * int64_t(kKB);
}

struct AttentionParams : KernelParams {
    int layer, H, Hkv, D;
    int64_t window;  // 0: none
    float scale;
    bool sinks = false;  // attention_sinks@1: weight 0 holds one learned logit per query head
};

}  // namespace bessemer
