// The cuda plan (targets/cuda/plan.py) as the executor holds it: buffers, workspace, step
// inputs, the KV cache's shape, and the launch list with every argument and grid rule
// parsed and cross-checked once at load (kernel ids, argument counts and kinds against the
// kernel's parameter types, buffer ids, weight names, step-input names).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kernel.h"
#include "plan.h"

namespace bessemer {
namespace cuda {

// The step's counts (step_inputs.COUNTS), by index.
enum Count : int { kTokens = 0, kSelected, kSeqs, kPrefillTiles, kDecodeSeqs, kNumCounts };
using Counts = std::array<int64_t, kNumCounts>;
int count_index(const std::string& name);  // -1 when unknown
const char* count_name(int index);

// The step-input arrays this runtime derives (step_inputs.py), by index.
enum StepArray : int {
    kTokenIds = 0, kPositions, kSlotMapping, kCuSeqlens, kContextLens, kBlockTables, kLogitsIndices,
    kPrefillTilesArr, kDecodeSeqsArr, kTemperature, kTopK, kTopP, kUniform, kSampledTokens, kNumStepArrays
};
int step_array_index(const std::string& name);  // -1 when unknown
const char* step_array_name(int index);

struct BufferSpec {
    int id = 0;
    int64_t width = 0;
    int dtype = DT_BF16;  // format.h ids
    int elem_bytes = 2;
};

struct ArraySpec {  // a workspace or step-input array
    std::string name;
    int dtype = DT_I32;
    int64_t elems = 0;
    int elem_bytes = 4;
};

// Where a pointer argument points.
enum class Region : uint8_t { Null, Buffer, Weight, Step, KvK, KvV, Workspace };

struct Arg {
    enum class Kind : uint8_t { Pointer, I32, F32, Count } kind = Kind::I32;
    Region region = Region::Null;
    int index = 0;          // buffer id, weight index, step array, layer, workspace index, count index
    uint64_t offset = 0;    // bytes into the region (a buffer's column)
    int32_t i32 = 0;
    float f32 = 0.f;
};

struct GridDim {
    int count = -1;  // -1: the constant `times`
    int64_t per = 1, times = 1;
    int64_t eval(const Counts& c) const { return count < 0 ? times : (c[count] + per - 1) / per * times; }
};

struct LaunchCase {
    int kernel = 0;
    int64_t max_rows = -1;  // -1: any row count
    std::array<GridDim, 3> grid;
    std::vector<Arg> args;  // one per runtime parameter (the kernel's params minus the scratch pair)
};

struct LaunchItem {
    std::string node, op;
    int by = -1;  // count index choosing among cases; -1: the one case
    std::vector<LaunchCase> cases;
    const LaunchCase& pick(const Counts& c) const;
};

struct WeightRef {
    std::string name;
    uint64_t offset = 0, nbytes = 0;  // within the rank file's data section
};

struct LaunchPlan {
    int64_t max_num_tokens = 0, max_batch_size = 0, max_blocks_per_seq = 0, kv_block_size = 0;
    int64_t tile_tokens = 1, vocab_size = 0;
    int logits_buffer = 0;
    std::vector<BufferSpec> buffers;
    std::vector<ArraySpec> workspace;
    std::vector<ArraySpec> step_inputs;  // indexed by StepArray (every one present)
    KvCacheDesc kv;  // the contract's KV cache section; one-byte codes carry their scales
                     // after each block's codes (kv_bytes_per_token in contract.h)
    std::vector<KernelSpec> kernels;
    std::vector<WeightRef> kernel_cubins;    // each kernel's cubin tensor
    std::vector<WeightRef> weights;          // the tensors launches read (cubins excluded)
    std::vector<LaunchItem> forward, sample;
};

}  // namespace cuda
}  // namespace bessemer
