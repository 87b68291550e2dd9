// The rank file's header as C++ structures: the tensor table (bounds-checked against the
// mapped file) and the ExecutionPlan (format/plan.py), parsed and checked structurally.
// Shared by every target's C++ executor; what a kernel needs is checked by the target.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "contract.h"
#include "json.h"
#include "rank_file.h"

namespace bessemer {

struct TensorRef {
    std::string name;
    int dtype = 0;
    int layout = 0;
    std::vector<int64_t> shape;
    const void* data = nullptr;  // inside the mapped file
    int64_t nbytes = 0;
};

struct ViewRef {
    int buf = 0, col = 0, width = 0;
};

struct BufferInfo {
    int width = 0;
    RowKind rows = ROWS_TOKENS;
    bool defined = false;
};

struct PlanStep {
    std::string op;
    int version = 0;
    std::string node;  // the graph node it came from (HF module path), for messages
    std::vector<ViewRef> ins, outs;
    std::vector<std::string> weights;
    std::map<std::string, double> attrs;
};

struct KvCacheDesc {
    int layers = 0, heads = 0, head_dim = 0;
    int dtype = DT_F32;
};

struct PlanDesc {
    std::vector<BufferInfo> buffers;  // indexed by buffer id
    std::vector<PlanStep> steps;
    KvCacheDesc kv;
    ViewRef logits;
    int vocab_size = 0;
};

// A rank file's tensor table, every entry checked against the contract and the file.
struct TensorTable {
    std::vector<std::unique_ptr<TensorRef>> tensors;  // table order; pointers stay valid
    std::unordered_map<std::string, const TensorRef*> by_name;
};

// The whole header of a mapped rank file of the plan schema above (the cpu target's).
struct RankHeader : TensorTable {
    json::Value json;
    PlanDesc plan;
};

// Parses file.header (throws std::invalid_argument naming what is wrong).
RankHeader read_rank_header(const EngineFile& file);

// The pieces, for tools, tests and targets with their own plan schema: a tensor table
// (offsets checked against the file) and a plan.
void parse_tensor_table(const EngineFile& file, const json::Value& table, TensorTable* out);
PlanDesc parse_plan(const json::Value& plan);
// The plan's "kv_cache" section (format/kv.py): dtype and the scale rule checked.
KvCacheDesc parse_kv_cache(const json::Value& kv);

}  // namespace bessemer
