#include "executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace bessemer {
namespace cuda {

namespace {

constexpr uint64_t kRegionAlign = 256;

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

void check_divisible(uint64_t value, uint32_t divisibility, const KernelSpec& k, const ParamSpec& p) {
    if (divisibility > 1 && value % divisibility)
        bad("kernel " + k.entry + ": " + p.name + " = " + std::to_string(value) + " is not divisible by " +
            std::to_string(divisibility) + ", which the kernel was compiled to assume");
}

// The largest value each count can take: what scratch and graphs are sized for.
Counts max_counts(const LaunchPlan& plan) {
    Counts c{};
    c[kTokens] = plan.max_num_tokens;
    c[kSelected] = plan.step_inputs[kLogitsIndices].elems;
    c[kSeqs] = plan.max_batch_size;
    c[kPrefillTiles] = plan.step_inputs[kPrefillTilesArr].elems / 2;
    c[kDecodeSeqs] = plan.max_batch_size;
    return c;
}

// A launch's failure: "<cause> in node N (op O, kernel K), launch i of" + the step + note.
struct LaunchError : CudaError {
    LaunchError(cu::CUresult code_, const std::string& cause, const std::string& where, const std::string& note_)
        : CudaError(code_, cause + where), note(note_) {}
    std::string message(const std::string& step) const { return std::string(what()) + " " + step + note; }
    std::string note;
};

// Errors that a launch call reports about the launch itself, never an earlier kernel's fault.
bool about_this_launch(cu::CUresult r) {
    return r == cu::CUDA_ERROR_INVALID_VALUE || r == cu::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
}

std::string rerun_hint() {
    return std::string("; rerun with ") + kSyncEnv + "=1 to name the node and kernel that faulted";
}

}  // namespace

bool sync_launches_from_environment() {
    const char* v = std::getenv(kSyncEnv);
    const std::string value = v ? v : "";
    if (value.empty() || value == "0") return false;
    if (value == "1") return true;
    bad(std::string(kSyncEnv) + "='" + value + "' is not a flag: set it to 1 (synchronize after every launch) or 0");
}

Executor::Executor(std::shared_ptr<Device> device, const EngineFile& file, LaunchPlan plan,
                   const LoadOptions& options)
    : device_(std::move(device)), plan_(std::move(plan)), sync_launches_(options.sync_launches) {
    device_->make_current();
    stream_ = std::make_unique<Stream>(device_);
    // tensor offsets and sizes were checked against the file by the contract (plan.h)
    const uint8_t* data = file.data() + file.data_offset();
    upload_weights(data, options);
    load_kernels(data);
    allocate_activations();
    staging_ = std::make_unique<PinnedBuffer>(device_, capacity_bytes(plan_));
    tokens_out_ = std::make_unique<PinnedBuffer>(device_, uint64_t(plan_.step_inputs[kSampledTokens].elems) * 4);
    // A decode step's logits (one row per sequence) land here; a step with more rows (prompt
    // logprobs, scoring) is rarer and would need max_num_tokens rows of pinned memory.
    host_logits_rows_ = std::min<int64_t>(plan_.max_batch_size, plan_.step_inputs[kLogitsIndices].elems);
    host_logits_ = std::make_shared<PinnedBuffer>(device_, uint64_t(host_logits_rows_) * uint64_t(plan_.vocab_size) * 4);
}

Executor::~Executor() {
    device_->make_current();
    device_->api().cuStreamSynchronize(stream_->get());
    for (auto& kv : graphs_) device_->api().cuGraphExecDestroy(kv.second);
}

void Executor::upload_weights(const uint8_t* data, const LoadOptions& options) {
    if (plan_.weights.empty()) return;
    uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& w : plan_.weights) {
        lo = std::min(lo, w.offset);
        hi = std::max(hi, w.offset + w.nbytes);
    }
    weights_ = DeviceAllocation(device_, hi - lo, "the weights");
    upload(device_, *stream_, weights_.ptr(), data + lo, hi - lo, options.upload_chunk_bytes, options.drop_source_pages,
           options.progress);
    for (const auto& w : plan_.weights) weight_ptrs_.push_back(weights_.ptr() + (w.offset - lo));
}

void Executor::load_kernels(const uint8_t* data) {
    for (size_t i = 0; i < plan_.kernels.size(); ++i) {
        const WeightRef& cubin = plan_.kernel_cubins[i];
        kernels_.push_back(std::make_unique<Kernel>(device_, data + cubin.offset, cubin.nbytes, plan_.kernels[i]));
    }
}

void Executor::allocate_activations() {
    // Offsets first, then one allocation: buffers, workspace, step inputs, Triton scratch.
    uint64_t at = 0;
    std::vector<uint64_t> buffer_at, workspace_at;
    for (const auto& b : plan_.buffers) {
        buffer_at.push_back(at = align_up(at, kRegionAlign));
        at += uint64_t(plan_.max_num_tokens) * uint64_t(b.width) * uint64_t(b.elem_bytes);
    }
    for (const auto& w : plan_.workspace) {
        workspace_at.push_back(at = align_up(at, kRegionAlign));
        at += uint64_t(w.elems) * uint64_t(w.elem_bytes);
    }
    const uint64_t step_at = at = align_up(at, kRegionAlign);
    at += capacity_bytes(plan_);
    // Triton scratch: size x programs of the largest grid any launch of the kernel can have.
    const Counts most = max_counts(plan_);
    uint64_t global_need = 0, global_align = kRegionAlign, profile_need = 0, profile_align = kRegionAlign;
    for (const auto* items : {&plan_.forward, &plan_.sample})
        for (const auto& item : *items)
            for (const auto& c : item.cases) {
                const KernelSpec& k = plan_.kernels[size_t(c.kernel)];
                const uint64_t programs = uint64_t(c.grid[0].eval(most) * c.grid[1].eval(most) * c.grid[2].eval(most)) *
                                          uint64_t(k.num_ctas);
                global_need = std::max(global_need, programs * k.global_scratch_size);
                profile_need = std::max(profile_need, programs * k.profile_scratch_size);
                global_align = std::max<uint64_t>(global_align, k.global_scratch_align);
                profile_align = std::max<uint64_t>(profile_align, k.profile_scratch_align);
            }
    const uint64_t global_at = at = align_up(at, global_align);
    at += global_need;
    const uint64_t profile_at = at = align_up(at, profile_align);
    at += profile_need;
    activations_ = DeviceAllocation(device_, at, "activations (" + std::to_string(plan_.max_num_tokens) + " tokens)");
    // Zeroed once so that no step ever reads uninitialized memory, even in padding.
    device_->check(device_->api().cuMemsetD8Async(activations_.ptr(), 0, at, stream_->get()), "cuMemsetD8Async");
    stream_->synchronize("activations");
    for (uint64_t off : buffer_at) buffer_ptrs_.push_back(activations_.ptr() + off);
    for (uint64_t off : workspace_at) workspace_ptrs_.push_back(activations_.ptr() + off);
    for (size_t i = 0; i < plan_.workspace.size(); ++i) {
        const ArraySpec& w = plan_.workspace[i];
        const std::string suffix = "counters";  // split_k_counters: zero between launches
        if (w.name.size() >= suffix.size() && w.name.compare(w.name.size() - suffix.size(), suffix.size(), suffix) == 0)
            counters_.push_back({workspace_ptrs_[i], uint64_t(w.elems) * uint64_t(w.elem_bytes)});
    }
    step_base_ = activations_.ptr() + step_at;
    global_scratch_ = global_need ? activations_.ptr() + global_at : 0;
    profile_scratch_ = profile_need ? activations_.ptr() + profile_at : 0;
}

uint64_t Executor::kv_bytes_per_block() const {
    return uint64_t(plan_.kv_block_size) *
           uint64_t(kv_bytes_per_token(plan_.kv.layers, plan_.kv.heads, plan_.kv.head_dim, plan_.kv.dtype));
}

void Executor::allocate_kv_cache(int64_t num_blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    if (num_blocks < 1) bad("the KV cache needs at least one block");
    if (num_blocks_) bad("the KV cache is already allocated");
    // one more block than the block manager may hand out: decode graphs' padding rows write there
    kv_layer_bytes_ = align_up(uint64_t(num_blocks + 1) * kv_bytes_per_block() / (2 * uint64_t(plan_.kv.layers)),
                               kRegionAlign);
    kv_ = DeviceAllocation(device_, kv_layer_bytes_ * 2 * uint64_t(plan_.kv.layers),
                           "the KV cache (" + std::to_string(num_blocks) + " blocks)");
    device_->check(device_->api().cuMemsetD8Async(kv_.ptr(), 0, kv_.bytes(), stream_->get()), "cuMemsetD8Async");
    stream_->synchronize("KV cache");
    num_blocks_ = num_blocks;
    pack_all();
}

uint64_t Executor::pointer_of(const Arg& a) const {
    switch (a.region) {
        case Region::Null: return 0;
        case Region::Buffer: return buffer_ptrs_[size_t(a.index)] + a.offset;
        case Region::Weight: return weight_ptrs_[size_t(a.index)];
        case Region::KvK: return kv_.ptr() + uint64_t(2 * a.index) * kv_layer_bytes_;
        case Region::KvV: return kv_.ptr() + uint64_t(2 * a.index + 1) * kv_layer_bytes_;
        case Region::Workspace: return workspace_ptrs_[size_t(a.index)];
        case Region::Step: break;
    }
    bad("step-input pointers are patched per step");
}

void Executor::pack_all() {
    auto pack = [&](const std::vector<LaunchItem>& items) {
        std::vector<std::vector<Packed>> out;
        for (const auto& item : items) {
            std::vector<Packed> cases;
            for (const auto& c : item.cases) {
                const KernelSpec& k = plan_.kernels[size_t(c.kernel)];
                Packed p;
                p.bytes.assign(k.packed_bytes(), 0);
                for (size_t i = 0; i < c.args.size(); ++i) {
                    const Arg& a = c.args[i];
                    const ParamSpec& param = k.params[i];
                    uint8_t* dst = p.bytes.data() + param.offset;
                    if (a.kind == Arg::Kind::Count || (a.kind == Arg::Kind::Pointer && a.region == Region::Step)) {
                        p.patches.push_back(Patch{param.offset, a.kind, a.index, param.divisibility});
                    } else if (a.kind == Arg::Kind::Pointer) {
                        const uint64_t v = pointer_of(a);
                        if (a.region != Region::Null) check_divisible(v, param.divisibility, k, param);
                        std::memcpy(dst, &v, 8);
                    } else if (a.kind == Arg::Kind::I32) {
                        check_divisible(uint64_t(uint32_t(a.i32)), param.divisibility, k, param);
                        std::memcpy(dst, &a.i32, 4);
                    } else {
                        std::memcpy(dst, &a.f32, 4);  // its IEEE bits
                    }
                }
                const uint64_t scratch[2] = {k.global_scratch_size ? global_scratch_ : 0,
                                             k.profile_scratch_size ? profile_scratch_ : 0};
                for (int s = 0; s < 2; ++s) std::memcpy(p.bytes.data() + k.params[c.args.size() + size_t(s)].offset, &scratch[s], 8);
                cases.push_back(std::move(p));
            }
            out.push_back(std::move(cases));
        }
        return out;
    };
    forward_packed_ = pack(plan_.forward);
    sample_packed_ = pack(plan_.sample);
}

void Executor::run_launches(const std::vector<LaunchItem>& items, std::vector<std::vector<Packed>>& packed,
                            const Counts& counts, const StepLayout& layout, int64_t* launched) {
    const cu::CUstream stream = stream_->get();
    const auto& api = device_->api();
    for (size_t i = 0; i < items.size(); ++i) {
        const LaunchItem& item = items[i];
        const LaunchCase& c = item.pick(counts);
        Packed& p = packed[i][size_t(&c - item.cases.data())];
        const Kernel& kernel = *kernels_[size_t(c.kernel)];
        std::array<uint32_t, 3> grid;
        for (int d = 0; d < 3; ++d) {
            const int64_t g = c.grid[size_t(d)].eval(counts);
            if (g > (d == 0 ? 0x7FFFFFFF : 65535)) bad("launch " + item.node + ": grid dimension " + std::to_string(g) + " too large");
            grid[size_t(d)] = uint32_t(g);
        }
        if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) continue;
        for (const Patch& patch : p.patches) {
            if (patch.kind == Arg::Kind::Count) {
                const int32_t v = int32_t(counts[size_t(patch.index)]);
                if (patch.divisibility > 1 && v % int32_t(patch.divisibility))
                    bad("launch " + item.node + ": count " + count_name(patch.index) + " = " + std::to_string(v) +
                        " breaks the kernel's divisibility assumption");
                std::memcpy(p.bytes.data() + patch.offset, &v, 4);
            } else {
                const uint64_t v = step_base_ + layout.offset[size_t(patch.index)];
                std::memcpy(p.bytes.data() + patch.offset, &v, 8);
            }
        }
        ++*launched;
        // Kernel::launch's CudaError, or the synchronize's: named by node, op and kernel
        auto where = [&] {
            return " in node " + item.node + " (op " + item.op + ", kernel " + kernel.spec().entry + "), launch " +
                   std::to_string(*launched) + " of";
        };
        try {
            kernel.launch(stream, grid, p.bytes.data());
        } catch (const CudaError& e) {
            const bool maybe_earlier = !sync_launches_ && !about_this_launch(e.code);
            throw LaunchError(e.code, e.what(), where(),
                              maybe_earlier ? "; an earlier kernel's fault can surface at a later launch" + rerun_hint()
                                            : "");
        }
        ++stats_.launches;
        if (sync_launches_) {
            const cu::CUresult r = api.cuStreamSynchronize(stream);
            if (r != cu::CUDA_SUCCESS)
                throw LaunchError(r, device_->driver()->error_text(r), where(),
                                  std::string(", found by the synchronize after it (") + kSyncEnv + "=1)");
        }
    }
}

void Executor::capture_graphs(const std::vector<int64_t>& buckets) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!num_blocks_) bad("allocate the KV cache before capturing graphs");
    device_->make_current();
    const auto& api = device_->api();
    for (int64_t b : buckets) {
        if (b < 1 || b > plan_.max_batch_size || b > plan_.max_num_tokens)
            bad("graph bucket " + std::to_string(b) + " is outside 1..min(max_batch_size, max_num_tokens)");
        if (graphs_.count(b) || sync_launches_) continue;
        Counts c{};
        c[kTokens] = c[kSelected] = c[kSeqs] = c[kDecodeSeqs] = b;
        const StepLayout layout = layout_for(plan_, c);
        // Thread-local: a CUDA call another thread makes meanwhile (torch in the same process,
        // a second executor) neither invalidates this capture nor is refused because of it.
        device_->check(api.cuStreamBeginCapture(stream_->get(), cu::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                       "cuStreamBeginCapture");
        cu::CUgraph graph = nullptr;
        try {
            int64_t launched = 0;
            run_launches(plan_.forward, forward_packed_, c, layout, &launched);
            run_launches(plan_.sample, sample_packed_, c, layout, &launched);
        } catch (...) {
            api.cuStreamEndCapture(stream_->get(), &graph);
            if (graph) api.cuGraphDestroy(graph);
            throw;
        }
        device_->check(api.cuStreamEndCapture(stream_->get(), &graph), "cuStreamEndCapture");
        cu::CUgraphExec exec = nullptr;
        const cu::CUresult r = api.cuGraphInstantiateWithFlags(&exec, graph, 0);
        api.cuGraphDestroy(graph);
        device_->check(r, "cuGraphInstantiateWithFlags (decode batch " + std::to_string(b) + ")");
        graphs_[b] = exec;
    }
}

std::vector<int64_t> Executor::graph_buckets() const {
    std::vector<int64_t> out;
    for (const auto& kv : graphs_) out.push_back(kv.first);
    return out;
}

std::string Executor::failure() const {
    std::lock_guard<std::mutex> lock(mu_);
    return failure_;
}

std::shared_ptr<PinnedBuffer> Executor::lease_host_logits(int64_t rows) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rows > host_logits_rows_ || host_logits_.use_count() > 1) return nullptr;
    return host_logits_;
}

void Executor::recover_from_failed_step(const std::string& error) {
    const auto& api = device_->api();
    const cu::CUstream stream = stream_->get();
    cu::CUresult r = api.cuStreamSynchronize(stream);
    for (const auto& c : counters_)
        if (r == cu::CUDA_SUCCESS) r = api.cuMemsetD8Async(c.first, 0, c.second, stream);
    if (r == cu::CUDA_SUCCESS && !counters_.empty()) r = api.cuStreamSynchronize(stream);
    if (r != cu::CUDA_SUCCESS) {
        failure_ = error;
        failure_code_ = r;
    }
}

void Executor::step(const StepRequest& request, const StepOutput& out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!num_blocks_) bad("allocate the KV cache before running a step");
    if (!failure_.empty())
        throw CudaError(failure_code_, "the GPU failed in an earlier step and a CUDA context does not recover from "
                                       "that; restart the process (the failure: " + failure_ + ")");
    device_->make_current();
    const auto& api = device_->api();
    int64_t bucket = 0;
    if (use_graphs_ && !sync_launches_ && is_decode(request)) {
        auto it = graphs_.lower_bound(request.batch.S);
        if (it != graphs_.end()) bucket = it->first;
    }
    StepLayout layout;
    // host work only: a request it refuses leaves nothing enqueued
    const Counts counts = derive_step(plan_, request, num_blocks_, bucket, int32_t(num_blocks_), staging_->data(), &layout);
    const cu::CUstream stream = stream_->get();
    ++steps_started_;
    int64_t launched = 0;
    // "step 12 (eager: 8 tokens, 2 sequences, 41 launches)", for an error's message
    auto which_step = [&] {
        const std::string n = std::to_string(steps_started_);
        if (bucket)
            return "step " + n + " (decode graph of batch " + std::to_string(bucket) + " for " +
                   std::to_string(counts[kSeqs]) + " sequences)";
        return "step " + n + " (eager: " + std::to_string(counts[kTokens]) + " tokens, " +
               std::to_string(counts[kSeqs]) + " sequences, " + std::to_string(launched) + " launches)";
    };
    try {
        if (layout.upload_bytes) {  // the one copy of the step's inputs
            device_->check(api.cuMemcpyHtoDAsync(step_base_, staging_->data(), layout.upload_bytes, stream),
                           "cuMemcpyHtoDAsync (step inputs)");
            stats_.uploaded_bytes += int64_t(layout.upload_bytes);
        }
        if (bucket) {
            device_->check(api.cuGraphLaunch(graphs_[bucket], stream), "cuGraphLaunch");
        } else {
            run_launches(plan_.forward, forward_packed_, counts, layout, &launched);
            if (out.tokens) run_launches(plan_.sample, sample_packed_, counts, layout, &launched);
        }
        copy_out(counts, layout, request.batch.L, out);
    } catch (const LaunchError& e) {
        const std::string what = e.message(which_step());
        recover_from_failed_step(what);
        throw CudaError(e.code, what);
    } catch (const CudaError& e) {
        // no launch is named: the fault of any kernel the step ran surfaces here
        std::string what = std::string(e.what()) + " in " + which_step();
        if (!sync_launches_) what += rerun_hint();
        recover_from_failed_step(what);
        throw CudaError(e.code, what);
    } catch (...) {
        recover_from_failed_step("a step failed on the host");
        throw;
    }
    ++(bucket ? stats_.graph_steps : stats_.eager_steps);
    ++stats_.steps;
}

void Executor::copy_out(const Counts& counts, const StepLayout& layout, int64_t rows, const StepOutput& out) {
    (void)counts;
    const auto& api = device_->api();
    const cu::CUstream stream = stream_->get();
    if (out.tokens && rows)
        device_->check(api.cuMemcpyDtoHAsync(tokens_out_->data(), step_base_ + layout.offset[kSampledTokens],
                                             uint64_t(rows) * 4, stream),
                       "cuMemcpyDtoHAsync (sampled tokens)");
    if (out.logits && rows)
        device_->check(api.cuMemcpyDtoHAsync(out.logits, buffer_ptrs_[size_t(plan_.logits_buffer)],
                                             uint64_t(rows) * uint64_t(plan_.vocab_size) * 4, stream),
                       "cuMemcpyDtoHAsync (logits)");
    stream_->synchronize("step");
    if (out.tokens) std::memcpy(out.tokens, tokens_out_->data(), uint64_t(rows) * 4);
}

std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> Executor::memory_map() const {
    std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> m;
    for (size_t i = 0; i < plan_.weights.size(); ++i)
        m.push_back({"weight:" + plan_.weights[i].name, {weight_ptrs_[i], plan_.weights[i].nbytes}});
    for (size_t i = 0; i < plan_.buffers.size(); ++i)
        m.push_back({"buffer:" + std::to_string(plan_.buffers[i].id),
                     {buffer_ptrs_[i], uint64_t(plan_.max_num_tokens * plan_.buffers[i].width * plan_.buffers[i].elem_bytes)}});
    for (size_t i = 0; i < plan_.workspace.size(); ++i)
        m.push_back({"workspace:" + plan_.workspace[i].name,
                     {workspace_ptrs_[i], uint64_t(plan_.workspace[i].elems * plan_.workspace[i].elem_bytes)}});
    m.push_back({"step", {step_base_, capacity_bytes(plan_)}});
    if (num_blocks_)
        for (int l = 0; l < plan_.kv.layers; ++l) {
            m.push_back({"kv:k:" + std::to_string(l), {kv_.ptr() + uint64_t(2 * l) * kv_layer_bytes_, kv_layer_bytes_}});
            m.push_back({"kv:v:" + std::to_string(l), {kv_.ptr() + uint64_t(2 * l + 1) * kv_layer_bytes_, kv_layer_bytes_}});
        }
    if (global_scratch_) m.push_back({"scratch:global", {global_scratch_, 0}});
    return m;
}

void Executor::read_device(uint64_t ptr, uint64_t bytes, void* out) {
    std::lock_guard<std::mutex> lock(mu_);
    device_->make_current();
    device_->check(device_->api().cuMemcpyDtoHAsync(out, ptr, bytes, stream_->get()), "cuMemcpyDtoHAsync (read)");
    stream_->synchronize("read");
}

}  // namespace cuda
}  // namespace bessemer
