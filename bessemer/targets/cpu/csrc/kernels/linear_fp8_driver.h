// Blocking/threading driver of linear_fp8@1, shared by its AVX2 (linear_fp8.cpp) and
// AVX-512 BF16 (linear_fp8_avx512.cpp) kernels. Included by both; internal linkage and no
// C++ standard library, so each file gets its own copy compiled for its own ISA.
//
// The scheme is linear_driver.h's (threads split panel groups, or rows when groups split
// unevenly; row blocks of Mc, K blocks of kc, groups, MR-row chunks) with one addition:
// the activations are quantized to E4M3 (x / s_x, rounded, saturated) once per thread,
// row block and K block, into a buffer on the thread's stack (kXqBytes), so the
// microkernels read E4M3 values (as fp32 or bf16) and never requantize x per panel group.
// The buffer bounds the blocks: Mc * kc_pad * esize <= kXqBytes, kc_pad = kc rounded up
// to an even count (the bf16 kernel reads k in pairs; the pad is zero).
#pragma once

#include <omp.h>
#include <stdint.h>

namespace bessemer {
namespace {

constexpr int kXqBytes = 96 * 1024;  // per-thread quantized-activation block (stack)

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
    float xs;            // activation scale s_x
    int ncols;           // valid columns in this group (<= NR*16)
    int64_t pf_next;     // GEMV: bytes to the same k of the next panel group (0 = none)
};

using Fp8Fn = void (*)(const Fp8Args&);
// Quantizes rows x (row stride ldx) of kc columns to E4M3 values of x / s into out
// (row stride ldq elements), zero-padding columns kc..ldq-1.
using Fp8QuantFn = void (*)(const float* x, int64_t ldx, int rows, int kc, float s, char* out, int64_t ldq);

inline int fp8_min(int a, int b) { return a < b ? a : b; }
inline int fp8_max(int a, int b) { return a > b ? a : b; }

// table[mr * tstride + nr]; esize: bytes per quantized activation (4 fp32, 2 bf16).
inline void linear_fp8_drive(const float* x, int64_t ldx, int M, const uint8_t* w, const float* ws, float xs,
                             int N, int K, const float* bias, float* y, int64_t ldy, int nthreads, int MR, int NR,
                             const Fp8Fn* table, int tstride, Fp8QuantFn quantize, int esize) {
    const int P = (N + 15) / 16;
    const int64_t pstride = int64_t(K) * 16;
    const bool gemv = M <= MR;
    if (gemv && nthreads > 1)
        for (int nr = NR; nr >= 1; --nr) {
            const int g = (P + nr - 1) / nr;
            if (g % nthreads == 0 || g >= 8 * nthreads) {
                NR = nr;
                break;
            }
        }
    const int G = (P + NR - 1) / NR;
    // K blocks: 512 for a GEMM with K > 1024 (as linear@1), and small enough that MR rows
    // of quantized activations fit the stack buffer.
    const int kc_cap = (kXqBytes / (MR * esize)) & ~1;
    int nkb = (!gemv && K > 1024) ? (K + 511) / 512 : 1;
    if ((K + nkb - 1) / nkb > kc_cap) nkb = (K + kc_cap - 1) / kc_cap;
    int kc = (K + nkb - 1) / nkb;
    kc += kc & 1;  // even, so only the last block may have an odd tail
    nkb = (K + kc - 1) / kc;
    const int ldq = kc;
    const int Mc = fp8_max(MR, fp8_min(kXqBytes / (ldq * esize), (384 * 1024 / 4) / kc) / MR * MR);
    const bool par = nthreads > 1 && double(M) * N * K >= 2e5 && (G > 1 || M > MR);
    const int T = par ? nthreads : 1;
    bool split_rows = false;
    if (T > 1) {
        if (G < T) split_rows = M >= 2 * MR * T;
        else if (G % T != 0 && G < 8 * T) split_rows = M >= 4 * MR * T;
    }
#pragma omp parallel num_threads(T) if (T > 1)
    {
        alignas(64) char xq[kXqBytes];
        const int tid = T > 1 ? omp_get_thread_num() : 0;
        int ga = 0, gb = G, ma = 0, mb = M;
        if (T > 1) {
            if (split_rows) {
                const int chunks = (M + MR - 1) / MR;
                ma = fp8_min(M, int(int64_t(chunks) * tid / T) * MR);
                mb = fp8_min(M, int(int64_t(chunks) * (tid + 1) / T) * MR);
            } else {
                ga = int(int64_t(G) * tid / T);
                gb = int(int64_t(G) * (tid + 1) / T);
            }
        }
        Fp8Args a;
        a.ldq = ldq;
        a.pstride = pstride;
        a.ldy = ldy;
        a.xs = xs;
        a.pf_next = gemv ? int64_t(NR) * pstride : 0;
        for (int m_blk = ma; m_blk < mb; m_blk += Mc) {
            const int m_end = fp8_min(mb, m_blk + Mc);
            for (int kb = 0; kb < nkb; ++kb) {
                const int k0 = kb * kc, kcur = fp8_min(kc, K - k0);
                quantize(x + m_blk * ldx + k0, ldx, m_end - m_blk, kcur, xs, xq, ldq);
                a.kc = kcur;
                a.accumulate = kb > 0;
                for (int g = ga; g < gb; ++g) {
                    const int p0 = g * NR, nr = fp8_min(NR, P - p0);
                    a.ncols = fp8_min(N - 16 * p0, nr * 16);
                    a.w = w + (int64_t(p0) * K + k0) * 16;
                    a.bias = (bias && kb == nkb - 1) ? bias + 16 * p0 : nullptr;
                    a.ws = ws + 16 * p0;
                    for (int m0 = m_blk; m0 < m_end; m0 += MR) {
                        const int mr = fp8_min(MR, m_end - m0);
                        a.xq = xq + int64_t(m0 - m_blk) * ldq * esize;
                        a.y = y + m0 * ldy + 16 * p0;
                        table[mr * tstride + nr](a);
                    }
                }
            }
        }
    }
}

}  // namespace
}  // namespace bessemer
