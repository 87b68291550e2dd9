#include "executor.h"

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <stdexcept>

#include "step_batch_py.h"

namespace bessemer {

// ---------------------------------------------------------------- helpers

AlignedBuf::~AlignedBuf() { std::free(p_); }

void AlignedBuf::ensure(size_t bytes) {
    if (bytes <= cap_ && p_) return;
    std::free(p_);
    p_ = nullptr;
    cap_ = 0;
    // Large blocks (KV cache, big activations): 2 MiB aligned and backed by transparent
    // huge pages where the kernel allows it (the KV cache is read with large strides; 4 KiB
    // pages cost a TLB miss every few rows).
    constexpr size_t kHuge = size_t(2) << 20;
    const bool huge = bytes >= kHuge;
    const size_t align = huge ? kHuge : 64;
    const size_t sz = (std::max<size_t>(bytes, 64) + align - 1) / align * align;
    p_ = std::aligned_alloc(align, sz);
    if (!p_) throw std::bad_alloc();
    if (huge) ::madvise(p_, sz, MADV_HUGEPAGE);  // advisory; failure is harmless
    cap_ = sz;
}

CpuFeatures detect_cpu_features() {
    __builtin_cpu_init();
    CpuFeatures f;
    f.avx2 = __builtin_cpu_supports("avx2");
    f.fma = __builtin_cpu_supports("fma");
    f.f16c = false;
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
    f.f16c = __builtin_cpu_supports("f16c");
#else
    {
        unsigned a, b, c, d;
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        f.f16c = (c >> 29) & 1;
    }
#endif
    f.avx512f = __builtin_cpu_supports("avx512f");
    f.avx512bw = __builtin_cpu_supports("avx512bw");
    f.avx512vl = __builtin_cpu_supports("avx512vl");
    f.avx512dq = __builtin_cpu_supports("avx512dq");
    f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
    return f;
}

namespace {

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

}  // namespace

// ---------------------------------------------------------------- construction

Executor::Executor(std::shared_ptr<EngineFile> file, int num_threads, int kv_block_size, int num_kv_blocks,
                   const std::string& isa)
    : file_(std::move(file)) {
    if (!file_) fail("Executor: file is None");
    check_format_version(*file_);
    if (num_threads <= 0) num_threads = omp_get_num_procs();  // 0: all processors
    num_threads_ = active_threads_ = num_threads;
    if (kv_block_size <= 0) fail("kv_block_size must be > 0");
    if (num_kv_blocks < 0) fail("num_kv_blocks must be >= 0");
    kv_block_size_ = kv_block_size;
    num_kv_blocks_ = num_kv_blocks;

    const CpuFeatures f = detect_cpu_features();
    const bool has_avx2 = f.avx2 && f.fma;
    const bool has_avx512 = has_avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    if (isa == "auto") {
        if (!has_avx2) fail("this CPU lacks AVX2/FMA, the baseline ISA of the cpu target");
        isa_ = has_avx512 ? Isa::AVX512 : Isa::AVX2;
    } else if (isa == "avx2") {
        if (!has_avx2) fail("isa 'avx2' requested but this CPU lacks AVX2/FMA");
        isa_ = Isa::AVX2;
    } else if (isa == "avx512") {
        if (!has_avx512) fail("isa 'avx512' requested but this CPU lacks AVX-512 F/BW/VL/DQ");
        isa_ = Isa::AVX512;
    } else {
        fail("unknown isa '" + isa + "' (expected auto, avx2 or avx512)");
    }

    header_ = read_rank_header(*file_);
    load_plan(header_.plan);
    allocate_kv_cache();
}

void Executor::load_plan(const PlanDesc& plan) {
    info_.isa = isa_;
    info_.buffers = plan.buffers;
    info_.kv_layers = plan.kv.layers;
    info_.kv_heads = plan.kv.heads;
    info_.head_dim = plan.kv.head_dim;
    info_.kv_dtype = plan.kv.dtype;
    // the contract's KV types include the cuda target's float16; the cpu kernels read these
    if (plan.kv.dtype != DT_F32 && plan.kv.dtype != DT_BF16 && plan.kv.dtype != DT_I8 && plan.kv.dtype != DT_F8E4M3)
        throw std::invalid_argument(std::string("KV cache dtype ") + dtype_info(plan.kv.dtype)->name +
                                    " is not one the cpu target runs; rebuild the engine with --kv-cache-dtype "
                                    "float32, bfloat16, int8 or fp8");
    info_.vocab_size = plan.vocab_size;
    logits_ = plan.logits;
    limits_.token_limit = info_.vocab_size;
    limits_.num_kv_blocks = num_kv_blocks_;
    limits_.block_size = kv_block_size_;

    int idx = 0;
    bool any_unwindowed = false;
    int64_t kv_layers_used = 0;
    const json::Value* tv = header_.json.find("target");
    const std::string target = tv && tv->kind == json::Kind::String ? tv->str : "cpu";
    if (target != "cpu") fail("this rank file is for target '" + target + "'; the cpu executor runs target 'cpu'");
    for (const PlanStep& s : plan.steps) {
        const std::string where = "plan step " + std::to_string(idx++);
        KernelCall c;
        c.op = s.op;
        c.version = s.version;
        c.node = s.node;
        const KernelDef* def = find_kernel(target, c.op, c.version);
        if (!def)
            fail("unsupported kernel " + c.op + "@" + std::to_string(c.version) +
                 ": this runtime supports " + supported_kernels(target));
        const std::string label = where + " (" + c.op + "@" + std::to_string(c.version) + ")";
        c.ins = s.ins;
        c.outs = s.outs;
        for (const std::string& name : s.weights) {
            auto it = header_.by_name.find(name);
            if (it == header_.by_name.end()) fail(label + ": weight '" + name + "' is not in the tensor table");
            c.weights.push_back(it->second);
        }
        c.attrs = s.attrs;
        def->prepare(c, info_);
        const KernelNeeds& n = c.needs;
        needs_.thread_floats = std::max(needs_.thread_floats, n.thread_floats);
        needs_.thread_floats_per_key = std::max(needs_.thread_floats_per_key, n.thread_floats_per_key);
        needs_.thread_floats_base = std::max(needs_.thread_floats_base, n.thread_floats_base);
        needs_.shared_floats_per_thread_pair =
            std::max(needs_.shared_floats_per_thread_pair, n.shared_floats_per_thread_pair);
        needs_.ints_per_seq = std::max(needs_.ints_per_seq, n.ints_per_seq);
        needs_.ints_per_row = std::max(needs_.ints_per_row, n.ints_per_row);
        if (n.reads_kv) {
            auto layer = c.attrs.find("layer");
            if (layer != c.attrs.end()) kv_layers_used = std::max(kv_layers_used, int64_t(layer->second) + 1);
            needs_.reads_kv = true;
            any_unwindowed = any_unwindowed || n.kv_window == 0;
            needs_.kv_window = std::max(needs_.kv_window, n.kv_window);
        }
        if (n.tp_size > 0) {
            if (needs_.tp_size > 0 && (n.tp_rank != needs_.tp_rank || n.tp_size != needs_.tp_size))
                fail(label + ": rank " + std::to_string(n.tp_rank) + " of " + std::to_string(n.tp_size) +
                     " differs from an earlier collective's rank " + std::to_string(needs_.tp_rank) + " of " +
                     std::to_string(needs_.tp_size));
            needs_.tp_rank = n.tp_rank;
            needs_.tp_size = n.tp_size;
        }
        if (n.token_limit > 0) limits_.token_limit = std::min(limits_.token_limit, n.token_limit);
        calls_.push_back(std::move(c));
        defs_.push_back(def);
    }
    // cache layers beyond the last one an attention call reads would only allocate memory
    // nothing reads (a damaged header asked for 2^31 layers)
    if (info_.kv_layers > kv_layers_used)
        fail("kv_cache num_layers " + std::to_string(info_.kv_layers) + " but the plan's attention reads " +
             std::to_string(kv_layers_used) + " layers");
    if (any_unwindowed) needs_.kv_window = 0;
    limits_.reads_kv = needs_.reads_kv;
    limits_.kv_window = needs_.kv_window;

    // Buffer pointer tables (storage grows per step).
    bufs_.resize(info_.buffers.size());
    buf_ptrs_.assign(info_.buffers.size(), nullptr);
    buf_width_.assign(info_.buffers.size(), 0);
    for (size_t i = 0; i < info_.buffers.size(); ++i) buf_width_[i] = info_.buffers[i].width;
}

void Executor::allocate_kv_cache() {
    if (info_.kv_layers == 0) return;
    if (needs_.reads_kv && num_kv_blocks_ <= 0) fail("num_kv_blocks must be > 0 for a plan with attention");
    const KvDTypeInfo* kvt = kv_dtype_info(info_.kv_dtype);
    const bool coded = kvt->scale_bytes > 0;
    const int64_t esz = dtype_info(info_.kv_dtype)->bits / 8;
    const int64_t slots = int64_t(num_kv_blocks_) * kv_block_size_ * info_.kv_heads;  // (token, head) rows
    const int64_t per = slots * info_.head_dim * esz;
    const int64_t per_scales = slots * kvt->scale_bytes;
    k_cache_.resize(info_.kv_layers);
    v_cache_.resize(info_.kv_layers);
    k_ptrs_.resize(info_.kv_layers);
    v_ptrs_.resize(info_.kv_layers);
    k_scale_.resize(coded ? info_.kv_layers : 0);
    v_scale_.resize(coded ? info_.kv_layers : 0);
    k_scale_ptrs_.assign(info_.kv_layers, nullptr);
    v_scale_ptrs_.assign(info_.kv_layers, nullptr);
    const int64_t total = int64_t(info_.kv_layers) * 2 * (per + (coded ? per_scales : 0));
    for (int l = 0; l < info_.kv_layers; ++l) {
        try {
            k_cache_[l].ensure(size_t(per));
            v_cache_[l].ensure(size_t(per));
        } catch (const std::bad_alloc&) {
            fail("the KV cache (" + std::to_string(total >> 20) + " MiB) cannot be allocated; lower --kv-cache-gib");
        }
        k_ptrs_[l] = k_cache_[l].get();
        v_ptrs_[l] = v_cache_[l].get();
        if (coded) {
            k_scale_[l].ensure(size_t(per_scales));
            v_scale_[l].ensure(size_t(per_scales));
            k_scale_ptrs_[l] = static_cast<float*>(k_scale_[l].get());
            v_scale_ptrs_[l] = static_cast<float*>(v_scale_[l].get());
        }
    }
    kv_cache_bytes_ = int64_t(num_kv_blocks_) * kv_block_size_ *
                      kv_bytes_per_token(info_.kv_layers, info_.kv_heads, info_.head_dim, info_.kv_dtype);
}

py::dict Executor::profile_stats() {
    std::lock_guard<std::mutex> lock(mu_);
    py::dict d;
    for (const auto& kv : profile_) d[py::str(kv.first)] = py::make_tuple(kv.second.calls, kv.second.seconds);
    return d;
}

void Executor::set_profiling(bool on) {
    std::lock_guard<std::mutex> lock(mu_);
    profiling_ = on;
    if (on) profile_.clear();
}

void Executor::attach_communicator(std::shared_ptr<Collectives> comm) {
    if (!comm) fail("attach_communicator: communicator is None");
    if (needs_.tp_size > 0 && (needs_.tp_rank != comm->rank() || needs_.tp_size != comm->world()))
        fail("this rank file is rank " + std::to_string(needs_.tp_rank) + " of " + std::to_string(needs_.tp_size) +
             ", the communicator is rank " + std::to_string(comm->rank()) + " of " +
             std::to_string(comm->world()) + "; start one process per rank file");
    std::lock_guard<std::mutex> lock(mu_);
    comm_ = std::move(comm);
}

std::vector<std::string> Executor::kernels() const {
    std::vector<std::string> r;
    for (const KernelDef* d : defs_) r.push_back(std::string(d->op) + "@" + std::to_string(d->version));
    std::sort(r.begin(), r.end());
    r.erase(std::unique(r.begin(), r.end()), r.end());
    return r;
}

// ---------------------------------------------------------------- step

py::array_t<float> Executor::step(const py::object& batch) {
    const PyStepBatch in(batch);  // the arrays and their lengths (format/csrc/step_batch_py.h)
    const StepBatch& b = in.batch();
    const int64_t L = b.L;
    const int max_ctx = check_step_batch(b, limits_);

    if (needs_.tp_size > 0 && !comm_)
        fail("this is one rank of a tensor-parallel engine; run it through LLM (which starts every rank) "
             "or attach a communicator first");

    py::array_t<float> out({L, int64_t(info_.vocab_size)});
    float* out_ptr = out.mutable_data();
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(mu_);
        run_steps(b, max_ctx, out_ptr);
    }
    return out;
}

void Executor::run_steps(const StepBatch& batch, int max_ctx, float* logits_out) {
    const int T = batch.T, S = batch.S, L = batch.L;
    const int32_t* cu = batch.cu_seqlens;
    const int32_t* li = batch.logits_indices;
    // Grow storage to this step's row counts (kept across steps).
    for (size_t i = 0; i < info_.buffers.size(); ++i) {
        if (!info_.buffers[i].defined) continue;
        const int64_t rows = std::max(1, info_.buffers[i].rows == ROWS_TOKENS ? T : L);
        bufs_[i].ensure(size_t(rows) * info_.buffers[i].width * sizeof(float));
        buf_ptrs_[i] = static_cast<float*>(bufs_[i].get());
    }
    if (seq_of_row_.size() < size_t(T)) seq_of_row_.resize(T);
    for (int s = 0; s < S; ++s)
        for (int t = cu[s]; t < cu[s + 1]; ++t) seq_of_row_[t] = s;
    // Scratch and workspaces as the plan's calls declared them (KernelNeeds).
    const KernelNeeds& n = needs_;
    int64_t scratch_floats = 0;
    if (n.thread_floats > 0 || n.thread_floats_per_key > 0) {
        const int64_t keys = (int64_t(max_ctx) + 15) / 16 * 16 + 32;
        scratch_floats = std::max(n.thread_floats, n.thread_floats_per_key * keys + n.thread_floats_base);
        if (scratch_.size() < size_t(num_threads_)) scratch_.resize(num_threads_);
        scratch_ptrs_.resize(num_threads_);
        for (int i = 0; i < num_threads_; ++i) {
            scratch_[i].ensure(size_t(scratch_floats) * sizeof(float));
            scratch_ptrs_[i] = static_cast<float*>(scratch_[i].get());
        }
    }
    iwork_.resize(std::max<size_t>(iwork_.size(), size_t(n.ints_per_seq * (S + 1) + n.ints_per_row * T + 64)));
    if (n.shared_floats_per_thread_pair > 0 && fwork_.empty()) {
        const int64_t want = n.shared_floats_per_thread_pair * num_threads_ * num_threads_ + 64;
        fwork_.resize(size_t(std::min<int64_t>(want, kSharedFloatsCap)));
    }

    StepContext ctx;
    static_cast<StepBatch&>(ctx) = batch;
    ctx.seq_of_row = seq_of_row_.data();
    ctx.buf = buf_ptrs_.data();
    ctx.buf_width = buf_width_.data();
    ctx.nthreads = active_threads_;
    ctx.isa = isa_;
    ctx.kv_dtype = info_.kv_dtype;
    ctx.block_size = kv_block_size_;
    ctx.num_blocks = num_kv_blocks_;
    ctx.k_cache = k_ptrs_.data();
    ctx.v_cache = v_ptrs_.data();
    ctx.k_scale = k_scale_ptrs_.data();
    ctx.v_scale = v_scale_ptrs_.data();
    ctx.scratch = scratch_ptrs_.data();
    ctx.scratch_floats = scratch_floats;
    ctx.iwork = iwork_.data();
    ctx.iwork_len = int64_t(iwork_.size());
    ctx.fwork = fwork_.empty() ? nullptr : fwork_.data();
    ctx.fwork_len = int64_t(fwork_.size());
    ctx.comm = comm_.get();

    if (T > 0) {
        if (!profiling_) {
            for (size_t i = 0; i < calls_.size(); ++i) defs_[i]->run(calls_[i], ctx);
        } else {
            for (size_t i = 0; i < calls_.size(); ++i) {
                const auto t0 = std::chrono::steady_clock::now();
                defs_[i]->run(calls_[i], ctx);
                const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                ProfileEntry& e = profile_[calls_[i].op];
                e.calls += 1;
                e.seconds += dt;
            }
        }
    }

    if (comm_ && comm_->failed()) throw std::runtime_error(comm_->error());

    // Logits: rows of a "selected" buffer as they are, or the logits_indices rows of a
    // "tokens" buffer.
    const float* src = buf_ptrs_[logits_.buf] + logits_.col;
    const int64_t ld = buf_width_[logits_.buf];
    const bool selected = info_.buffers[logits_.buf].rows == ROWS_SELECTED;
    const int V = info_.vocab_size;
    for (int i = 0; i < L; ++i)
        std::memcpy(logits_out + int64_t(i) * V, src + (selected ? i : li[i]) * ld, sizeof(float) * V);
}

}  // namespace bessemer
