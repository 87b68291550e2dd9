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
    bool accumulate;     // add to y (not the first K block)
    const float* bias;   // bias + 16*p0 on the last K block, else null
    const float* ws;     // weight scales + 16*p0
    const float* xs;     // activation scales s_x of rows m0.. (one per row)
    int ncols;           // valid columns in this group (<= NR*16)
    int64_t pf_next;     // GEMV: bytes to the same k of the next panel group (0 = none)
};

using Fp8Fn = void (*)(const Fp8Args&);
// Quantizes rows x (row stride ldx) of kc columns to E4M3 values of x / s[r] into out
// (row stride ldq elements), zero-padding columns kc..ldq-1.
using Fp8QuantFn = void (*)(const float* x, int64_t ldx, int rows, int kc, const float* s, char* out, int64_t ldq);
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
    int ldq = 0;

    struct Thread {
        Fp8Args a;
        char* xq;
        float* rs;  // activation scale of each row of the row block
        int m_blk, p0;
    };

    LinearBlocks blocks() {
        // K blocks: 512 for K > 1024 (as linear@1, whatever M), and small enough that MR rows
        // of quantized activations fit the buffer.
        const int kc_cap = (kXqBytes / (MR * esize)) & ~1;
        int nkb = K > 1024 ? (K + 511) / 512 : 1;
        if ((K + nkb - 1) / nkb > kc_cap) nkb = (K + kc_cap - 1) / kc_cap;
        int kc = (K + nkb - 1) / nkb;
        kc += kc & 1;  // even, so only the last block may have an odd tail
        nkb = (K + kc - 1) / kc;
        ldq = kc;
        return {nkb, kc, drv_max(MR, drv_min(kXqBytes / (ldq * esize), (384 * 1024 / 4) / kc) / MR * MR)};
    }
    int64_t thread_bytes(int rows) const { return kXqBytes + (int64_t(rows) * 4 + 63) / 64 * 64; }
    void begin(Thread& t, const LinearWork& w, char* buf, int rows) const {
        t.xq = buf;
        t.rs = reinterpret_cast<float*>(buf + kXqBytes);
        if (!row_scales)
            for (int r = 0; r < rows; ++r) t.rs[r] = xs;
        t.a.ldq = ldq;
        t.a.pstride = int64_t(K) * 16;
        t.a.ldy = ldy;
        t.a.pf_next = w.gemv ? int64_t(w.NR) * t.a.pstride : 0;
    }
    void block(Thread& t, int m_blk, int rows, int k0, int kc, int kb) const {
        if (row_scales && kb == 0) row_scales(x + m_blk * ldx, ldx, rows, K, t.rs);
        quantize(x + m_blk * ldx + k0, ldx, rows, kc, t.rs, t.xq, ldq);
        t.a.kc = kc;
        t.a.accumulate = kb > 0;
        t.m_blk = m_blk;
    }
    void group(Thread& t, int p0, int ncols, int k0, bool last) const {
        t.a.ncols = ncols;
        t.a.w = w + (int64_t(p0) * K + k0) * 16;
        t.a.bias = (bias && last) ? bias + 16 * p0 : nullptr;
        t.a.ws = ws + 16 * p0;
        t.p0 = p0;
    }
    void rows(Thread& t, int m0, int mr, int nr) const {
        t.a.xq = t.xq + int64_t(m0 - t.m_blk) * ldq * esize;
        t.a.xs = t.rs + (m0 - t.m_blk);
        t.a.y = y + m0 * ldy + 16 * t.p0;
        table[mr * tstride + nr](t.a);
    }
};

// table[mr * tstride + nr]; esize: bytes per quantized activation (4 fp32, 2 bf16);
// row_scales null: the static scale xs for every row, else dynamic per-token scales.
inline void linear_fp8_drive(const float* x, int64_t ldx, int M, const uint8_t* w, const float* ws, float xs,
                             Fp8RowScaleFn row_scales, int N, int K, const float* bias, float* y, int64_t ldy,
                             int nthreads, int MR, int NR, const Fp8Fn* table, int tstride, Fp8QuantFn quantize,
                             int esize) {
    Fp8Family f{MR, x, ldx, w, ws, xs, row_scales, K, bias, y, ldy, table, tstride, quantize, esize};
    linear_drive_family(f, M, N, K, NR, nthreads);
}

}  // namespace
}  // namespace bessemer
