// Executor: runs an ExecutionPlan (format/plan.py) over a mmapped rank file: the cpu target.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rank_file.h"
#include "kernel_api.h"

namespace bessemer {

namespace py = pybind11;

// 64-byte aligned heap block that only grows (contents are not preserved on growth).
class AlignedBuf {
   public:
    AlignedBuf() = default;
    AlignedBuf(const AlignedBuf&) = delete;
    AlignedBuf& operator=(const AlignedBuf&) = delete;
    AlignedBuf(AlignedBuf&& o) noexcept : p_(o.p_), cap_(o.cap_) { o.p_ = nullptr; o.cap_ = 0; }
    ~AlignedBuf();
    void ensure(size_t bytes);
    void* get() const { return p_; }
    size_t capacity() const { return cap_; }

   private:
    void* p_ = nullptr;
    size_t cap_ = 0;
};

struct CpuFeatures {
    bool avx2, fma, f16c, avx512f, avx512bw, avx512vl, avx512dq, avx512_bf16, avx512_vnni;
};
CpuFeatures detect_cpu_features();

class Executor {
   public:
    // Reads the plan and tensor table from the rank file's own header (format/csrc/plan.h).
    Executor(std::shared_ptr<EngineFile> file, int num_threads, int kv_block_size, int num_kv_blocks,
             const std::string& isa);

    // batch: any object with the six int32 arrays of a StepBatch (format/step.py).
    py::array_t<float> step(const py::object& batch);

    std::string isa() const { return isa_ == Isa::AVX512 ? "avx512" : "avx2"; }
    int num_threads() const { return num_threads_; }
    // Threads the next steps use, 1..num_threads (scratch stays sized for num_threads):
    // fewer when other processes hold cores, so no worker waits at a barrier for a
    // descheduled peer. Results do not depend on it (threads split rows/columns, never a sum).
    int active_threads() const { return active_threads_; }
    void set_active_threads(int n) { active_threads_ = n < 1 ? 1 : (n > num_threads_ ? num_threads_ : n); }
    int num_kv_blocks() const { return num_kv_blocks_; }
    int kv_block_size() const { return kv_block_size_; }
    int64_t kv_cache_bytes() const { return kv_cache_bytes_; }
    std::vector<std::string> kernels() const;
    // The tensor-parallel group this rank's collectives (all_reduce, all_gather) run over;
    // refused unless its rank and size are the plan's.
    void attach_communicator(std::shared_ptr<Collectives> comm);
    bool needs_communicator() const { return needs_.tp_size > 0; }
    // Optional per-op timing (off by default): op -> (calls, seconds) since enabled.
    void set_profiling(bool on);
    bool profiling() const { return profiling_; }
    py::dict profile_stats();

   private:
    void load_plan(const PlanDesc& plan);
    void allocate_kv_cache();
    void run_steps(const StepBatch& batch, int max_ctx, float* logits_out);

    std::shared_ptr<EngineFile> file_;
    Isa isa_ = Isa::AVX2;
    int num_threads_ = 1, active_threads_ = 1, kv_block_size_ = 0, num_kv_blocks_ = 0;
    int64_t kv_cache_bytes_ = 0;

    RankHeader header_;  // tensor table (pointers into the mapped file) and plan

    PlanInfo info_;
    std::vector<KernelCall> calls_;
    std::vector<const KernelDef*> defs_;
    ViewRef logits_;
    // Every call's KernelNeeds, combined: the largest scratch and workspaces, whether any
    // reads the KV cache (and the widest window: 0 when one reads from position 0), any
    // collective, the tightest token limit.
    KernelNeeds needs_;
    StepLimits limits_;

    // Activation buffers, by buffer id.
    std::vector<AlignedBuf> bufs_;
    std::vector<float*> buf_ptrs_;
    std::vector<int> buf_width_;
    // KV cache, per layer.
    std::vector<AlignedBuf> k_cache_, v_cache_;
    std::vector<void*> k_ptrs_, v_ptrs_;
    // Per-(token, head) scales of an int8/fp8 cache, per layer ([num_blocks, block_size, Hkv]).
    std::vector<AlignedBuf> k_scale_, v_scale_;
    std::vector<float*> k_scale_ptrs_, v_scale_ptrs_;
    // Per-thread scratch and per-step row -> sequence map.
    std::vector<AlignedBuf> scratch_;
    std::vector<float*> scratch_ptrs_;
    std::vector<int32_t> seq_of_row_;
    std::vector<int32_t> iwork_;
    std::vector<float> fwork_;

    struct ProfileEntry {
        int64_t calls = 0;
        double seconds = 0.0;
    };
    bool profiling_ = false;
    std::map<std::string, ProfileEntry> profile_;

    std::shared_ptr<Collectives> comm_;

    std::mutex mu_;  // one step at a time
};

}  // namespace bessemer
