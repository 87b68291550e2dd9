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

int64_t to_int(const py::handle& h, const std::string& what) {
    if (!py::isinstance<py::int_>(h) || py::isinstance<py::bool_>(h)) fail(what + " must be an integer");
    return h.cast<int64_t>();
}

py::handle item(const py::dict& d, const char* key, const std::string& where) {
    if (!d.contains(key)) fail(where + ": missing '" + key + "'");
    return d[key];
}

// int32 array view of a step input (any integer dtype is converted; C order enforced).
py::array_t<int32_t> as_i32(const py::object& obj, const char* name, int ndim) {
    if (py::isinstance<py::array>(obj)) {
        auto a = py::reinterpret_borrow<py::array>(obj);
        const char kind = a.dtype().kind();
        if (kind != 'i' && kind != 'u') fail(std::string(name) + ": expected an int32 array");
    }
    auto arr = py::array_t<int32_t, py::array::c_style | py::array::forcecast>::ensure(obj);
    if (!arr) {
        PyErr_Clear();
        fail(std::string(name) + ": expected an int32 array");
    }
    if (arr.ndim() != ndim)
        fail(std::string(name) + ": expected " + std::to_string(ndim) + "-D array, got " +
             std::to_string(arr.ndim()) + "-D");
    return arr;
}

}  // namespace

// ---------------------------------------------------------------- construction

Executor::Executor(std::shared_ptr<EngineFile> file, const py::object& tensors, const py::dict& plan,
                   int num_threads, int kv_block_size, int num_kv_blocks, const std::string& isa)
    : file_(std::move(file)) {
    if (!file_) fail("Executor: file is None");
    if (file_->format_major() != kFormatMajor)
        fail(file_->path() + ": unsupported format version " + std::to_string(file_->format_major()) + "." +
             std::to_string(file_->format_minor()) + " (this runtime reads " + std::to_string(kFormatMajor) + ".x)");
    if (num_threads <= 0) num_threads = omp_get_num_procs();  // 0: all processors
    num_threads_ = num_threads;
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

    load_tensors(tensors);
    load_plan(plan);
    allocate_kv_cache();
}

void Executor::load_tensors(const py::object& tensors) {
    const uint64_t fsize = file_->size(), doff = file_->data_offset();
    const uint8_t* base = file_->data() + doff;
    for (const py::handle& h : tensors) {
        if (!py::isinstance<py::dict>(h)) fail("tensor table entries must be dicts");
        const py::dict d = py::reinterpret_borrow<py::dict>(h);
        auto t = std::make_unique<TensorRef>();
        const py::handle nm = item(d, "name", "tensor");
        if (!py::isinstance<py::str>(nm)) fail("tensor name must be a string");
        t->name = nm.cast<std::string>();
        const std::string where = "tensor " + t->name;
        t->dtype = int(to_int(item(d, "dtype", where), where + ": dtype"));
        t->layout = int(to_int(item(d, "layout", where), where + ": layout"));
        for (const py::handle& s : item(d, "shape", where)) {
            const int64_t v = to_int(s, where + ": shape");
            if (v < 0) fail(where + ": negative dimension in shape");
            t->shape.push_back(v);
        }
        const int64_t offset = to_int(item(d, "offset", where), where + ": offset");
        t->nbytes = to_int(item(d, "nbytes", where), where + ": nbytes");
        if (by_name_.count(t->name)) fail(where + ": duplicate name in the tensor table");

        std::string why;
        const int64_t expect = stored_nbytes(t->dtype, t->layout, t->shape, &why);
        if (expect < 0) fail(where + ": " + why);
        if (t->nbytes != expect)
            fail(where + ": nbytes " + std::to_string(t->nbytes) + " does not match its dtype/layout/shape (" +
                 std::to_string(expect) + " bytes expected)");
        if (offset < 0 || offset % 64 != 0)
            fail(where + ": offset " + std::to_string(offset) + " is not a non-negative multiple of 64");
        if (uint64_t(offset) > fsize || doff + uint64_t(offset) + uint64_t(t->nbytes) > fsize)
            fail(where + ": data [" + std::to_string(offset) + ", +" + std::to_string(t->nbytes) +
                 ") runs past the end of the file");
        t->data = base + offset;
        by_name_[t->name] = t.get();
        tensors_.push_back(std::move(t));
    }
}

ViewRef Executor::parse_view(const py::handle& h, const char* where) const {
    if (!py::isinstance<py::sequence>(h) || py::isinstance<py::str>(h) || py::len(h) != 3)
        fail(std::string(where) + ": a view is [buf, col, width]");
    py::sequence s = py::reinterpret_borrow<py::sequence>(h);
    ViewRef v;
    v.buf = int(to_int(s[0], where));
    v.col = int(to_int(s[1], where));
    v.width = int(to_int(s[2], where));
    if (v.buf < 0 || size_t(v.buf) >= info_.buffers.size() || !info_.buffers[v.buf].defined)
        fail(std::string(where) + ": view refers to unknown buffer " + std::to_string(v.buf));
    const int bw = info_.buffers[v.buf].width;
    if (v.col < 0 || v.width <= 0 || int64_t(v.col) + v.width > bw)
        fail(std::string(where) + ": view [" + std::to_string(v.buf) + ", " + std::to_string(v.col) + ", " +
             std::to_string(v.width) + "] is outside buffer " + std::to_string(v.buf) + " (width " +
             std::to_string(bw) + ")");
    return v;
}

void Executor::load_plan(const py::dict& plan) {
    info_.isa = isa_;
    // Buffers.
    for (const py::handle& h : item(plan, "buffers", "plan")) {
        const py::dict d = py::reinterpret_borrow<py::dict>(h);
        const int64_t id = to_int(item(d, "id", "plan buffer"), "plan buffer id");
        const int64_t width = to_int(item(d, "width", "plan buffer"), "plan buffer width");
        const std::string rows = d.contains("rows") ? d["rows"].cast<std::string>() : "tokens";
        if (id < 0 || id > 1000000) fail("plan buffer id " + std::to_string(id) + " out of range");
        if (width <= 0 || width > (1 << 30)) fail("plan buffer " + std::to_string(id) + ": bad width");
        if (size_t(id) >= info_.buffers.size()) info_.buffers.resize(id + 1);
        BufferInfo& b = info_.buffers[id];
        if (b.defined) fail("plan buffer " + std::to_string(id) + " defined twice");
        b.defined = true;
        b.width = int(width);
        if (rows == "tokens") b.rows = ROWS_TOKENS;
        else if (rows == "selected") b.rows = ROWS_SELECTED;
        else fail("plan buffer " + std::to_string(id) + ": rows must be 'tokens' or 'selected'");
    }
    // KV cache.
    if (plan.contains("kv_cache") && !plan["kv_cache"].is_none()) {
        const py::dict kv = plan["kv_cache"].cast<py::dict>();
        info_.kv_layers = int(to_int(item(kv, "num_layers", "kv_cache"), "kv_cache num_layers"));
        if (info_.kv_layers > 0) {
            info_.kv_heads = int(to_int(item(kv, "num_kv_heads", "kv_cache"), "kv_cache num_kv_heads"));
            info_.head_dim = int(to_int(item(kv, "head_dim", "kv_cache"), "kv_cache head_dim"));
            if (info_.kv_heads <= 0 || info_.head_dim <= 0) fail("kv_cache: num_kv_heads/head_dim must be > 0");
        }
        if (info_.kv_layers < 0) fail("kv_cache: num_layers must be >= 0");
        py::handle dt = kv.contains("dtype") ? py::handle(kv["dtype"]) : py::handle();
        std::string dts = "float32";
        if (dt && py::isinstance<py::str>(dt)) dts = dt.cast<std::string>();
        else if (dt && py::isinstance<py::int_>(dt)) dts = dtype_name(dt.cast<int>());
        info_.kv_dtype = dtype_id(dts);
        const KvDTypeInfo* kvt = kv_dtype_info(info_.kv_dtype);
        if (!kvt) {
            std::string ok;
            for (const KvDTypeInfo& k : kKvDTypes) ok += std::string(ok.empty() ? "" : ", ") + dtype_name(k.dtype);
            fail("kv_cache: dtype '" + dts + "' not supported (" + ok + ")");
        }
        // One-byte codes need their scales; only the dynamic per-(token, head) kind exists.
        const std::string scales = kv.contains("scales") && py::isinstance<py::str>(kv["scales"])
                                       ? kv["scales"].cast<std::string>() : std::string();
        if (kvt->scale_bytes > 0 && scales != kvt->scales)
            fail("kv_cache: dtype " + dts + " needs scales '" + kvt->scales + "', got '" + scales +
                 "'; rebuild the engine");
    }
    info_.vocab_size = int(to_int(item(plan, "vocab_size", "plan"), "plan vocab_size"));
    if (info_.vocab_size <= 0) fail("plan vocab_size must be > 0");
    logits_ = parse_view(item(plan, "logits", "plan"), "plan logits");
    if (logits_.width != info_.vocab_size)
        fail("plan logits view has width " + std::to_string(logits_.width) + ", vocab_size is " +
             std::to_string(info_.vocab_size));
    token_limit_ = info_.vocab_size;

    // Steps.
    int idx = 0;
    bool any_unwindowed = false;
    for (const py::handle& h : item(plan, "steps", "plan")) {
        const std::string where = "plan step " + std::to_string(idx++);
        const py::dict d = py::reinterpret_borrow<py::dict>(h);
        KernelCall c;
        c.op = item(d, "op", where).cast<std::string>();
        c.version = int(to_int(item(d, "version", where), where + ": version"));
        if (d.contains("node") && py::isinstance<py::str>(d["node"])) c.node = d["node"].cast<std::string>();
        const KernelDef* def = find_kernel(c.op, c.version);
        if (!def)
            fail("unsupported kernel " + c.op + "@" + std::to_string(c.version) +
                 ": this runtime supports " + supported_kernels());
        const std::string label = where + " (" + c.op + "@" + std::to_string(c.version) + ")";
        if (d.contains("ins"))
            for (const py::handle& v : d["ins"]) c.ins.push_back(parse_view(v, label.c_str()));
        if (d.contains("outs"))
            for (const py::handle& v : d["outs"]) c.outs.push_back(parse_view(v, label.c_str()));
        if (d.contains("weights"))
            for (const py::handle& w : d["weights"]) {
                const std::string name = w.cast<std::string>();
                auto it = by_name_.find(name);
                if (it == by_name_.end()) fail(label + ": weight '" + name + "' is not in the tensor table");
                c.weights.push_back(it->second);
            }
        if (d.contains("attrs") && !d["attrs"].is_none())
            for (const auto& kv : d["attrs"].cast<py::dict>()) {
                const std::string k = kv.first.cast<std::string>();
                if (!py::isinstance<py::int_>(kv.second) && !py::isinstance<py::float_>(kv.second))
                    fail(label + ": attr '" + k + "' must be a number");
                c.attrs[k] = kv.second.cast<double>();
            }
        def->prepare(c, info_);
        if (c.op == "attention") {
            has_attention_ = true;
            if (c.iv[4] == 0) any_unwindowed = true;
            max_window_ = std::max<int64_t>(max_window_, c.iv[4]);
            max_heads_ = std::max<int>(max_heads_, int(c.iv[1]));
            max_group_ = std::max<int>(max_group_, int(c.iv[1] / c.iv[2]));
        }
        if (c.op == "all_reduce" || c.op == "all_gather") needs_comm_ = true;
        if (c.op == "embedding" || c.op == "embedding_w8a16") token_limit_ = std::min<int64_t>(token_limit_, c.iv[0]);
        calls_.push_back(std::move(c));
        defs_.push_back(def);
    }
    if (any_unwindowed) max_window_ = 0;

    // Buffer pointer tables (storage grows per step).
    bufs_.resize(info_.buffers.size());
    buf_ptrs_.assign(info_.buffers.size(), nullptr);
    buf_width_.assign(info_.buffers.size(), 0);
    for (size_t i = 0; i < info_.buffers.size(); ++i) buf_width_[i] = info_.buffers[i].width;
}

void Executor::allocate_kv_cache() {
    if (info_.kv_layers == 0) return;
    if (has_attention_ && num_kv_blocks_ <= 0) fail("num_kv_blocks must be > 0 for a plan with attention");
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
    for (int l = 0; l < info_.kv_layers; ++l) {
        k_cache_[l].ensure(size_t(per));
        v_cache_[l].ensure(size_t(per));
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
    for (const KernelCall& c : calls_) {
        if (c.op != "all_reduce" && c.op != "all_gather") continue;
        if (c.iv[0] != comm->rank() || c.iv[1] != comm->world())
            fail("this rank file is rank " + std::to_string(c.iv[0]) + " of " + std::to_string(c.iv[1]) +
                 ", the communicator is rank " + std::to_string(comm->rank()) + " of " +
                 std::to_string(comm->world()) + "; start one process per rank file");
    }
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

py::array_t<float> Executor::step(const py::object& token_ids_o, const py::object& positions_o,
                                  const py::object& cu_seqlens_o, const py::object& context_lens_o,
                                  const py::object& block_tables_o, const py::object& logits_indices_o) {
    auto tok_a = as_i32(token_ids_o, "token_ids", 1);
    auto pos_a = as_i32(positions_o, "positions", 1);
    auto cu_a = as_i32(cu_seqlens_o, "cu_seqlens", 1);
    auto ctx_a = as_i32(context_lens_o, "context_lens", 1);
    auto bt_a = as_i32(block_tables_o, "block_tables", 2);
    auto li_a = as_i32(logits_indices_o, "logits_indices", 1);

    const int64_t T = tok_a.shape(0), L = li_a.shape(0);
    if (pos_a.shape(0) != T) fail("positions has " + std::to_string(pos_a.shape(0)) + " entries, token_ids " + std::to_string(T));
    if (cu_a.shape(0) < 1) fail("cu_seqlens must have S+1 >= 1 entries");
    const int64_t S = cu_a.shape(0) - 1;
    if (ctx_a.shape(0) != S) fail("context_lens has " + std::to_string(ctx_a.shape(0)) + " entries, expected S=" + std::to_string(S));
    if (bt_a.shape(0) != S) fail("block_tables has " + std::to_string(bt_a.shape(0)) + " rows, expected S=" + std::to_string(S));
    const int64_t B = bt_a.shape(1);
    if (T > (1 << 24) || L > (1 << 24) || S > (1 << 24) || B > (1 << 24)) fail("step inputs too large");

    const int32_t* tok = tok_a.data();
    const int32_t* pos = pos_a.data();
    const int32_t* cu = cu_a.data();
    const int32_t* ctxl = ctx_a.data();
    const int32_t* bt = bt_a.data();
    const int32_t* li = li_a.data();
    const int64_t bs = kv_block_size_;

    for (int64_t t = 0; t < T; ++t)
        if (tok[t] < 0 || tok[t] >= token_limit_)
            fail("token_ids[" + std::to_string(t) + "]=" + std::to_string(tok[t]) + " outside [0, " +
                 std::to_string(token_limit_) + ")");
    if (cu[0] != 0 || cu[S] != T) fail("cu_seqlens must start at 0 and end at T=" + std::to_string(T));
    for (int64_t i = 0; i < S * B; ++i)
        if (bt[i] < -1 || bt[i] >= num_kv_blocks_)
            fail("block_tables entry " + std::to_string(bt[i]) + " outside [-1, " + std::to_string(num_kv_blocks_) + ")");
    int max_ctx = 1;
    for (int64_t s = 0; s < S; ++s) {
        if (cu[s + 1] < cu[s]) fail("cu_seqlens must be non-decreasing");
        const int64_t cl = ctxl[s];
        if (cl < 0 || cl > B * bs)
            fail("context_lens[" + std::to_string(s) + "]=" + std::to_string(cl) + " outside [0, " +
                 std::to_string(B * bs) + "] (block_tables width x kv_block_size)");
        max_ctx = std::max<int>(max_ctx, int(cl));
        int64_t pmin = std::numeric_limits<int64_t>::max(), pmax = -1;
        for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
            if (pos[t] < 0 || pos[t] >= cl)
                fail("positions[" + std::to_string(t) + "]=" + std::to_string(pos[t]) + " outside [0, context_lens[" +
                     std::to_string(s) + "]=" + std::to_string(cl) + ")");
            pmin = std::min<int64_t>(pmin, pos[t]);
            pmax = std::max<int64_t>(pmax, pos[t]);
        }
        if (has_attention_ && pmax >= 0) {
            const int64_t lo = max_window_ > 0 ? std::max<int64_t>(0, pmin - max_window_ + 1) : 0;
            for (int64_t b = lo / bs; b <= pmax / bs; ++b)
                if (bt[s * B + b] < 0)
                    fail("block_tables[" + std::to_string(s) + "][" + std::to_string(b) +
                         "] is -1 but the step reads or writes that block");
        }
    }
    for (int64_t i = 0; i < L; ++i)
        if (li[i] < 0 || li[i] >= T)
            fail("logits_indices[" + std::to_string(i) + "]=" + std::to_string(li[i]) + " outside [0, " +
                 std::to_string(T) + ")");

    if (needs_comm_ && !comm_)
        fail("this is one rank of a tensor-parallel engine; run it through LLM (which starts every rank) "
             "or attach a communicator first");

    py::array_t<float> out({L, int64_t(info_.vocab_size)});
    float* out_ptr = out.mutable_data();
    {
        py::gil_scoped_release release;
        std::lock_guard<std::mutex> lock(mu_);
        run_steps(int(T), int(S), int(L), int(B), tok, pos, cu, ctxl, bt, li, max_ctx, out_ptr);
    }
    return out;
}

void Executor::run_steps(int T, int S, int L, int B, const int32_t* tok, const int32_t* pos,
                         const int32_t* cu, const int32_t* ctxl, const int32_t* bt, const int32_t* li,
                         int max_ctx, float* logits_out) {
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
    int64_t scratch_floats = 0;
    if (has_attention_) {
        scratch_floats = attention_scratch_floats(max_ctx, max_heads_, info_.head_dim);
        if (scratch_.size() < size_t(num_threads_)) scratch_.resize(num_threads_);
        scratch_ptrs_.resize(num_threads_);
        for (int i = 0; i < num_threads_; ++i) {
            scratch_[i].ensure(size_t(scratch_floats) * sizeof(float));
            scratch_ptrs_[i] = static_cast<float*>(scratch_[i].get());
        }
    }

    iwork_.resize(std::max<size_t>(iwork_.size(), size_t(4) * (S + 1) + T + 64));
    if (has_attention_ && fwork_.empty()) {
        const int64_t want = 8LL * num_threads_ * num_threads_ * max_heads_ * (info_.head_dim + 2) + 64;
        fwork_.resize(size_t(std::min<int64_t>(want, int64_t(1) << 22)));
    }

    StepContext ctx;
    ctx.T = T;
    ctx.S = S;
    ctx.L = L;
    ctx.B = B;
    ctx.token_ids = tok;
    ctx.positions = pos;
    ctx.cu_seqlens = cu;
    ctx.context_lens = ctxl;
    ctx.block_tables = bt;
    ctx.logits_indices = li;
    ctx.seq_of_row = seq_of_row_.data();
    ctx.buf = buf_ptrs_.data();
    ctx.buf_width = buf_width_.data();
    ctx.nthreads = num_threads_;
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
