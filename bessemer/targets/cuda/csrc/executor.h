// Executor: runs a cuda engine's launch list (targets/cuda/plan.py) on one GPU.
//
// Load (constructor): from the rank file as the contract mapped and checked it
// (format/csrc/rank_file.h, plan.h), the weights are uploaded once into one device
// allocation through bounded pinned staging; every kernel's cubin is loaded and
// its parameter table checked; activations (the plan's buffers, max_num_tokens rows each),
// workspace, step-input region and Triton scratch are allocated in one block.
// allocate_kv_cache(n): the paged KV cache, n blocks plus one padding block that decode
// graphs point their padding rows at (the block manager never hands it out). Then every
// launch's parameter bytes are packed once; a step only patches its counts and step-input
// pointers. capture_graphs(buckets): one CUDA graph per decode batch size.
//
// step(): host derives the step inputs (step_inputs.h) into pinned staging, one copy up,
// then either the launches (eager: prefill and mixed steps, or graphs off) or one graph
// replay (a decode step padded to the smallest bucket that holds it), optional sampling on
// the device, and the sampled tokens and/or logits copied back. Nothing is allocated on
// the device during a step.
//
// Faults. Kernels run asynchronously, so a device fault (an illegal address) surfaces at
// the step's closing synchronize: the error names the step and says to rerun with
// BESSEMER_CUDA_SYNC=1. In that mode (LoadOptions::sync_launches) every step runs eagerly
// (no graph is captured) and the stream is synchronized after every launch, so the error
// names the plan node, its op and the kernel. A launch the driver refuses names them in
// either mode.
//
// A step that fails waits for everything it enqueued (the next step reuses the pinned
// staging and the device step region) and zeroes the split-K counters (a kernel stopped
// part way can leave some set); the executor then takes the next step. When the device
// itself failed (that wait or reset fails too: a CUDA context does not recover from a
// fault), the executor is marked failed: failure() says why and every later step refuses.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_memory.h"
#include "driver.h"
#include "kernel.h"
#include "launch_plan.h"
#include "rank_file.h"
#include "step_inputs.h"

namespace bessemer {
namespace cuda {

// "1": every launch is followed by a stream synchronize that names the failing node.
constexpr const char* kSyncEnv = "BESSEMER_CUDA_SYNC";
// $BESSEMER_CUDA_SYNC as a flag ("", "0": off; "1": on); throws std::invalid_argument otherwise.
bool sync_launches_from_environment();

struct LoadOptions {
    uint64_t upload_chunk_bytes = 64ull << 20;  // each of the two pinned staging buffers
    bool drop_source_pages = true;              // release uploaded pages of the mapping
    bool sync_launches = false;                 // eager steps, synchronize after every launch
    Progress progress;                          // weight upload progress
};

struct StepOutput {
    int32_t* tokens = nullptr;  // [selected] sampled on the device, or null: no sampling
    float* logits = nullptr;    // [selected, vocab] copied back (best into lease_host_logits()), or null
};

struct ExecutorStats {
    int64_t steps = 0, eager_steps = 0, graph_steps = 0, launches = 0, uploaded_bytes = 0;
};

class Executor {
   public:
    // file: the rank file `plan` was read from (plan_parse.h); only the constructor reads it.
    Executor(std::shared_ptr<Device> device, const EngineFile& file, LaunchPlan plan, const LoadOptions& options);
    ~Executor();
    Executor(const Executor&) = delete;
    Executor& operator=(const Executor&) = delete;

    const LaunchPlan& plan() const { return plan_; }
    const std::shared_ptr<Device>& device() const { return device_; }
    uint64_t kv_bytes_per_block() const;
    void allocate_kv_cache(int64_t num_blocks);
    int64_t num_kv_blocks() const { return num_blocks_; }
    uint64_t kv_cache_bytes() const { return kv_.bytes(); }
    uint64_t weight_bytes() const { return weights_.bytes(); }
    uint64_t activation_bytes() const { return activations_.bytes(); }

    // Decode batch sizes to capture (each <= max_batch_size and <= max_num_tokens). Captures
    // nothing under sync_launches: every step is eager there.
    void capture_graphs(const std::vector<int64_t>& buckets);
    std::vector<int64_t> graph_buckets() const;
    void set_use_graphs(bool on) { use_graphs_ = on; }
    bool use_graphs() const { return use_graphs_; }

    void step(const StepRequest& request, const StepOutput& out);
    ExecutorStats stats() const { return stats_; }
    bool sync_launches() const { return sync_launches_; }
    // Why no step can run any more (the device failed during one), or "".
    std::string failure() const;

    // The pinned host buffer logits are copied into at full bus speed (allocated at load for
    // host_logits_rows() rows: a decode step's, max_batch_size), while nobody else holds it:
    // the caller keeps the returned reference for as long as it reads the logits there, and
    // the next step that finds it still held copies into the caller's own memory instead.
    // Null when it is held or `rows` is more than it has.
    std::shared_ptr<PinnedBuffer> lease_host_logits(int64_t rows);
    int64_t host_logits_rows() const { return host_logits_rows_; }

    // Named device regions (name -> (pointer, bytes)) and reading device memory back:
    // for the launcher tests and the GPU checks.
    std::vector<std::pair<std::string, std::pair<uint64_t, uint64_t>>> memory_map() const;
    void read_device(uint64_t ptr, uint64_t bytes, void* out);

   private:
    struct Patch {
        uint32_t offset;
        Arg::Kind kind;  // Pointer (a step array) or Count
        int index;
        uint32_t divisibility;
    };
    struct Packed {  // one launch case's parameter bytes, packed at load
        std::vector<uint8_t> bytes;
        std::vector<Patch> patches;
    };

    void upload_weights(const uint8_t* data, const LoadOptions& options);
    void load_kernels(const uint8_t* data);
    void allocate_activations();
    uint64_t pointer_of(const Arg& a) const;
    void pack_all();
    void run_launches(const std::vector<LaunchItem>& items, std::vector<std::vector<Packed>>& packed,
                      const Counts& counts, const StepLayout& layout, int64_t* launched);
    void copy_out(const Counts& counts, const StepLayout& layout, int64_t rows, const StepOutput& out);
    // After a failed step: wait for the stream and zero the split-K counters; when the
    // device cannot, remember `error` as the executor's failure.
    void recover_from_failed_step(const std::string& error);

    std::shared_ptr<Device> device_;
    LaunchPlan plan_;
    std::unique_ptr<Stream> stream_;
    DeviceAllocation weights_, activations_, kv_;
    std::vector<uint64_t> weight_ptrs_, buffer_ptrs_, workspace_ptrs_;
    uint64_t step_base_ = 0, global_scratch_ = 0, profile_scratch_ = 0;
    std::vector<std::unique_ptr<Kernel>> kernels_;
    std::vector<std::vector<Packed>> forward_packed_, sample_packed_;  // [item][case]
    int64_t num_blocks_ = 0;
    uint64_t kv_layer_bytes_ = 0;
    std::unique_ptr<PinnedBuffer> staging_, tokens_out_;
    std::shared_ptr<PinnedBuffer> host_logits_;  // [host_logits_rows_, vocab] float32
    int64_t host_logits_rows_ = 0;
    std::vector<std::pair<uint64_t, uint64_t>> counters_;  // split-K counter workspaces (pointer, bytes)
    std::map<int64_t, cu::CUgraphExec> graphs_;
    bool use_graphs_ = true;
    bool sync_launches_ = false;
    int64_t steps_started_ = 0;  // failed ones included: the number an error names
    std::string failure_;
    cu::CUresult failure_code_ = cu::CUDA_SUCCESS;
    ExecutorStats stats_;
    mutable std::mutex mu_;  // one step at a time
};

}  // namespace cuda
}  // namespace bessemer
