// StepBatch: the six int32 arrays of one step (format/step.py), as every C++ executor
// reads them, and the check of every index they hold against what an executor allows.
#pragma once

#include <cstdint>

namespace bessemer {

struct StepBatch {
    int T = 0, S = 0, L = 0, B = 0;          // rows, sequences, logits rows, block-table width
    const int32_t* token_ids = nullptr;       // [T]
    const int32_t* positions = nullptr;       // [T]
    const int32_t* cu_seqlens = nullptr;      // [S + 1]
    const int32_t* context_lens = nullptr;    // [S]
    const int32_t* block_tables = nullptr;    // [S, B]
    const int32_t* logits_indices = nullptr;  // [L]
};

// What an executor accepts in a step.
struct StepLimits {
    int64_t token_limit = 0;  // token ids must be < this
    int num_kv_blocks = 0;    // block ids must be < this (-1 = unused entry)
    int block_size = 1;
    bool reads_kv = false;     // the plan reads the KV cache: every block a row touches must exist
    int64_t kv_window = 0;     // ... within the last kv_window positions (0: from position 0)
};

// Throws std::invalid_argument naming the first index out of range (the sizes T, S, L, B
// are checked where the batch is read: step_batch_py.h); returns max(1, max context_lens).
// Every target's executor runs it on every step; a target checks only what its own kernels
// assume besides (targets/cuda/csrc/step_inputs.h).
int check_step_batch(const StepBatch& b, const StepLimits& limits);

}  // namespace bessemer
