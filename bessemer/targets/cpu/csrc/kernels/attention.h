// attention@1's parameters and tile constants, shared by its prepare (attention_prepare.cpp)
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
};

}  // namespace bessemer
