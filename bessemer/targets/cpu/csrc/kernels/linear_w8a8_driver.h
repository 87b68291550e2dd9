// Blocking/threading driver of linear_w8a8@1, shared by the AVX2 (linear_w8a8.cpp) and the
// AVX-512 VNNI (linear_w8a8_avx512.cpp) kernels. Included by both; internal linkage and no
// C++ standard library, so each file gets its own copy compiled for its own ISA.
//
//   * threads split the panel groups (NR panels = NR*16 outputs) statically, or the rows
//     when there are fewer groups than threads and rows are plentiful;
//   * a thread walks row blocks of Mc rows: it quantizes the block's activations to int8
//     (per token, dynamic; quant_rows) into a stack buffer of Mc x Kp bytes, then for each
//     of its panel groups runs the MR-row microkernels over the block, so a group's
//     weights (Kp x NR*16 bytes) stay in L1/L2 across the block's rows;
//   * GEMV (M <= MR): one block of M rows; each weight byte is read once.
// Every thread quantizes the rows it needs itself (with a column split, all of them): the
// cost is ~K operations per row against K*N/T multiply-adds of the GEMM, and it needs no
// shared workspace or barrier.
#pragma once

#include <alloca.h>
#include <omp.h>
#include <stdint.h>

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
};

using W8A8Uk = void (*)(const W8A8Args&);
// rows x (row stride ldx) [+ smooth multiplier] -> q (row stride ldq, K..ldq padded), scale
using QuantRowsFn = void (*)(const float* x, int64_t ldx, int rows, int K, int64_t ldq,
                             const float* smooth, int8_t* q, float* scale);

inline int w8_min(int a, int b) { return a < b ? a : b; }
inline int w8_max(int a, int b) { return a > b ? a : b; }

// table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR.
inline void linear_w8a8_drive(const float* x, int64_t ldx, int M, const int8_t* w, const float* ws,
                              const int32_t* wsum, const float* smooth, int N, int K, const float* bias,
                              float* y, int64_t ldy, int nthreads, int MR, int NR, const W8A8Uk* table,
                              int tstride, QuantRowsFn quant_rows) {
    const int P = (N + 15) / 16;
    const int kq = (K + 3) / 4;
    const int64_t ldq = int64_t(kq) * 4;
    const int64_t pstride = int64_t(kq) * 64;
    const bool gemv = M <= MR;
    if (gemv && nthreads > 1)  // memory bound: a group width that splits evenly over threads
        for (int nr = NR; nr >= 1; --nr) {
            const int g = (P + nr - 1) / nr;
            if (g % nthreads == 0 || g >= 8 * nthreads) {
                NR = nr;
                break;
            }
        }
    const int G = (P + NR - 1) / NR;
    // Row block: about 128 KiB of quantized activations (L2), a multiple of MR, <= 256 rows.
    const int Mc = w8_max(MR, w8_min(256, int((128 * 1024) / ldq)) / MR * MR);
    const bool par = nthreads > 1 && double(M) * N * K >= 2e5 && (G > 1 || M > MR);
    const int T = par ? nthreads : 1;
    bool split_rows = false;
    if (T > 1) {
        if (G < T) split_rows = M >= 2 * MR * T;
        else if (G % T != 0 && G < 8 * T) split_rows = M >= 4 * MR * T;
    }
#pragma omp parallel num_threads(T) if (T > 1)
    {
        const int tid = T > 1 ? omp_get_thread_num() : 0;
        int ga = 0, gb = G, ma = 0, mb = M;
        if (T > 1) {
            if (split_rows) {
                const int chunks = (M + MR - 1) / MR;
                ma = w8_min(M, int(int64_t(chunks) * tid / T) * MR);
                mb = w8_min(M, int(int64_t(chunks) * (tid + 1) / T) * MR);
            } else {
                ga = int(int64_t(G) * tid / T);
                gb = int(int64_t(G) * (tid + 1) / T);
            }
        }
        const int rows_max = w8_min(Mc, w8_max(mb - ma, 1));
        // 64-byte aligned stack block: rows_max x ldq codes, then rows_max scales
        char* raw = static_cast<char*>(alloca(size_t(rows_max) * (ldq + 4) + 128));
        int8_t* qbuf = reinterpret_cast<int8_t*>((reinterpret_cast<uintptr_t>(raw) + 63) & ~uintptr_t(63));
        float* sbuf = reinterpret_cast<float*>(qbuf + size_t(rows_max) * ldq);
        W8A8Args a;
        a.kq = kq;
        a.ldq = ldq;
        a.pstride = pstride;
        a.ldy = ldy;
        for (int m_blk = ma; m_blk < mb; m_blk += Mc) {
            const int m_end = w8_min(mb, m_blk + Mc);
            quant_rows(x + int64_t(m_blk) * ldx, ldx, m_end - m_blk, K, ldq, smooth, qbuf, sbuf);
            for (int g = ga; g < gb; ++g) {
                const int p0 = g * NR, nr = w8_min(NR, P - p0);
                a.ncols = w8_min(N - 16 * p0, nr * 16);
                a.w = w + int64_t(p0) * pstride;
                a.ws = ws + 16 * p0;
                a.wsum = wsum + 16 * p0;
                a.bias = bias ? bias + 16 * p0 : nullptr;
                for (int m0 = m_blk; m0 < m_end; m0 += MR) {
                    const int mr = w8_min(MR, m_end - m0);
                    a.xq = qbuf + int64_t(m0 - m_blk) * ldq;
                    a.xs = sbuf + (m0 - m_blk);
                    a.y = y + int64_t(m0) * ldy + 16 * p0;
                    table[mr * tstride + nr](a);
                }
            }
        }
    }
}

}  // namespace
}  // namespace bessemer
