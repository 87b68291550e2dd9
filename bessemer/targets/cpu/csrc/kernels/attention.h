// attention@1's (and attention_sinks@1's) parameters and tile constants, shared by its prepare (attention_prepare.cpp)
// and its run (attention.cpp).
#pragma once

#include <cstdint>

#include "kernel_api.h"

namespace bessemer {

constexpr int kLanes = 16;  // query vectors per tile (the tiled path, attention.cpp)
constexpr int kKB = 64;     // keys per block of a tile

struct AttentionParams : KernelParams {
    int layer, H, Hkv, D;
    int64_t window;  // 0: none
    float scale;
    bool sinks = false;  // attention_sinks@1: weight 0 holds one learned logit per query head
};

}  // namespace bessemer
