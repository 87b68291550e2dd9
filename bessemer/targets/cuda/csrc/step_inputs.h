// The per-step arrays the launch list reads, derived on the host from Executor.step's
// inputs exactly as targets/cuda/step_inputs.py derives them (that module is the reference
// and the tests compare the two), checked (see derive_step), and written into one staging
// block so that they go to the device in one copy.
//
// Layout: the arrays in StepArray order, each 64-byte aligned, sized for the step's counts
// (tight), sampled_tokens last (written by the device, never uploaded). A CUDA graph is
// captured for one layout; the eager path lays out each step for its own counts.
#pragma once

#include <array>
#include <cstdint>

#include "launch_plan.h"
#include "step_batch.h"

namespace bessemer {
namespace cuda {

struct StepLayout {
    std::array<uint64_t, kNumStepArrays> offset{};
    std::array<int64_t, kNumStepArrays> elems{};
    uint64_t upload_bytes = 0;  // [0, offset of sampled_tokens): what goes up
    uint64_t total_bytes = 0;
};

// Array sizes for these counts (block_tables: seqs x max_blocks_per_seq rows).
StepLayout layout_for(const LaunchPlan& plan, const Counts& counts);
// The largest layout any step can need: what the device region is sized for.
uint64_t capacity_bytes(const LaunchPlan& plan);

// One step's inputs as the runtime gives them (host memory, C order): the contract's
// StepBatch, its lengths already checked (format/csrc/step_batch_py.h), plus sampling.
struct StepRequest {
    StepBatch batch;
    // Sampling per selected row; null: greedy (temperature 0, no top-k/top-p, uniform 0).
    const float *temperature = nullptr, *top_p = nullptr, *uniform = nullptr;
    const int32_t* top_k = nullptr;
};

// A decode step: one row per sequence, every row selected in order. Such a step can be
// padded to a larger batch (graph buckets).
bool is_decode(const StepRequest& r);

// Checks the request (throws std::invalid_argument naming the problem) and writes every
// input array into `staging` laid out for the returned counts. The checks, in one place each:
//   every index against its range (token ids < vocab, block ids in the cache and present
//   for every position a row touches, cu_seqlens, context_lens, logits_indices): the
//   contract's check_step_batch (format/csrc/step_batch.h), as on every target;
//   here, what only this target assumes: the step fits the engine's step capacity
//   (max_num_tokens, max_batch_size, max_blocks_per_seq), every sequence has a row, a
//   sequence's rows are its consecutive positions ending at context_lens - 1 (the kernels
//   write the KV of exactly those), and the sampling values are in range.
// When pad_to_seqs > seqs (a decode step only), sequences are appended up to pad_to_seqs,
// each one token at position 0 whose KV goes to block `pad_block` (a block the block manager
// never hands out), greedy.
Counts derive_step(const LaunchPlan& plan, const StepRequest& r, int64_t num_blocks, int64_t pad_to_seqs,
                   int32_t pad_block, uint8_t* staging, StepLayout* layout);

}  // namespace cuda
}  // namespace bessemer
