// The one blocking/threading driver of every linear kernel (linear@1, linear_w8a16@1,
// linear_w4a16@1/@2, linear_fp8@1, linear_w8a8@1) on both ISAs. Included by each kernel
// file; everything here has internal linkage and uses no C++ standard library, so each
// file gets its own copy compiled for its own ISA.
//
// Scheme (GotoBLAS-like, without packing: panel16 / vnni16 weights are already "packed"):
//   * threads split the panel groups (NR panels = NR*16 outputs each) statically, so each
//     thread streams a disjoint slice of the weights; when there are too few groups for an
//     even split and many rows, threads split the rows instead (plan_linear_work);
//   * a thread walks row blocks of Mc rows, then K blocks of kc (the kernel family first
//     prepares that block's activations: rounds them to bf16, quantizes them to E4M3 or
//     int8, or leaves them as they are), then its panel groups, then MR-row chunks: the
//     activation block stays in L2 while every group of the thread uses it, and a group's
//     weights (kc x NR*16) stay in L1/L2 across the MR-row chunks (linear_run);
//   * GEMV (M <= MR): one row block; each weight byte is read exactly once.
// Batch invariance: a row's outputs are bit-identical whatever the call's row count, the
// row's place in it and the thread count. Each microkernel computes a row as the same FMA
// chain over k whatever its MR and NR, and the chain does not depend on the K blocking
// either: a K block's accumulators start from the partial sums the previous block left in
// y (stored unscaled; scales and bias are applied after the last block), and group-wise
// quantized kernels sum each whole group apart and add it to y in group order. So K blocks
// are a choice of speed per call (fp32/bf16 GEMV: one block; GEMM: blocks that keep the
// activations in L2), and threads split rows or columns, never K.
// What differs between kernel families is only how K and rows are blocked (their
// activation buffers differ) and what each microkernel call is handed: a family is a
// struct with blocks(gemv), thread_bytes(), begin(), block(), group() and rows() (PanelFamily
// below; linear_fp8_family.h, linear_w8a8_family.h).
#pragma once

#include <alloca.h>
#include <omp.h>
#include <stdint.h>

namespace bessemer {
namespace {

inline int drv_min(int a, int b) { return a < b ? a : b; }
inline int drv_max(int a, int b) { return a > b ? a : b; }

// How one call's work is split over threads: the thread policy of every linear kernel.
struct LinearWork {
    int P;        // panels of 16 outputs
    int NR;       // panels per microkernel call
    int G;        // panel groups (of NR panels)
    int T;        // threads
    bool gemv;    // M <= MR: one row block (fp32/bf16 weights: one K block)
    bool split_rows;
};

inline LinearWork plan_linear_work(int M, int N, int K, int MR, int NR, int nthreads) {
    LinearWork w;
    w.P = (N + 15) / 16;
    w.gemv = M <= MR;
    // GEMV is memory bound: prefer a panel-group width that splits evenly over threads
    // (e.g. N=576: 9 groups of 4 panels -> 12 groups of 3).
    if (w.gemv && nthreads > 1)
        for (int nr = NR; nr >= 1; --nr) {
            const int g = (w.P + nr - 1) / nr;
            if (g % nthreads == 0 || g >= 8 * nthreads) {
                NR = nr;
                break;
            }
        }
    w.NR = NR;
    w.G = (w.P + NR - 1) / NR;
    const bool par = nthreads > 1 && double(M) * N * K >= 2e5 && (w.G > 1 || M > MR);
    w.T = par ? nthreads : 1;
    // Thread grid: split groups, or rows when groups split unevenly and rows are plentiful.
    w.split_rows = false;
    if (w.T > 1) {
        if (w.G < w.T) w.split_rows = M >= 2 * MR * w.T;
        else if (w.G % w.T != 0 && w.G < 8 * w.T) w.split_rows = M >= 4 * MR * w.T;
    }
    return w;
}

// A call's K blocks and row blocks (chosen by its kernel family; the same for every thread).
struct LinearBlocks {
    int nkb, kc;  // K blocks of kc columns (the last may be shorter)
    int Mc;       // rows per row block, a multiple of MR
};

// The loop nest of every linear kernel. Family F provides (all const):
//   int MR;                                                 rows per microkernel call (max)
//   int64_t thread_bytes(rows) -> per-thread buffer: activations, decoded weights (64-byte aligned, on the stack)
//   void begin(Thread&, const LinearWork&, buf, rows)        set what stays fixed for the call
//                                                            (rows: the thread's largest row block)
//   void block(Thread&, m_blk, rows, k0, kc, kb)             prepare one row x K block
//   void group(Thread&, p0, ncols, k0, last_k_block)         point at panels p0.. of the block
//   void rows(Thread&, m0, mr, nr)                           one microkernel call
// and its per-thread state type F::Thread. linear_run_thread is thread tid's share of them.
template <class F>
inline void linear_run_thread(const F& f, int M, int N, int K, const LinearWork& w, const LinearBlocks& b, int tid) {
    const int MR = f.MR, NR = w.NR;
    int ga = 0, gb = w.G, ma = 0, mb = M;
    if (w.T > 1) {
        if (w.split_rows) {
            const int chunks = (M + MR - 1) / MR;
            ma = drv_min(M, int(int64_t(chunks) * tid / w.T) * MR);
            mb = drv_min(M, int(int64_t(chunks) * (tid + 1) / w.T) * MR);
        } else {
            ga = int(int64_t(w.G) * tid / w.T);
            gb = int(int64_t(w.G) * (tid + 1) / w.T);
        }
    }
    // activation buffer on the stack: no allocation per call
    const int rows_max = drv_min(b.Mc, drv_max(mb - ma, 1));
    char* raw = static_cast<char*>(alloca(size_t(f.thread_bytes(rows_max)) + 64));
    char* buf = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 63) & ~uintptr_t(63));
    typename F::Thread t;
    f.begin(t, w, buf, rows_max);
    for (int m_blk = ma; m_blk < mb; m_blk += b.Mc) {
        const int m_end = drv_min(mb, m_blk + b.Mc);
        for (int kb = 0; kb < b.nkb; ++kb) {
            const int k0 = kb * b.kc, kcur = drv_min(b.kc, K - k0);
            f.block(t, m_blk, m_end - m_blk, k0, kcur, kb);
            for (int g = ga; g < gb; ++g) {
                const int p0 = g * NR, nr = drv_min(NR, w.P - p0);
                f.group(t, p0, drv_min(N - 16 * p0, nr * 16), k0, kb == b.nkb - 1);
                for (int m0 = m_blk; m0 < m_end; m0 += MR) f.rows(t, m0, drv_min(MR, m_end - m0), nr);
            }
        }
    }
}

// One thread runs the loops on the calling thread, outside any parallel region: an OpenMP
// region of one thread still costs a team's set-up per call (and a nested team's when the
// caller is itself in a region: the experts' small-batch path calls one per 64-row slice).
template <class F>
inline void linear_run(const F& f, int M, int N, int K, const LinearWork& w, const LinearBlocks& b) {
    if (w.T == 1) {
        linear_run_thread(f, M, N, K, w, b, 0);
        return;
    }
#pragma omp parallel num_threads(w.T)
    linear_run_thread(f, M, N, K, w, b, omp_get_thread_num());
}

// One call of family f over y[M, N] = x[M, K] @ W^T: its work split, its blocks, the loops.
template <class F>
inline void linear_drive_family(F& f, int M, int N, int K, int NR, int nthreads) {
    const LinearWork work = plan_linear_work(M, N, K, f.MR, NR, nthreads);
    const LinearBlocks b = f.blocks(work.gemv);
    linear_run(f, M, N, K, work, b);
}

// ---------------------------------------------------------------- weights decoded once per row block
// A microkernel that widens compact weights (int4, int8, E4M3 codes) to fp32 in registers
// repeats that work for every MR-row chunk of a row block: on AVX2 about as much work as
// the FMAs it feeds. A family whose AVX2 kernel offers a decode function instead decodes
// each group's K block once into a per-thread fp32 buffer that every chunk reads. The one
// statement of when and how (PanelPredecode, used by the panel16 and fp8 families):
//   * PanelDecodeFn decodes nr panels (panel n at w + n * pstride bytes) over kc k into fp32
//     at out + (n * kc + k) * 16, exactly the values the microkernel computes in registers,
//     so a row's FMA chain, and its result, are the same bits either way;
//   * a thread's buffer holds one panel of a K block of up to kPredecodeMaxK columns (GEMM
//     groups are one panel: the decoding kernels pass NR = 1 beyond M <= 2), and exists only
//     beyond GEMV where the thread's row blocks can hold several chunks (rows > MR);
//   * a group is decoded there when its row block has several chunks and its K block fits;
//     otherwise (GEMV, one chunk, a wider K block) the microkernel decodes in registers.
using PanelDecodeFn = void (*)(const void* w, int64_t pstride, int nr, int kc, float* out);
constexpr int kPredecodeMaxK = 1024;  // K <= 1024 is one K block; wider K blocks of about 512

struct PanelPredecode {
    PanelDecodeFn decode;  // null: the microkernels always decode in registers
    int MR;

    // Bytes of the thread's buffer when its largest row block has `rows` rows (64-aligned).
    int64_t thread_bytes(int rows) const { return decode && rows > MR ? int64_t(kPredecodeMaxK) * 16 * 4 : 0; }
    // The buffer at p (thread_bytes(rows) bytes) where this call may use it, else null.
    float* buffer(const LinearWork& w, char* p, int rows) const {
        return thread_bytes(rows) && !w.gemv && w.NR == 1 ? reinterpret_cast<float*>(p) : nullptr;
    }
    // The group at w (one panel, K block of kc) decoded into buf for a row block of `rows`
    // rows, or null where the microkernel is to decode it.
    const float* group(float* buf, const void* w, int64_t pstride, int rows, int kc) const {
        if (!buf || rows <= MR || kc > kPredecodeMaxK) return nullptr;
        decode(w, pstride, 1, kc, buf);
        return buf;
    }
};

// ---------------------------------------------------------------- panel16 family
// linear@1, linear_w8a16@1, linear_w4a16@1/@2: a weight format is only "kbytes" (bytes per
// panel and k: 64 fp32, 32 bf16, 16 int8, 8 int4) plus optional quantization parameters,
// which the driver offsets to the panel group / K block it hands to the microkernel.
// Group-wise parameters force K blocks to whole groups.

struct UkArgs {
    int kc;
    const float* x;
    int64_t ldx;
    const char* w;    // panel p0 at k0
    int64_t pstride;  // bytes between panels
    float* y;         // row m0, column 16*p0
    int64_t ldy;
    bool accumulate;    // not the first K block: the accumulators start from y's partial sums
    bool last;          // the last K block: finish y (scale, bias); else store the partial sums
    const float* bias;  // bias + 16*p0 on the last K block, or null
    int ncols;          // valid columns in this group (<= NR*16)
    // Quantization parameters (null for fp32/bf16 weights):
    //   per channel (group == 0): qs = scales + 16*p0 ([N] row_major), qo unused;
    //   group-wise (group > 0):   qs/qo = scales/offsets of panel p0 at group k0/group
    //                             (panel16 [N, K/group]); panel n's at qs + n*qpstride.
    const float* qs;
    const float* qo;   // null for symmetric int4 codes read as stored (offset = -8 * scale)
    int64_t qpstride;  // elements between panels of qs/qo (group-wise)
    int group;         // K columns per group (kc is a multiple of it), 0 = per channel
    int pbytes;        // bytes per element of qs/qo: 4 fp32, 2 bf16 (then qs/qo point to bf16)
    // Two-level parameters (linear_w4k): qs/qo are the uint8 sub-block codes (pbytes =
    // group / 32: a group's 16 rows x group/32 sub-blocks), qds/qdo the fp16 super-scales
    // and super-minimums of the same (panel, group), 2 bytes per element; null otherwise.
    const uint16_t* qds;
    const uint16_t* qdo;
    // GEMV: bytes from a weight to the same k of the next panel group (0 = none). A
    // compute-heavy (quantized) microkernel prefetches there, and the next group's
    // quantization parameters (at qs/qo + NR*qpstride, or qs + NR*16 per channel): the
    // hardware prefetcher follows the current panels' code streams but neither the jump
    // to the next group nor the sparse parameter reads at group ends. 0 also for the call's
    // last group, whose next group lies past the call's rows.
    int64_t pf_next;
    bool gemv;  // M <= MR: each weight byte is read once (a microkernel may prefetch its own panels)
    const float* wdec;  // the group's weights decoded once for its row chunks (PanelPredecode), or null
};

// Optional activation preparation (linear_w4a16@2): the x block of a thread's row block
// and K block (rows x kc, row stride ldx) is converted once into the thread's buffer (row
// stride ldq elements of esize bytes, ldq = kc rounded up to even, the pad column zero),
// and the microkernels read it through UkArgs::x / ldx (a.x points into the buffer, to be
// cast to the element type; ldx is then in elements of esize bytes). Converting once per
// block instead of per panel group keeps the conversion off the weight stream. With
// QuantParams::x_sums = S > 0 each prepared row also carries ceil(kc / S) fp32 values after its
// even-padded kc elements (the prep function's own, e.g. the sums of each S columns, made
// once per block instead of once per panel group): ldq grows by 4 / esize elements each.
using XPrepFn = void (*)(const float* x, int64_t ldx, int rows, int kc, void* out, int64_t ldq);
constexpr int kXPrepBytes = 128 * 1024;  // per-thread prepared-activation buffer

// Largest group size a prepared linear supports: MR (<= 8) rows of one group must fit.
constexpr int kXPrepMaxGroup = kXPrepBytes / (8 * 4);

// Quantization parameters of a linear (see UkArgs).
struct QuantParams {
    const float* scales;
    const float* offsets;
    int group;  // 0: per-channel scales [N] row_major; > 0: group-wise panel16 [N, K/group]
    int pbytes = 4;  // 2: group-wise scales/offsets are bf16 (only kernels that read bf16 get them)
    const uint16_t* super_scales = nullptr;   // linear_w4k: fp16 panel16 [N, K/group] (UkArgs::qds)
    const uint16_t* super_offsets = nullptr;
    int x_sums = 0;  // > 0: prepared rows carry ceil(kc / x_sums) fp32 values after their data (XPrepFn)
    bool gemv_one_pass = false;  // a GEMV reads each panel in one K pass (see LinearBlocks::blocks)
};

// p advanced by n elements of pbytes bytes.
inline const float* param_at(const float* p, int64_t n, int pbytes) {
    return reinterpret_cast<const float*>(reinterpret_cast<const char*>(p) + n * pbytes);
}

using UkFn = void (*)(const UkArgs&);

struct PanelFamily {
    int MR;
    const float* x;
    int64_t ldx;
    const char* w;
    int kbytes, K;
    const float* bias;
    float* y;
    int64_t ldy;
    const QuantParams* q;
    XPrepFn prep;
    int esize;
    const UkFn* table;  // table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR
    int tstride;
    PanelPredecode pre;
    int ldq = 0, nkb = 0;

    struct Thread {
        UkArgs a;
        char* xq;     // prepared x block
        float* wdec;  // decoded weights of one group (PanelPredecode::buffer), or null
        int m_blk, k0, p0, rows;
        int last_p0;       // first panel of the call's last group: nothing to prefetch past it
        int64_t pf_group;  // GEMV: bytes to the next panel group (0 = no prefetch)
    };

    LinearBlocks blocks(bool gemv) {
        const int group = q ? q->group : 0;
        // K > 1024: blocks of about 512 (the activation block stays in L2). A GEMV of fp32 /
        // bf16 weights reads each panel in one pass instead (measured faster: its streams are
        // not cut every 512 k), and so does one of int4 weights on bf16 activations (esize 2,
        // linear_w4_bf16_avx512.cpp: measured 8% faster at one thread on a 1536 x 2048 matrix
        // from DRAM and 14% on a 512 x 2048 one from L2, Zen 4), and so does a kernel that asks
        // for it (QuantParams::gemv_one_pass: linear_w4_avx2); the other quantized GEMVs keep
        // the blocks (measured faster for int8 decode). The results do not depend on the
        // choice (see the top of this file).
        const bool one_pass = gemv && (!q || (prep && esize == 2) || q->gemv_one_pass);
        int n = !one_pass && K > 1024 ? (K + 511) / 512 : 1;
        int kc = (K + n - 1) / n;
        // A prepared linear's K block holds MR rows in the buffer: at most cap columns (whole
        // groups; one group always fits, group <= kXPrepMaxGroup).
        // With x_sums, a column costs esize + 4 / x_sums bytes.
        const int xs = q ? q->x_sums : 0;
        const int cap = !prep ? K
                        : xs > 0 ? int(int64_t(kXPrepBytes / (MR * esize)) * (xs * esize) / (xs * esize + 4)) & ~1
                                 : (kXPrepBytes / (MR * esize)) & ~1;
        if (kc > cap) {
            n = (K + cap - 1) / cap;
            kc = (K + n - 1) / n;
        }
        if (group > 0) {  // whole groups per K block
            kc = (kc + group - 1) / group * group;
            if (kc > cap) kc = drv_max(group, cap / group * group);
            n = (K + kc - 1) / kc;
        }
        ldq = (kc + 1) / 2 * 2 + (xs > 0 ? (kc + xs - 1) / xs * (4 / esize) : 0);
        nkb = n;
        // Row block: x block of about 384 KiB (L2), a multiple of MR (and within the buffer).
        int Mc = (384 * 1024 / 4) / kc;
        if (prep) Mc = drv_min(Mc, kXPrepBytes / (ldq * esize));
        return {n, kc, drv_max(MR, Mc / MR * MR)};
    }
    int64_t xq_bytes() const { return prep ? kXPrepBytes : 0; }
    int64_t thread_bytes(int rows) const { return xq_bytes() + pre.thread_bytes(rows); }
    void begin(Thread& t, const LinearWork& w, char* buf, int rows) const {
        t.xq = buf;
        t.wdec = pre.buffer(w, buf + xq_bytes(), rows);
        t.a.wdec = nullptr;
        t.a.ldx = ldx;
        t.a.pstride = int64_t(K) * kbytes;
        t.a.ldy = ldy;
        t.a.qs = t.a.qo = nullptr;
        t.a.qds = t.a.qdo = nullptr;
        t.a.group = q ? q->group : 0;
        t.a.qpstride = t.a.group > 0 ? int64_t(K / t.a.group) * 16 : 0;
        t.a.pbytes = q ? q->pbytes : 4;
        t.a.gemv = w.gemv;
        t.pf_group = w.gemv ? int64_t(w.NR) * t.a.pstride : 0;
        t.last_p0 = (w.G - 1) * w.NR;
    }
    void block(Thread& t, int m_blk, int rows, int k0, int kc, int kb) const {
        if (prep) {
            prep(x + int64_t(m_blk) * ldx + k0, ldx, rows, kc, t.xq, ldq);
            t.a.ldx = ldq;
        }
        t.a.kc = kc;
        t.a.accumulate = kb > 0;
        t.m_blk = m_blk;
        t.k0 = k0;
        t.rows = rows;
    }
    void group(Thread& t, int p0, int ncols, int k0, bool last) const {
        t.a.ncols = ncols;
        t.a.w = w + (int64_t(p0) * K + k0) * kbytes;
        t.a.bias = (bias && last) ? bias + 16 * p0 : nullptr;
        t.a.last = last;
        // The last group's next group lies past the call's rows (in a moe kernel's slice, an
        // expert that is seldom the next one read): prefetching it would only waste bandwidth.
        t.a.pf_next = p0 < t.last_p0 ? t.pf_group : 0;
        if (q) {
            if (q->group > 0) {
                const int64_t off = int64_t(p0) * t.a.qpstride + int64_t(k0 / q->group) * 16;
                t.a.qs = param_at(q->scales, off, q->pbytes);
                t.a.qo = q->offsets ? param_at(q->offsets, off, q->pbytes) : nullptr;  // null: symmetric
                if (q->super_scales) {
                    t.a.qds = q->super_scales + off;
                    t.a.qdo = q->super_offsets + off;
                }
            } else {
                t.a.qs = q->scales + 16 * p0;
            }
        }
        t.a.wdec = pre.group(t.wdec, t.a.w, t.a.pstride, t.rows, t.a.kc);
        t.p0 = p0;
    }
    void rows(Thread& t, int m0, int mr, int nr) const {
        t.a.x = prep ? reinterpret_cast<const float*>(t.xq + int64_t(m0 - t.m_blk) * ldq * esize)
                     : x + m0 * ldx + t.k0;
        t.a.y = y + m0 * ldy + 16 * t.p0;
        table[mr * tstride + nr](t.a);
    }
};

// table[mr * tstride + nr] for mr in 1..MR, nr in 1..NR; kbytes: weight bytes per panel and k;
// prep / esize: optional activation preparation (see XPrepFn; group <= kXPrepMaxGroup);
// decode: the microkernels' weights as fp32, for a row block of several chunks (PanelPredecode).
inline void linear_drive_q(const float* x, int64_t ldx, int M, const void* w, int kbytes, int N,
                           int K, const float* bias, float* y, int64_t ldy, int nthreads, int MR,
                           int NR, const UkFn* table, int tstride, const QuantParams* q,
                           XPrepFn prep = nullptr, int esize = 0, PanelDecodeFn decode = nullptr) {
    PanelFamily f{MR, x, ldx, static_cast<const char*>(w), kbytes, K, bias, y, ldy, q, prep, esize, table, tstride,
                  {decode, MR}};
    linear_drive_family(f, M, N, K, NR, nthreads);
}

// fp32 (esz 4) / bf16 (esz 2) panel16 weights.
inline void linear_drive(const float* x, int64_t ldx, int M, const void* w, int esz, int N, int K,
                         const float* bias, float* y, int64_t ldy, int nthreads, int MR, int NR,
                         const UkFn* table, int tstride) {
    linear_drive_q(x, ldx, M, w, 16 * esz, N, K, bias, y, ldy, nthreads, MR, NR, table, tstride, nullptr);
}

}  // namespace
}  // namespace bessemer
