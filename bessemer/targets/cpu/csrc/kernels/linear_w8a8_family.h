// linear_w8a8@1's kernel family for the one linear driver (linear_driver.h), shared by the
// AVX2 (linear_w8a8.cpp) and the AVX-512 VNNI (linear_w8a8_avx512.cpp) kernels. Internal
// linkage and no C++ standard library, so each file gets its own copy compiled for its ISA.
//
// K is not blocked: a thread quantizes each row block's activations to int8 (per token,
// dynamic; quant_rows) over the whole K into its buffer (Mc x Kp bytes, then Mc scales),
// then runs every one of its panel groups over the block, so a group's weights (Kp x NR*16
// bytes) stay in L1/L2 across the block's rows. Every thread quantizes the rows it needs
// itself (with a column split, all of them): the cost is ~K operations per row against
// K*N/T multiply-adds of the GEMM, and it needs no shared workspace or barrier.
#pragma once

#include "linear_driver.h"

namespace bessemer {
namespace {

struct W8A8Args {
    int kq;               // K / 4 rounded up (4-byte k groups)
    const int8_t* xq;     // quantized rows (row r at xq + r * ldq), u8 or s8 per ISA
    int64_t ldq;          // = 4 * kq
    const float* xs;      // per-row activation scales
    const int8_t* w;      // panel p0 (vnni16)
    int64_t pstride;      // bytes between panels (= 64 * kq)
    const float* ws;      // weight scales + 16*p0
    const int32_t* wsum;  // sum_k w[n, k] + 16*p0
    const float* bias;    // bias + 16*p0, or null
    float* y;             // row m0, column 16*p0
    int64_t ldy;
    int ncols;            // valid columns in this group (<= NR*16)
    // Bytes from a weight to the same k of the next panel group, or 0: the microkernel
    // prefetches there (into L2). Without it the hardware prefetcher does not run far enough
    // ahead of a DRAM weight stream for the dot products to overlap the loads (measured, one
    // thread, 1536 x 576 weights from DRAM: M = 1, 4, 8, 16 took 51, 64, 78, 113 us, about
    // the load time plus the hot-cache compute time; prefetched 43, 44, 40, 75 us; two groups
    // ahead was no better). Set for a group's first row chunk of a row block only: the later
    // chunks find the group's weights in cache. Past the last group it points beyond the
    // weights, which a prefetch may: it never faults.
    int64_t pf_next;
};

using W8A8Uk = void (*)(const W8A8Args&);
// rows x (row stride ldx) [+ smooth multiplier] -> q (row stride ldq, K..ldq padded), scale
using QuantRowsFn = void (*)(const float* x, int64_t ldx, int rows, int K, int64_t ldq,
                             const float* smooth, int8_t* q, float* scale);

struct W8A8Family {
    int MR;
    const float* x;
    int64_t ldx;
    const int8_t* w;
    const float* ws;
    const int32_t* wsum;
    const float* smooth;
    int K;
    const float* bias;
    float* y;
    int64_t ldy;
    const W8A8Uk* table;  // table[mr * tstride + nr]
    int tstride;
    QuantRowsFn quant_rows;
    int kq = 0;
    int64_t ldq = 0;

    struct Thread {
        W8A8Args a;
        int8_t* qbuf;  // rows x ldq codes
        float* sbuf;   // then rows scales
        int m_blk, p0;
        int64_t pf_group;  // bytes from a panel group to the next
    };

    LinearBlocks blocks(bool) {
        kq = (K + 3) / 4;
        ldq = int64_t(kq) * 4;
        // Row block: about 128 KiB of quantized activations (L2), a multiple of MR, <= 256 rows.
        return {1, K, drv_max(MR, drv_min(256, int((128 * 1024) / ldq)) / MR * MR)};
    }
    int64_t thread_bytes(int rows_max) const { return int64_t(rows_max) * (ldq + 4); }
    void begin(Thread& t, const LinearWork& w, char* buf, int rows_max) const {
        t.qbuf = reinterpret_cast<int8_t*>(buf);
        t.sbuf = reinterpret_cast<float*>(t.qbuf + size_t(rows_max) * ldq);
        t.a.kq = kq;
        t.a.ldq = ldq;
        t.a.pstride = int64_t(kq) * 64;
        t.a.ldy = ldy;
        t.pf_group = int64_t(w.NR) * t.a.pstride;
    }
    void block(Thread& t, int m_blk, int rows, int, int, int) const {
        quant_rows(x + int64_t(m_blk) * ldx, ldx, rows, K, ldq, smooth, t.qbuf, t.sbuf);
        t.m_blk = m_blk;
    }
    void group(Thread& t, int p0, int ncols, int, bool) const {
        t.a.ncols = ncols;
        t.a.w = w + int64_t(p0) * t.a.pstride;
        t.a.ws = ws + 16 * p0;
        t.a.wsum = wsum + 16 * p0;
        t.a.bias = bias ? bias + 16 * p0 : nullptr;
        t.p0 = p0;
    }
    void rows(Thread& t, int m0, int mr, int nr) const {
        t.a.xq = t.qbuf + int64_t(m0 - t.m_blk) * ldq;
        t.a.xs = t.sbuf + (m0 - t.m_blk);
        t.a.y = y + int64_t(m0) * ldy + 16 * t.p0;
        t.a.pf_next = m0 == t.m_blk ? t.pf_group : 0;
        table[mr * tstride + nr](t.a);
    }
};

// table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR.
inline void linear_w8a8_drive(const float* x, int64_t ldx, int M, const int8_t* w, const float* ws,
                              const int32_t* wsum, const float* smooth, int N, int K, const float* bias,
                              float* y, int64_t ldy, int nthreads, int MR, int NR, const W8A8Uk* table,
                              int tstride, QuantRowsFn quant_rows) {
    W8A8Family f{MR, x, ldx, w, ws, wsum, smooth, K, bias, y, ldy, table, tstride, quant_rows};
    linear_drive_family(f, M, N, K, NR, nthreads);
}

}  // namespace
}  // namespace bessemer
