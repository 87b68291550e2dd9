// fp32 -> nearest bf16 (ties to even), kept as fp32, for finite input: what the build-time
// searches round their candidate scales with, bit for bit as format/dtypes.to_bfloat16_bits
// and primitives.round_to_bf16 do in NumPy.
#pragma once

#include <cstdint>
#include <cstring>

namespace bessemer {

inline float round_to_bf16(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    u = ((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16;
    std::memcpy(&x, &u, 4);
    return x;
}

}  // namespace bessemer
