// linear_w4a8@1's kernel family for the one linear driver (linear_driver.h), shared by the
// AVX2 (linear_w4a8.cpp) and the AVX-512 VNNI (linear_w4a8_avx512.cpp) kernels. Internal
// linkage and no C++ standard library, so each file gets its own copy compiled for its ISA.
//
// As linear_w8a8_family.h: K is not blocked; a thread quantizes each row block's
// activations over the whole K into its buffer (Mc x K int8 codes, then Mc x ng scales,
// then Mc x ng int32 corrections), then runs each of its panel groups over the block. The
// quantization is row-local (quant_rows_w4a8, one function for both ISAs), so a row's
// codes never depend on the other rows of the call.
#pragma once

#include "linear_driver.h"

namespace bessemer {

// Per row r of x (row stride ldx), per group g of G columns (G a multiple of 8, K = ng*G):
// amax = max|x[r, g*G:(g+1)*G]|; xs[r*ng+g] = amax / 127 (1 when amax == 0);
// codes c = clamp(rint(x * (127 / amax)), -127, 127) (0 when amax == 0), stored at
// q + r*K in each 8-column block's order [0, 4, 1, 5, 2, 6, 3, 7] (the k order of the
// panel16_int4_k8 codes' nibbles: dword A pairs with the low nibbles, B with the high);
// xc[r*ng+g] = 8 * sum of the group's codes (the codes' -8 offset, applied in int32).
// AVX2 (the baseline), called by both ISAs' kernels: their activations are identical.
void quant_rows_w4a8(const float* x, int64_t ldx, int rows, int K, int G, int8_t* q, float* xs, int32_t* xc);

namespace {

struct W4A8Args {
    int ng, G;            // groups over K, columns per group
    const int8_t* xq;     // quantized row m0 (row r at xq + r * K)
    int64_t ldq;          // = K
    const float* xs;      // its per-group scales (row r at xs + r * ng)
    const int32_t* xc;    // its per-group corrections 8 * sum(codes)
    const uint8_t* w;     // panel p0 (panel16_int4_k8: K/8 blocks of 64 bytes)
    int64_t pstride;      // bytes between panels (= 8 * K)
    const float* ws;      // fp32 panel16 [N, ng] weight scales of panel p0
    int64_t qpstride;     // floats between panels of ws (= 16 * ng)
    const float* bias;    // bias + 16*p0, or null
    float* y;             // row m0, column 16*p0
    int64_t ldy;
    int ncols;            // valid columns in this group (<= NR*16)
};

using W4A8Uk = void (*)(const W4A8Args&);

struct W4A8Family {
    int MR;
    const float* x;
    int64_t ldx;
    const uint8_t* w;
    const float* ws;
    int K, G;
    const float* bias;
    float* y;
    int64_t ldy;
    const W4A8Uk* table;  // table[mr * tstride + nr]
    int tstride;
    int ng = 0;

    struct Thread {
        W4A8Args a;
        int8_t* qbuf;    // rows x K codes
        float* sbuf;     // rows x ng scales
        int32_t* cbuf;   // rows x ng corrections
        int m_blk, p0;
    };

    LinearBlocks blocks(bool) {
        ng = K / G;
        // Row block: about 128 KiB of quantized activations (L2), a multiple of MR, <= 256 rows.
        return {1, K, drv_max(MR, drv_min(256, int((128 * 1024) / (K + 8 * ng))) / MR * MR)};
    }
    int64_t thread_bytes(int rows_max) const { return int64_t(rows_max) * (K + 8 * ng); }
    void begin(Thread& t, const LinearWork&, char* buf, int rows_max) const {
        t.qbuf = reinterpret_cast<int8_t*>(buf);  // K is a multiple of 8: the floats stay aligned
        t.sbuf = reinterpret_cast<float*>(t.qbuf + int64_t(rows_max) * K);
        t.cbuf = reinterpret_cast<int32_t*>(t.sbuf + int64_t(rows_max) * ng);
        t.a.ng = ng;
        t.a.G = G;
        t.a.ldq = K;
        t.a.pstride = int64_t(K) * 8;
        t.a.qpstride = int64_t(ng) * 16;
        t.a.ldy = ldy;
    }
    void block(Thread& t, int m_blk, int rows, int, int, int) const {
        quant_rows_w4a8(x + int64_t(m_blk) * ldx, ldx, rows, K, G, t.qbuf, t.sbuf, t.cbuf);
        t.m_blk = m_blk;
    }
    void group(Thread& t, int p0, int ncols, int, bool) const {
        t.a.ncols = ncols;
        t.a.w = w + int64_t(p0) * t.a.pstride;
        t.a.ws = ws + int64_t(p0) * t.a.qpstride;
        t.a.bias = bias ? bias + 16 * p0 : nullptr;
        t.p0 = p0;
    }
    void rows(Thread& t, int m0, int mr, int nr) const {
        const int r = m0 - t.m_blk;
        t.a.xq = t.qbuf + int64_t(r) * K;
        t.a.xs = t.sbuf + int64_t(r) * ng;
        t.a.xc = t.cbuf + int64_t(r) * ng;
        t.a.y = y + int64_t(m0) * ldy + 16 * t.p0;
        table[mr * tstride + nr](t.a);
    }
};

// table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR.
inline void linear_w4a8_drive(const float* x, int64_t ldx, int M, const uint8_t* w, const float* ws, int G,
                              int N, int K, const float* bias, float* y, int64_t ldy, int nthreads, int MR, int NR,
                              const W4A8Uk* table, int tstride) {
    W4A8Family f{MR, x, ldx, w, ws, K, G, bias, y, ldy, table, tstride};
    linear_drive_family(f, M, N, K, NR, nthreads);
}

}  // namespace
}  // namespace bessemer
