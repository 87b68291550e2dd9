// Kernel interface shared by the cpu executor (targets/cpu/csrc) and its kernels (csrc/kernels).
//
// A plan step is resolved once, at load time, to a KernelDef (target, op@version). Its
// `prepare` checks the step (views, weights, attrs) against the plan, stores what `run`
// needs in the call's own typed parameters (a KernelParams subclass of its kernel file) and
// declares what it needs from the executor (KernelNeeds); it throws std::invalid_argument
// (-> ValueError) on any problem. `run` executes the step for one Executor.step() call; it
// never throws and never allocates (scratch and workspaces come from the StepContext, sized
// by the executor from every call's needs; the executor never looks at an op's name).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "contract.h"
#include "plan.h"
#include "step_batch.h"

namespace bessemer {

enum class Isa : int { AVX2 = 0, AVX512 = 1 };

// DType, Layout and RowKind ids, their names and size rules (format.h / contract.h), the
// tensor table and plan (plan.h) and the step's inputs (step_batch.h) come from
// bessemer/format/csrc: the contract every target shares.

// Static facts about the plan that kernels validate against.
struct PlanInfo {
    std::vector<BufferInfo> buffers;  // indexed by buffer id
    int kv_layers = 0, kv_heads = 0, head_dim = 0;
    int kv_dtype = DT_F32;
    int vocab_size = 0;
    Isa isa = Isa::AVX2;  // what the executor runs (a kernel may pick its variant at prepare)
};

// A kernel's own parameters, set by its prepare and read by its run (each kernel file
// declares its subclass; a call holds the one of its kernel).
struct KernelParams {
    virtual ~KernelParams() = default;
};

// What a call needs from the executor beyond its views and weights. The executor combines
// the needs of every call of the plan (the largest scratch, any collective, the tightest
// token limit, ...) and never asks which op a call runs.
struct KernelNeeds {
    // Per-thread fp32 scratch for a step whose longest context is C tokens:
    // max(thread_floats, thread_floats_per_key * (align_up(C, 16) + 32) + thread_floats_base).
    int64_t thread_floats = 0, thread_floats_per_key = 0, thread_floats_base = 0;
    // Shared fp32 workspace: min(shared_floats_per_thread_pair * nthreads^2 + 64, kSharedFloatsCap).
    int64_t shared_floats_per_thread_pair = 0;
    // Shared int32 workspace: ints_per_seq * (S + 1) + ints_per_row * T entries.
    int64_t ints_per_seq = 0, ints_per_row = 0;
    // Reads / writes the paged KV cache: every block a row's positions touch must exist, over
    // the last kv_window positions of each row (0: from position 0).
    bool reads_kv = false;
    int64_t kv_window = 0;
    // Runs a collective of a tensor-parallel group: this rank's place in it (tp_size 0: none).
    int tp_rank = 0, tp_size = 0;
    // Gathers rows of a table by token id: ids must be < token_limit (0: no limit).
    int64_t token_limit = 0;
};
constexpr int64_t kSharedFloatsCap = int64_t(1) << 22;

struct KernelCall {
    std::string op;
    int version = 0;
    std::string node;
    std::vector<ViewRef> ins, outs;
    std::vector<const TensorRef*> weights;
    std::map<std::string, double> attrs;
    // Filled by prepare:
    RowKind rows = ROWS_TOKENS;  // row count the kernel runs over
    KernelNeeds needs;
    std::unique_ptr<KernelParams> params;

    // prepare: a fresh P as this call's parameters; run: the call's P (the one prepare set).
    template <class P>
    P& set_params() {
        auto p = std::make_unique<P>();
        P& ref = *p;
        params = std::move(p);
        return ref;
    }
    template <class P>
    const P& get() const { return static_cast<const P&>(*params); }
};

// Collectives of a tensor-parallel group (targets/cpu/csrc/communicator.h implements them:
// shared memory on one machine, or a Python object such as an MPI communicator). Calls
// never throw: false means the group failed (a peer died, timed out or aborted) and
// error() says why; the executor turns that into an exception after the step.
class Collectives {
   public:
    virtual ~Collectives() = default;
    virtual int rank() const = 0;
    virtual int world() const = 0;
    // x: rows x width (row stride ld) replaced by the sum over ranks, accumulated in rank
    // order 0, 1, ... so every rank holds bit-identical results.
    virtual bool all_reduce(float* x, int rows, int width, int64_t ld) = 0;
    // x: rows x width, this rank's columns of a full-wide row (split by shard_range);
    // y: rows x full, every rank's columns in place.
    virtual bool all_gather(const float* x, int64_t ldx, int rows, int width, float* y, int64_t ldy,
                            int full) = 0;
    virtual bool failed() const = 0;
    virtual std::string error() const = 0;
};

// Columns [start, stop) of a full-wide axis rank r holds: ceil(full / world) each
// (plugins/ops.py shard_range).
inline void shard_range(int full, int world, int r, int* start, int* stop) {
    const int chunk = (full + world - 1) / world;
    *start = std::min(full, r * chunk);
    *stop = std::min(full, (r + 1) * chunk);
}

// One step as a kernel sees it: the step's inputs (StepBatch: T, S, L, B and the six
// arrays) plus the executor's buffers, threads, KV cache, scratch and communicator.
struct StepContext : StepBatch {
    const int32_t* seq_of_row = nullptr;    // [T]
    float* const* buf = nullptr;            // by buffer id
    const int* buf_width = nullptr;         // by buffer id
    int nthreads = 1;
    Isa isa = Isa::AVX2;
    // Paged KV cache.
    int kv_dtype = DT_F32;
    int block_size = 0, num_blocks = 0;
    void* const* k_cache = nullptr;  // per layer
    void* const* v_cache = nullptr;
    // int8 / float8_e4m3 cache: float32 scale per (block, slot, KV head), per layer
    // (x = code * scale); null entries for float caches.
    float* const* k_scale = nullptr;
    float* const* v_scale = nullptr;
    // Per-thread fp32 scratch (scratch_floats each, 64-byte aligned), shared int32 and fp32
    // workspaces: at least what every call's KernelNeeds asked for this step (fwork may be
    // null when no call asked for it).
    float* const* scratch = nullptr;
    int64_t scratch_floats = 0;
    int32_t* iwork = nullptr;
    int64_t iwork_len = 0;
    float* fwork = nullptr;
    int64_t fwork_len = 0;

    // Tensor-parallel group (null for a one-rank engine).
    Collectives* comm = nullptr;

    int rows(RowKind k) const { return k == ROWS_TOKENS ? T : L; }
    float* ptr(const ViewRef& v) const { return buf[v.buf] + v.col; }
    int64_t ld(const ViewRef& v) const { return buf_width[v.buf]; }
};

using PrepareFn = void (*)(KernelCall&, const PlanInfo&);
using RunFn = void (*)(const KernelCall&, const StepContext&);

struct KernelDef {
    const char* target;  // the plan's target these kernels run ("cpu")
    const char* op;
    int version;
    PrepareFn prepare;
    RunFn run;
};

// registry.cpp: the kernels of `target` (keyed by target, op and version).
const KernelDef* find_kernel(const std::string& target, const std::string& op, int version);
std::string supported_kernels(const std::string& target);  // "add@1, attention@1, ..."

// ---- helpers for prepare functions (registry.cpp) ----
[[noreturn]] void kernel_error(const KernelCall& c, const std::string& msg);
void expect_arity(const KernelCall& c, size_t nin, size_t nout, size_t nw_min, size_t nw_max);
// All views of the call share one row kind (returned); stores it in c.rows.
RowKind same_rows(KernelCall& c, const PlanInfo& p);
RowKind view_rows(const KernelCall& c, const PlanInfo& p, const ViewRef& v);
void expect_width(const KernelCall& c, const ViewRef& v, int width, const char* what);
double attr(const KernelCall& c, const char* name);                  // required
double attr_or(const KernelCall& c, const char* name, double dflt);  // optional
int64_t attr_int(const KernelCall& c, const char* name);             // required, integral
void expect_weight(const KernelCall& c, size_t i, std::initializer_list<int> dtypes,
                   std::initializer_list<int> layouts, std::vector<int64_t> shape);
bool views_overlap(const ViewRef& a, const ViewRef& b);
// `out` either is `in` (in place) or does not touch it.
void check_inplace_or_disjoint(const KernelCall& c, const ViewRef& out, const ViewRef& in);
// The checks of an elementwise op of two same-width inputs and one output (add, silu_mul,
// gelu_tanh_mul): one row kind, widths equal, the output in place or apart.
void prepare_same_width_pair(KernelCall& c, const PlanInfo& p, const char* in0, const char* in1);
// Row loops of elementwise kernels fork threads only when the work is worth a fork/join.
inline bool worth_threads(int64_t rows, int64_t width, int nthreads) {
    return nthreads > 1 && rows > 1 && rows * width >= 32768;
}
// The row loop of an elementwise kernel with two inputs and one output of the output's
// width W (the second input may be narrower, e.g. one gate column): body(in0_row, in1_row,
// out_row, W) for every row of the step, threaded when worth_threads says so.
template <class Body>
void for_each_row2(const KernelCall& c, const StepContext& ctx, Body body) {
    const int rows = ctx.rows(c.rows), W = c.outs[0].width;
    const float* a = ctx.ptr(c.ins[0]);
    const float* b = ctx.ptr(c.ins[1]);
    float* o = ctx.ptr(c.outs[0]);
    const int64_t lda = ctx.ld(c.ins[0]), ldb = ctx.ld(c.ins[1]), ldo = ctx.ld(c.outs[0]);
#pragma omp parallel for num_threads(ctx.nthreads) schedule(static) if (worth_threads(rows, W, ctx.nthreads))
    for (int r = 0; r < rows; ++r) body(a + r * lda, b + r * ldb, o + r * ldo, W);
}
// The common checks of every linear kernel (one input view x [rows, K], one output y
// [rows, N], nw_min..nw_max weights, views of one row kind, N and K > 0): sets *N, *K.
void expect_linear(KernelCall& c, const PlanInfo& p, size_t nw_min, size_t nw_max, int* N, int* K);

}  // namespace bessemer
