// KV-cache element codecs for attention@1 (AVX2/F16C): the four cache element kinds, the
// loads that turn 8 stored elements into fp32 lanes in registers, and the quantizing write
// of one (token, KV head) row. quantization/kv_cache.py is the reference; the write does
// its float32 arithmetic in the same order, so the codes are equal.
//
// One-byte kinds store x ~= value(code) * scale with a float32 scale per (token, KV head).
// The loads return value(code) * kValueMul[KV]^-1 (fp8: E4M3 bits re-biased as fp16 come
// out 2^-8 times the E4M3 value, exactly, subnormals included), so a kernel multiplies by
// scale * kValueMul once per key (K: after the dot product; V: folded into the softmax
// weight) and never per element.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "simd_avx2.h"

namespace bessemer {
namespace kv {

enum Kind : int { F32 = 0, BF16 = 1, I8 = 2, F8 = 3 };

template <int KV> struct Elem;
template <> struct Elem<F32> { using T = float; };
template <> struct Elem<BF16> { using T = uint16_t; };
template <> struct Elem<I8> { using T = int8_t; };
template <> struct Elem<F8> { using T = uint8_t; };

template <int KV> constexpr bool coded() { return KV == I8 || KV == F8; }
template <int KV> constexpr float value_mul() { return KV == F8 ? 256.0f : 1.0f; }
template <int KV> constexpr float code_max() { return KV == F8 ? 448.0f : 127.0f; }

// 8 E4M3 bytes (in the low 8 bytes of b) -> fp32 * 2^-8.
static inline __m256 e4m3x8_to_f32(__m128i b) {
    const __m128i w = _mm_cvtepu8_epi16(b);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7F)), 7),
                                   _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
    return _mm256_cvtph_ps(h);
}

static inline float e4m3_to_f32_scaled(uint8_t b) {  // fp32 * 2^-8, as e4m3x8_to_f32
    const uint16_t h = uint16_t(((b & 0x7F) << 7) | ((b & 0x80) << 8));
    return _cvtsh_ss(h);
}

// Elements off..off+7 of a cache (element offsets), as fp32 (one-byte kinds: unscaled).
template <int KV>
inline __m256 load8(const void* base, int64_t off) {
    if constexpr (KV == BF16) {
        return simd::load_bf16x8(static_cast<const uint16_t*>(base) + off);
    } else if constexpr (KV == I8) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const int8_t*>(base) + off));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    } else if constexpr (KV == F8) {
        return e4m3x8_to_f32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(static_cast<const uint8_t*>(base) + off)));
    } else {
        return _mm256_loadu_ps(static_cast<const float*>(base) + off);
    }
}

template <int KV>
inline float load1(const void* base, int64_t off) {
    if constexpr (KV == BF16) return simd::bf16_to_f32(static_cast<const uint16_t*>(base)[off]);
    else if constexpr (KV == I8) return float(static_cast<const int8_t*>(base)[off]);
    else if constexpr (KV == F8) return e4m3_to_f32_scaled(static_cast<const uint8_t*>(base)[off]);
    else return static_cast<const float*>(base)[off];
}

// 8 int32 lanes (each 0..255 or -127..127) -> 8 bytes at dst.
static inline void store_bytes8(__m256i v, void* dst, bool is_unsigned) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i b = is_unsigned ? _mm_packus_epi16(w, w) : _mm_packs_epi16(w, w);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst), b);
}

// y (|y| <= 448 after the clamp) -> E4M3FN codes, round to nearest even: normals keep 3
// mantissa bits of the float32 (RNE on the bits, rebias 127 -> 7), subnormals are
// rint(|y| * 2^9) (8 at the top edge is the code of 2^-6, so the two ranges meet).
static inline __m256i f32x8_to_e4m3(__m256 y) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u)));
    const __m256 a = _mm256_min_ps(_mm256_andnot_ps(sign_mask, y), _mm256_set1_ps(448.0f));
    const __m256i bits = _mm256_castps_si256(a);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 20), _mm256_set1_epi32(1));
    const __m256i rnd = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFFF)), odd), 20);
    const __m256i normal = _mm256_sub_epi32(rnd, _mm256_set1_epi32(120 << 3));
    const __m256i sub = _mm256_cvtps_epi32(_mm256_mul_ps(a, _mm256_set1_ps(512.0f)));
    const __m256 tiny = _mm256_cmp_ps(a, _mm256_set1_ps(1.0f / 64.0f), _CMP_LT_OQ);
    const __m256i mag = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(normal), _mm256_castsi256_ps(sub), tiny));
    const __m256i sign = _mm256_srli_epi32(_mm256_castps_si256(_mm256_and_ps(y, sign_mask)), 24);
    return _mm256_or_si256(mag, sign);
}

static inline uint8_t f32_to_e4m3(float y) {
    alignas(32) int32_t out[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(out), f32x8_to_e4m3(_mm256_set1_ps(y)));
    return uint8_t(out[0]);
}

// Writes one (token, KV head) row x[0..D) as codes (and returns its scale): amax over the
// row, inv = code_max / amax, code = round(x * inv); scale = amax / code_max (0 for a zero row).
template <int KV>
inline float quantize_row(const float* x, int D, typename Elem<KV>::T* dst) {
    const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u)));
    __m256 vmax = _mm256_setzero_ps();
    int d = 0;
    for (; d + 8 <= D; d += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign_mask, _mm256_loadu_ps(x + d)));
    float amax = simd::hmax256(vmax);
    for (; d < D; ++d) amax = std::max(amax, std::fabs(x[d]));
    const float inv = amax > 0.0f ? code_max<KV>() / amax : 0.0f;
    const __m256 vinv = _mm256_set1_ps(inv);
    for (d = 0; d + 8 <= D; d += 8) {
        const __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + d), vinv);
        if constexpr (KV == I8) {
            __m256i c = _mm256_cvtps_epi32(y);
            c = _mm256_max_epi32(_mm256_min_epi32(c, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
            store_bytes8(c, dst + d, false);
        } else {
            store_bytes8(f32x8_to_e4m3(y), dst + d, true);
        }
    }
    for (; d < D; ++d) {
        const float y = x[d] * inv;
        if constexpr (KV == I8) dst[d] = int8_t(std::max(-127.0f, std::min(127.0f, std::nearbyint(y))));
        else dst[d] = f32_to_e4m3(y);
    }
    return amax / code_max<KV>();
}

}  // namespace kv
}  // namespace bessemer
