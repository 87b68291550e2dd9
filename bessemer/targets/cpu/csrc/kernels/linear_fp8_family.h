// linear_fp8@1's kernel family for the one linear driver (linear_driver.h), shared by its
// AVX2 (linear_fp8.cpp) and AVX-512 BF16 (linear_fp8_avx512.cpp) kernels. Internal linkage
// and no C++ standard library, so each file gets its own copy compiled for its own ISA.
//
// The activations are quantized to E4M3 (x / s_x, rounded, saturated) once per thread, row
// block and K block, into the thread's buffer (kXqBytes), so the microkernels read E4M3
// values (as fp32 or bf16) and never requantize x per panel group. The buffer bounds the
// blocks: Mc * kc_pad * esize <= kXqBytes, kc_pad = kc rounded up to an even count (the
// bf16 kernel reads k in pairs; the pad is zero).
// Each row has its own activation scale: the static s_x of linear_fp8@1 for every row, or
// (linear_fp8@2, dynamic per token) max|x[r]| / 448 of the whole row, computed once per row
// block before its first K block is quantized (1 for an all-zero row).
// With act_group G (@2 only), each group of G columns of a row (counted from column 0 of the
// whole row, the last one possibly shorter) is quantized with s_x[r] * 2^-e instead, e the
// group's exponent (fp8_group_exponents, as quantization/fp8.py group_exponents), and its
// E4M3 values are stored times 2^-e: exact in fp32 and bf16, so the microkernels and their
// epilogue (times s_x[r]) are the same with and without groups. Everything is per row, so a
// row's result does not depend on which other rows are in the batch.
#pragma once

#include "linear_driver.h"

namespace bessemer {
namespace {

constexpr int kXqBytes = 96 * 1024;  // per-thread quantized-activation block
constexpr float kE4M3Max = 448.0f;

struct Fp8Args {
    int kc;              // K columns of this block
    const char* xq;      // quantized rows: row r at xq + r * ldq * esize
    int64_t ldq;         // elements between rows of xq (kc_pad)
    const uint8_t* w;    // panel p0 at k0 (panel16 E4M3 bytes: 16 per panel and k)
    int64_t pstride;     // bytes between panels (K * 16)
    float* y;            // row m0, column 16*p0
    int64_t ldy;
    bool accumulate;     // not the first K block: the accumulators start from y's partial sums
    bool last;           // the last K block: scale y and add the bias; else store the partial sums
    const float* bias;   // bias + 16*p0 on the last K block, else null
    const float* ws;     // weight scales + 16*p0
    const float* xs;     // activation scales s_x of rows m0.. (one per row)
    int ncols;           // valid columns in this group (<= NR*16)
    int64_t pf_next;     // GEMV: bytes to the same k of the next panel group (0 = none)
    const float* wdec;   // the group's weights decoded once for its row chunks (PanelPredecode), or null
};

using Fp8Fn = void (*)(const Fp8Args&);

// The column groups of the block being quantized: size 0 (no groups: the row's scale for
// every column), else G, the block's first column k0 in the row, and each row's group
// exponents (row r, group i at e[r * ld + i]).
struct Fp8Groups {
    int size;
    int k0;
    const uint8_t* e;
    int64_t ld;
};

constexpr int kGroupExpMax = 64;  // E4M3 values times 2^-64 stay normal in fp32 and bf16

inline float fp8_pow2_neg(int e) {  // 2^-e for 0 <= e <= 126
    const uint32_t b = uint32_t(127 - e) << 23;
    float f;
    __builtin_memcpy(&f, &b, 4);
    return f;
}

// Segments [a, b) of columns 0..kc-1 of row r that share one scale: f(a, b, s_seg, 2^-e),
// s_seg = s * 2^-e in fp32 (exact unless it underflows, as in the reference).
template <class F>
inline void fp8_segments(const Fp8Groups& g, int r, int kc, float s, F&& f) {
    if (g.size == 0) {
        f(0, kc, s, 1.0f);
        return;
    }
    for (int a = 0; a < kc;) {
        const int gi = (g.k0 + a) / g.size;
        const int b = drv_min(kc, (gi + 1) * g.size - g.k0);
        const float p = fp8_pow2_neg(g.e[r * g.ld + gi]);
        f(a, b, s * p, p);
        a = b;
    }
}

// frexp's exponent of v > 0 (v = m * 2^exp, m in [0.5, 1)) and m's fraction bits, from the
// fp32 bits (subnormals scaled by 2^64 first): comparing (exp, bits) compares the values.
inline int fp8_frexp(float v, uint32_t* frac) {
    uint32_t b;
    __builtin_memcpy(&b, &v, 4);
    int bias = 126;
    if ((b >> 23) == 0) {
        v *= 18446744073709551616.0f;  // 2^64
        __builtin_memcpy(&b, &v, 4);
        bias += 64;
    }
    *frac = b & 0x7FFFFFu;
    return int(b >> 23) - bias;
}

// e[r * ld + i] = the largest e in [0, kGroupExpMax] with max|x[r, group i]| * 2^e <=
// max|x[r]| (0 for an all-zero group), for rows of K columns in groups of G. Scalar: one
// pass over the row per linear, small next to the weights it multiplies.
inline void fp8_group_exponents(const float* x, int64_t ldx, int rows, int K, int G, uint8_t* e, int64_t ld) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + r * ldx;
        float ar = 0.0f;
        for (int k = 0; k < K; ++k) ar = __builtin_fmaxf(ar, __builtin_fabsf(xr[k]));
        uint32_t fr = 0;
        const int er = ar > 0.0f ? fp8_frexp(ar, &fr) : 0;
        for (int i = 0, k0 = 0; k0 < K; ++i, k0 += G) {
            float ag = 0.0f;
            for (int k = k0; k < drv_min(K, k0 + G); ++k) ag = __builtin_fmaxf(ag, __builtin_fabsf(xr[k]));
            int v = 0;
            if (ag > 0.0f) {
                uint32_t fg;
                const int eg = fp8_frexp(ag, &fg);
                v = drv_min(kGroupExpMax, drv_max(0, er - eg - (fg > fr ? 1 : 0)));
            }
            e[r * ld + i] = uint8_t(v);
        }
    }
}

// Quantizes rows x (row stride ldx) of kc columns to E4M3 values of x / s[r] (per group:
// x / (s[r] * 2^-e), stored times 2^-e) into out (row stride ldq elements), zero-padding
// columns kc..ldq-1.
using Fp8QuantFn = void (*)(const float* x, int64_t ldx, int rows, int kc, const float* s, const Fp8Groups& g,
                            char* out, int64_t ldq);
// max |x| of each of `rows` rows of K columns -> s[r] = max / 448 (1 for an all-zero row):
// the per-token scale of linear_fp8@2, in fp32 like quantization/fp8.py's token_scales.
using Fp8RowScaleFn = void (*)(const float* x, int64_t ldx, int rows, int K, float* s);

struct Fp8Family {
    int MR;
    const float* x;
    int64_t ldx;
    const uint8_t* w;
    const float* ws;
    float xs;                  // the static scale (row_scales null)
    Fp8RowScaleFn row_scales;  // dynamic per-token scales, or null
    int K;
    const float* bias;
    float* y;
    int64_t ldy;
    const Fp8Fn* table;  // table[mr * tstride + nr]
    int tstride;
    Fp8QuantFn quantize;
    int esize;  // bytes per quantized activation (4 fp32, 2 bf16)
    int act_group;  // G (dynamic scales only), 0: none
    PanelPredecode pre;  // decode null: the microkernels decode the weights in registers
    int ldq = 0;

    struct Thread {
        Fp8Args a;
        char* xq;
        float* rs;    // activation scale of each row of the row block
        uint8_t* ge;  // group exponents of the row block's rows (ngroups() per row)
        float* wdec;  // decoded weights of one group (PanelPredecode::buffer), or null
        int m_blk, p0, rows;
    };

    int ngroups() const { return act_group ? (K + act_group - 1) / act_group : 0; }

    LinearBlocks blocks(bool) {
        // K blocks: 512 for K > 1024 (as the quantized linear@1 kernels, GEMV too), and small
        // enough that MR rows of quantized activations fit the buffer. A later block resumes
        // the partial sums in y at an even k (the bf16 kernel's pairs), so the results do not
        // depend on the blocking.
        const int kc_cap = (kXqBytes / (MR * esize)) & ~1;
        int nkb = K > 1024 ? (K + 511) / 512 : 1;
        if ((K + nkb - 1) / nkb > kc_cap) nkb = (K + kc_cap - 1) / kc_cap;
        int kc = (K + nkb - 1) / nkb;
        kc += kc & 1;  // even, so only the last block may have an odd tail
        nkb = (K + kc - 1) / kc;
        ldq = kc;
        return {nkb, kc, drv_max(MR, drv_min(kXqBytes / (ldq * esize), (384 * 1024 / 4) / kc) / MR * MR)};
    }
    int64_t rs_bytes(int rows) const { return (int64_t(rows) * 4 + 63) / 64 * 64; }
    int64_t ge_bytes(int rows) const { return (int64_t(rows) * ngroups() + 63) / 64 * 64; }
    int64_t thread_bytes(int rows) const {
        return kXqBytes + rs_bytes(rows) + ge_bytes(rows) + pre.thread_bytes(rows);
    }
    void begin(Thread& t, const LinearWork& w, char* buf, int rows) const {
        t.xq = buf;
        t.rs = reinterpret_cast<float*>(buf + kXqBytes);
        t.ge = reinterpret_cast<uint8_t*>(buf + kXqBytes + rs_bytes(rows));
        t.wdec = pre.buffer(w, buf + kXqBytes + rs_bytes(rows) + ge_bytes(rows), rows);
        t.a.wdec = nullptr;
        if (!row_scales)
            for (int r = 0; r < rows; ++r) t.rs[r] = xs;
        t.a.ldq = ldq;
        t.a.pstride = int64_t(K) * 16;
        t.a.ldy = ldy;
        t.a.pf_next = w.gemv ? int64_t(w.NR) * t.a.pstride : 0;
    }
    void block(Thread& t, int m_blk, int rows, int k0, int kc, int kb) const {
        if (row_scales && kb == 0) {
            row_scales(x + m_blk * ldx, ldx, rows, K, t.rs);
            if (act_group) fp8_group_exponents(x + m_blk * ldx, ldx, rows, K, act_group, t.ge, ngroups());
        }
        const Fp8Groups g{row_scales ? act_group : 0, k0, t.ge, ngroups()};
        quantize(x + m_blk * ldx + k0, ldx, rows, kc, t.rs, g, t.xq, ldq);
        t.a.kc = kc;
        t.a.accumulate = kb > 0;
        t.m_blk = m_blk;
        t.rows = rows;
    }
    void group(Thread& t, int p0, int ncols, int k0, bool last) const {
        t.a.ncols = ncols;
        t.a.w = w + (int64_t(p0) * K + k0) * 16;
        t.a.bias = (bias && last) ? bias + 16 * p0 : nullptr;
        t.a.last = last;
        t.a.ws = ws + 16 * p0;
        t.p0 = p0;
        t.a.wdec = pre.group(t.wdec, t.a.w, t.a.pstride, t.rows, t.a.kc);
    }
    void rows(Thread& t, int m0, int mr, int nr) const {
        t.a.xq = t.xq + int64_t(m0 - t.m_blk) * ldq * esize;
        t.a.xs = t.rs + (m0 - t.m_blk);
        t.a.y = y + m0 * ldy + 16 * t.p0;
        table[mr * tstride + nr](t.a);
    }
};

// table[mr * tstride + nr]; esize: bytes per quantized activation (4 fp32, 2 bf16);
// row_scales null: the static scale xs for every row, else dynamic per-token scales, refined
// per group of act_group columns when act_group > 0.
inline void linear_fp8_drive(const float* x, int64_t ldx, int M, const uint8_t* w, const float* ws, float xs,
                             Fp8RowScaleFn row_scales, int act_group, int N, int K, const float* bias, float* y,
                             int64_t ldy, int nthreads, int MR, int NR, const Fp8Fn* table, int tstride,
                             Fp8QuantFn quantize, int esize, PanelDecodeFn decode = nullptr) {
    Fp8Family f{MR, x, ldx, w, ws, xs, row_scales, K, bias, y, ldy, table, tstride, quantize, esize, act_group,
                {decode, MR}};
    linear_drive_family(f, M, N, K, NR, nthreads);
}

}  // namespace
}  // namespace bessemer
