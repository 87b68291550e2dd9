// Blocking/threading driver shared by the AVX2 (linear.cpp) and AVX-512 (linear_avx512.cpp)
// linear kernels. Included by both; everything here has internal linkage and uses no C++
// standard library, so each file gets its own copy compiled for its own ISA.
//
// Scheme (GotoBLAS-like, without packing: panel16 weights are already "packed"):
//   * threads split the panel groups (NR panels = NR*16 outputs each) statically, so each
//     thread streams a disjoint slice of the weights; when there are too few groups for an
//     even split and many rows, threads split the rows instead;
//   * a thread walks row blocks of Mc rows, then K blocks of kc, then its panel groups, then
//     MR-row chunks: the x block (Mc x kc) stays in L2 while every group of the thread uses
//     it, and a group's weights (kc x NR*16) stay in L1/L2 across the MR-row chunks;
//   * GEMV (M <= MR): one row block and one K block; each weight byte is read exactly once.
//
// The same driver runs the quantized linears (linear_quant*.cpp): a weight format is only
// "kbytes" (bytes per panel and k: 64 fp32, 32 bf16, 16 int8, 8 int4) plus optional
// quantization parameters, which the driver offsets to the panel group / K block it hands
// to the microkernel. Group-wise parameters force K blocks to whole groups.
#pragma once

#include <omp.h>
#include <stdint.h>

namespace bessemer {
namespace {

struct UkArgs {
    int kc;
    const float* x;
    int64_t ldx;
    const char* w;    // panel p0 at k0
    int64_t pstride;  // bytes between panels
    float* y;         // row m0, column 16*p0
    int64_t ldy;
    bool accumulate;
    const float* bias;  // bias + 16*p0, or null
    int ncols;          // valid columns in this group (<= NR*16)
    // Quantization parameters (null for fp32/bf16 weights):
    //   per channel (group == 0): qs = scales + 16*p0 ([N] row_major), qo unused;
    //   group-wise (group > 0):   qs/qo = scales/offsets of panel p0 at group k0/group
    //                             (panel16 [N, K/group]); panel n's at qs + n*qpstride.
    const float* qs;
    const float* qo;
    int64_t qpstride;  // elements between panels of qs/qo (group-wise)
    int group;         // K columns per group (kc is a multiple of it), 0 = per channel
    int pbytes;        // bytes per element of qs/qo: 4 fp32, 2 bf16 (then qs/qo point to bf16)
    // GEMV: bytes from a weight to the same k of the next panel group (0 = none). A
    // compute-heavy (quantized) microkernel prefetches there, and the next group's
    // quantization parameters (at qs/qo + NR*qpstride, or qs + NR*16 per channel): the
    // hardware prefetcher follows the current panels' code streams but neither the jump
    // to the next group nor the sparse parameter reads at group ends.
    int64_t pf_next;
};

// Optional activation preparation (linear_w4a16@2): the x block of a thread's row block
// and K block (rows x kc, row stride ldx) is converted once into a stack buffer (row
// stride ldq elements of esize bytes, ldq = kc rounded up to even, the pad column zero),
// and the microkernels read it through UkArgs::x / ldx (a.x points into the buffer, to be
// cast to the element type; ldx is then in elements of esize bytes). Converting once per
// block instead of per panel group keeps the conversion off the weight stream.
using XPrepFn = void (*)(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq);
constexpr int kXPrepBytes = 128 * 1024;  // per-thread prepared-activation buffer (stack)

// Largest group size a prepared linear supports: MR (<= 8) rows of one group must fit.
constexpr int kXPrepMaxGroup = kXPrepBytes / (8 * 4);

// Quantization parameters of a linear (see UkArgs).
struct QuantParams {
    const float* scales;
    const float* offsets;
    int group;  // 0: per-channel scales [N] row_major; > 0: group-wise panel16 [N, K/group]
    int pbytes = 4;  // 2: group-wise scales/offsets are bf16 (only kernels that read bf16 get them)
};

// p advanced by n elements of pbytes bytes.
inline const float* param_at(const float* p, int64_t n, int pbytes) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(p) + n * pbytes);
}

using UkFn = void (*)(const UkArgs&);

inline int drv_min(int a, int b) { return a < b ? a : b; }
inline int drv_max(int a, int b) { return a > b ? a : b; }

// table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR; kbytes: weight bytes per panel and k;
// prep / esize: optional activation preparation (see XPrepFn; group <= kXPrepMaxGroup).
inline void linear_drive_q(const float* x, int64_t ldx, int M, const void* w, int kbytes, int N,
                           int K, const float* bias, float* y, int64_t ldy, int nthreads, int MR,
                           int NR, const UkFn* table, int tstride, const QuantParams* q,
                           XPrepFn prep = nullptr, int esize = 0) {
    const int P = (N + 15) / 16;
    const int64_t pstride = int64_t(K) * kbytes;
    const int group = q ? q->group : 0;
    const int64_t qpstride = group > 0 ? int64_t(K / group) * 16 : 0;
    const bool gemv = M <= MR;
    // GEMV is memory bound: prefer a panel-group width that splits evenly over threads
    // (e.g. N=576: 9 groups of 4 panels -> 12 groups of 3).
    if (gemv && nthreads > 1)
        for (int nr = NR; nr >= 1; --nr) {
            const int g = (P + nr - 1) / nr;
            if (g % nthreads == 0 || g >= 8 * nthreads) {
                NR = nr;
                break;
            }
        }
    const int G = (P + NR - 1) / NR;
    int nkb = (!gemv && K > 1024) ? (K + 511) / 512 : 1;
    int kc = (K + nkb - 1) / nkb;
    // A prepared linear's K block holds MR rows in the buffer: at most cap columns (whole
    // groups; one group always fits, group <= kXPrepMaxGroup).
    const int cap = prep ? (kXPrepBytes / (MR * esize)) & ~1 : K;
    if (kc > cap) {
        nkb = (K + cap - 1) / cap;
        kc = (K + nkb - 1) / nkb;
    }
    if (group > 0) {  // whole groups per K block
        kc = (kc + group - 1) / group * group;
        if (kc > cap) kc = drv_max(group, cap / group * group);
        nkb = (K + kc - 1) / kc;
    }
    const int ldq = (kc + 1) / 2 * 2;
    // Row block: x block of about 384 KiB (L2), a multiple of MR (and within the buffer).
    int Mc = (384 * 1024 / 4) / kc;
    if (prep) Mc = drv_min(Mc, kXPrepBytes / (ldq * esize));
    Mc = drv_max(MR, Mc / MR * MR);
    const bool par = nthreads > 1 && double(M) * N * K >= 2e5 && (G > 1 || M > MR);
    const int T = par ? nthreads : 1;
    // Thread grid: split groups, or rows when groups split unevenly and rows are plentiful.
    bool split_rows = false;
    if (T > 1) {
        if (G < T) split_rows = M >= 2 * MR * T;
        else if (G % T != 0 && G < 8 * T) split_rows = M >= 4 * MR * T;
    }
#pragma omp parallel num_threads(T) if (T > 1)
    {
        alignas(64) char xq[kXPrepBytes];  // prepared x block (stack: no allocation per call)
        const int tid = T > 1 ? omp_get_thread_num() : 0;
        int ga = 0, gb = G, ma = 0, mb = M;
        if (T > 1) {
            if (split_rows) {
                const int chunks = (M + MR - 1) / MR;
                ma = drv_min(M, int(int64_t(chunks) * tid / T) * MR);
                mb = drv_min(M, int(int64_t(chunks) * (tid + 1) / T) * MR);
            } else {
                ga = int(int64_t(G) * tid / T);
                gb = int(int64_t(G) * (tid + 1) / T);
            }
        }
        UkArgs a;
        a.ldx = ldx;
        a.pstride = pstride;
        a.ldy = ldy;
        a.qs = a.qo = nullptr;
        a.qpstride = qpstride;
        a.group = group;
        a.pbytes = q ? q->pbytes : 4;
        a.pf_next = gemv ? int64_t(NR) * pstride : 0;
        for (int m_blk = ma; m_blk < mb; m_blk += Mc) {
            const int m_end = drv_min(mb, m_blk + Mc);
            for (int kb = 0; kb < nkb; ++kb) {
                const int k0 = kb * kc, kcur = drv_min(kc, K - k0);
                if (prep) {
                    prep(x + int64_t(m_blk) * ldx + k0, ldx, m_end - m_blk, kcur, xq, ldq);
                    a.ldx = ldq;
                }
                a.kc = kcur;
                a.accumulate = kb > 0;
                for (int g = ga; g < gb; ++g) {
                    const int p0 = g * NR, nr = drv_min(NR, P - p0);
                    a.ncols = drv_min(N - 16 * p0, nr * 16);
                    a.w = static_cast<const char*>(w) + (int64_t(p0) * K + k0) * kbytes;
                    a.bias = (bias && kb == nkb - 1) ? bias + 16 * p0 : nullptr;
                    if (q) {
                        if (group > 0) {
                            const int64_t off = int64_t(p0) * qpstride + int64_t(k0 / group) * 16;
                            a.qs = param_at(q->scales, off, q->pbytes);
                            a.qo = param_at(q->offsets, off, q->pbytes);
                        } else {
                            a.qs = q->scales + 16 * p0;
                        }
                    }
                    for (int m0 = m_blk; m0 < m_end; m0 += MR) {
                        const int mr = drv_min(MR, m_end - m0);
                        a.x = prep ? reinterpret_cast<const float*>(xq + int64_t(m0 - m_blk) * ldq * esize)
                                   : x + m0 * ldx + k0;
                        a.y = y + m0 * ldy + 16 * p0;
                        table[mr * tstride + nr](a);
                    }
                }
            }
        }
    }
}

// fp32 (esz 4) / bf16 (esz 2) panel16 weights.
inline void linear_drive(const float* x, int64_t ldx, int M, const void* w, int esz, int N, int K,
                         const float* bias, float* y, int64_t ldy, int nthreads, int MR, int NR,
                         const UkFn* table, int tstride) {
    linear_drive_q(x, ldx, M, w, 16 * esz, N, K, bias, y, ldy, nthreads, MR, NR, table, tstride, nullptr);
}

}  // namespace
}  // namespace bessemer
