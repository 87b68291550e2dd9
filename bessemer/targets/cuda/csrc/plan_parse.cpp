// Engine header -> LaunchPlan, every field checked.
#include "plan_parse.h"

#include <cstdint>
#include <map>
#include <stdexcept>

#include "spec_parse.h"

namespace bessemer {
namespace cuda {

namespace {

using json::as_int;
using json::as_list;
using json::as_number;
using json::as_string;
using json::member;
using json::Value;

const char* kCountNames[kNumCounts] = {"tokens", "selected", "seqs", "prefill_tiles", "decode_seqs"};
const char* kStepNames[kNumStepArrays] = {"token_ids",     "positions",    "slot_mapping", "cu_seqlens",
                                          "context_lens",  "block_tables", "logits_indices", "prefill_tiles",
                                          "decode_seqs",   "temperature",  "top_k",        "top_p",
                                          "uniform",       "sampled_tokens"};

[[noreturn]] void bad(const std::string& what) {
    throw std::invalid_argument("cuda plan: " + what + "; rebuild the engine with this version's build-engine");
}

bool has(const Value& d, const char* key) { return d.find(key) != nullptr; }
int64_t int_of(const Value& d, const char* key, const std::string& where) {
    return as_int(member(d, key, where), where + ": '" + key + "'");
}
const std::string& string_of(const Value& d, const char* key, const std::string& where) {
    return as_string(member(d, key, where), where + ": '" + key + "'");
}
const std::vector<Value>& list_of(const Value& d, const char* key, const std::string& where) {
    return as_list(member(d, key, where), where + ": '" + key + "'");
}

// Bytes of one element of a contract dtype named in the plan (whole bytes only: buffers and
// arrays are never packed below a byte).
int element_bytes(int dtype, const std::string& name, const std::string& where) {
    const DTypeInfo* d = dtype_info(dtype);
    if (!d || d->bits % 8) bad(where + ": dtype " + name + " is not one this runtime handles");
    return d->bits / 8;
}
int dtype_of(const Value& d, const std::string& where, int* elem_bytes) {
    const std::string& name = string_of(d, "dtype", where);
    const int id = dtype_id(name);
    *elem_bytes = element_bytes(id, name, where);
    return id;
}

GridDim parse_grid_dim(const Value& v, const std::string& where) {
    GridDim g;
    if (v.kind == json::Kind::Int) {
        g.times = v.integer;
        if (g.times < 0) bad(where + ": negative grid dimension");
        return g;
    }
    const std::string w = where + " grid dimension";
    g.count = count_index(string_of(v, "count", w));
    if (g.count < 0) bad(where + ": unknown count " + string_of(v, "count", w));
    g.per = int_of(v, "per", w);
    g.times = int_of(v, "times", w);
    if (g.per < 1 || g.times < 0) bad(where + ": grid rule per/times out of range");
    return g;
}

struct Names {
    std::map<std::string, int> weights, workspace;
    std::map<int64_t, int> buffers;  // id -> index
};

Arg parse_arg(const Value& d, const ParamSpec& param, const LaunchPlan& plan, const Names& names,
              const std::string& where) {
    const std::string w = where + " argument " + param.name;
    if (d.kind != json::Kind::Object) bad(w + " is not an object");
    Arg a;
    if (has(d, "i32") || has(d, "count")) {
        if (param.type != "i32") bad(w + ": an i32 value for a " + param.type + " parameter");
        if (has(d, "i32")) {
            const int64_t v = int_of(d, "i32", w);
            if (v < INT32_MIN || v > INT32_MAX) bad(w + ": i32 value out of range");
            a.kind = Arg::Kind::I32;
            a.i32 = int32_t(v);
        } else {
            a.kind = Arg::Kind::Count;
            a.index = count_index(string_of(d, "count", w));
            if (a.index < 0) bad(w + ": unknown count");
        }
        return a;
    }
    if (has(d, "f32")) {
        if (param.type != "fp32") bad(w + ": an f32 value for a " + param.type + " parameter");
        a.kind = Arg::Kind::F32;
        a.f32 = float(as_number(member(d, "f32", w), w + ": 'f32'"));
        return a;
    }
    if (!param.is_pointer()) bad(w + ": a pointer for a " + param.type + " parameter");
    a.kind = Arg::Kind::Pointer;
    if (has(d, "null")) {
        a.region = Region::Null;
    } else if (has(d, "buffer")) {
        auto it = names.buffers.find(int_of(d, "buffer", w));
        if (it == names.buffers.end()) bad(w + ": unknown buffer");
        const BufferSpec& b = plan.buffers[size_t(it->second)];
        const int64_t col = int_of(d, "col", w);
        if (col < 0 || col >= b.width) bad(w + ": column " + std::to_string(col) + " outside the buffer");
        a.region = Region::Buffer;
        a.index = it->second;
        a.offset = uint64_t(col) * uint64_t(b.elem_bytes);
    } else if (has(d, "weight")) {
        const std::string& name = string_of(d, "weight", w);
        auto it = names.weights.find(name);
        if (it == names.weights.end()) bad(w + ": weight " + name + " is not stored");
        a.region = Region::Weight;
        a.index = it->second;
    } else if (has(d, "step")) {
        const std::string& name = string_of(d, "step", w);
        a.region = Region::Step;
        a.index = step_array_index(name);
        if (a.index < 0) bad(w + ": step input " + name + " is unknown to this runtime");
    } else if (has(d, "kv")) {
        const std::string& kv = string_of(d, "kv", w);
        if (kv != "k" && kv != "v") bad(w + ": kv must be k or v");
        a.region = kv == "k" ? Region::KvK : Region::KvV;
        const int64_t layer = int_of(d, "layer", w);
        if (layer < 0 || layer >= plan.kv.layers) bad(w + ": layer out of range");
        a.index = int(layer);
    } else if (has(d, "workspace")) {
        auto it = names.workspace.find(string_of(d, "workspace", w));
        if (it == names.workspace.end()) bad(w + ": unknown workspace array");
        a.region = Region::Workspace;
        a.index = it->second;
    } else {
        bad(w + ": unknown argument kind");
    }
    return a;
}

LaunchCase parse_case(const Value& d, const LaunchPlan& plan, const Names& names, const std::string& where) {
    LaunchCase c;
    const int64_t kernel = int_of(d, "kernel", where);
    if (kernel < 0 || size_t(kernel) >= plan.kernels.size()) bad(where + ": kernel id out of range");
    c.kernel = int(kernel);
    const KernelSpec& k = plan.kernels[size_t(c.kernel)];
    const std::vector<Value>& grid = list_of(d, "grid", where);
    if (grid.size() != 3) bad(where + ": grid must have 3 dimensions");
    for (size_t i = 0; i < 3; ++i) c.grid[i] = parse_grid_dim(grid[i], where);
    const std::vector<Value>& args = list_of(d, "args", where);
    if (k.params.size() < 2 || args.size() != k.params.size() - 2)
        bad(where + ": " + std::to_string(args.size()) + " arguments for kernel " + k.entry + " with " +
            std::to_string(k.params.size()) + " parameters (2 of them scratch)");
    for (size_t i = 0; i < args.size(); ++i) c.args.push_back(parse_arg(args[i], k.params[i], plan, names, where));
    return c;
}

std::vector<LaunchItem> parse_launches(const std::vector<Value>& items, const LaunchPlan& plan, const Names& names,
                                       const char* section) {
    std::vector<LaunchItem> out;
    for (size_t i = 0; i < items.size(); ++i) {
        const Value& d = items[i];
        LaunchItem item;
        item.node = json::string_or(d, "node", "", section);
        item.op = json::string_or(d, "op", "", section);
        const std::string where = std::string(section) + "[" + std::to_string(i) + "] (" + item.node + ")";
        if (has(d, "cases")) {
            item.by = count_index(string_of(d, "by", where));
            if (item.by < 0) bad(where + ": unknown count to choose by");
            for (const Value& cd : list_of(d, "cases", where)) {
                LaunchCase lc = parse_case(cd, plan, names, where);
                lc.max_rows = json::int_or(cd, "max_rows", -1, where);
                item.cases.push_back(std::move(lc));
            }
            if (item.cases.empty() || item.cases.back().max_rows != -1) bad(where + ": the last case must take any row count");
        } else {
            item.cases.push_back(parse_case(d, plan, names, where));
        }
        out.push_back(std::move(item));
    }
    return out;
}

ArraySpec parse_array(const Value& v, const std::string& where) {
    ArraySpec a;
    a.name = string_of(v, "name", where);
    a.dtype = dtype_of(v, where + " " + a.name, &a.elem_bytes);
    a.elems = int_of(v, "elems", where + " " + a.name);
    if (a.elems < 0) bad(where + " " + a.name + ": negative size");
    return a;
}

}  // namespace

int count_index(const std::string& name) {
    for (int i = 0; i < kNumCounts; ++i)
        if (name == kCountNames[i]) return i;
    return -1;
}

const char* count_name(int index) { return kCountNames[index]; }

int step_array_index(const std::string& name) {
    for (int i = 0; i < kNumStepArrays; ++i)
        if (name == kStepNames[i]) return i;
    return -1;
}

const char* step_array_name(int index) { return kStepNames[index]; }

const LaunchCase& LaunchItem::pick(const Counts& c) const {
    if (by < 0) return cases[0];
    for (const auto& lc : cases)
        if (lc.max_rows < 0 || c[by] <= lc.max_rows) return lc;
    return cases.back();
}

LaunchPlan read_launch_plan(const EngineFile& file) {
    check_format_version(file);
    const Value header = json::parse(file.header_ptr(), file.header_len());
    if (header.kind != json::Kind::Object) bad(file.path() + ": the header is not a JSON object");
    if (string_of(header, "target", "rank header") != "cuda") bad("the rank file is not a cuda one");
    TensorTable table;  // offsets, sizes and dtype/layout/shape checked by the contract
    parse_tensor_table(file, member(header, "tensors", "rank header"), &table);

    const Value& p = member(header, "plan", "rank header");
    if (string_of(p, "schema", "plan") != "cuda-launch" || int_of(p, "version", "plan") != 1)
        bad("schema " + string_of(p, "schema", "plan") + " v" + std::to_string(int_of(p, "version", "plan")) +
            " is not cuda-launch v1");
    LaunchPlan plan;
    plan.kv = parse_kv_cache(member(p, "kv_cache", "plan"));  // the contract's dtype and scale rule
    if (plan.kv.layers < 1) bad("plan kv_cache: the cuda plan needs at least one layer");
    const Value& limits = member(p, "limits", "plan");
    plan.max_num_tokens = int_of(limits, "max_num_tokens", "plan limits");
    plan.max_batch_size = int_of(limits, "max_batch_size", "plan limits");
    plan.max_blocks_per_seq = int_of(limits, "max_blocks_per_seq", "plan limits");
    plan.kv_block_size = int_of(limits, "kv_block_size", "plan limits");
    if (plan.max_num_tokens < 1 || plan.max_batch_size < 1 || plan.max_blocks_per_seq < 1 || plan.kv_block_size < 1)
        bad("limits must be positive");
    plan.tile_tokens = int_of(member(p, "attention", "plan"), "tile_tokens", "plan attention");
    if (plan.tile_tokens < 1) bad("attention tile_tokens must be positive");
    plan.vocab_size = int_of(p, "vocab_size", "plan");
    const int64_t logits_id = int_of(member(p, "logits", "plan"), "buffer", "plan logits");

    Names names;
    for (const Value& b : list_of(p, "buffers", "plan")) {
        BufferSpec s;
        const int64_t id = int_of(b, "id", "plan buffer");
        if (id < 0 || id > INT32_MAX || names.buffers.count(id))
            bad("buffer id " + std::to_string(id) + " is out of range or repeated");
        s.id = int(id);
        s.width = int_of(b, "width", "plan buffer");
        s.dtype = dtype_of(b, "plan buffer " + std::to_string(id), &s.elem_bytes);
        if (s.width < 1) bad("buffer " + std::to_string(s.id) + " has no width");
        names.buffers[s.id] = int(plan.buffers.size());
        plan.buffers.push_back(s);
    }
    auto logits = names.buffers.find(logits_id);
    if (logits == names.buffers.end() || plan.buffers[size_t(logits->second)].dtype != DT_F32 ||
        plan.buffers[size_t(logits->second)].width != plan.vocab_size)
        bad("the logits buffer must be a float32 buffer of vocab_size columns");
    plan.logits_buffer = logits->second;
    for (const Value& w : list_of(p, "workspace", "plan")) {
        plan.workspace.push_back(parse_array(w, "plan workspace"));
        names.workspace[plan.workspace.back().name] = int(plan.workspace.size()) - 1;
    }
    plan.step_inputs.resize(kNumStepArrays);
    std::vector<bool> seen(kNumStepArrays, false);
    for (const Value& s : list_of(p, "step_inputs", "plan")) {
        ArraySpec a = parse_array(s, "plan step input");
        const int i = step_array_index(a.name);
        if (i < 0) bad("step input " + a.name + " is unknown to this runtime");
        const bool is_float = i == kTemperature || i == kTopP || i == kUniform;
        if (a.dtype != (is_float ? DT_F32 : DT_I32)) bad("step input " + a.name + " has dtype " + dtype_name(a.dtype));
        plan.step_inputs[size_t(i)] = a;
        seen[size_t(i)] = true;
    }
    for (int i = 0; i < kNumStepArrays; ++i)
        if (!seen[size_t(i)]) bad(std::string("step input ") + kStepNames[i] + " is missing");

    std::map<std::string, WeightRef> cubins;
    const uint8_t* data = file.data() + file.data_offset();
    for (const auto& t : table.tensors) {
        WeightRef w;
        w.name = t->name;
        w.offset = uint64_t(static_cast<const uint8_t*>(t->data) - data);
        w.nbytes = uint64_t(t->nbytes);
        if (w.name.rfind("cubin/", 0) == 0) {
            cubins[w.name] = w;
        } else {
            names.weights[w.name] = int(plan.weights.size());
            plan.weights.push_back(w);
        }
    }
    for (const Value& k : list_of(header, "kernels", "rank header")) {
        plan.kernels.push_back(kernel_spec_from(k));
        const std::string& cubin = string_of(k, "cubin", "kernel " + plan.kernels.back().entry);
        auto it = cubins.find(cubin);
        if (it == cubins.end()) bad("kernel " + plan.kernels.back().entry + ": cubin tensor " + cubin + " is missing");
        plan.kernel_cubins.push_back(it->second);
    }
    plan.forward = parse_launches(list_of(p, "forward", "plan"), plan, names, "forward");
    plan.sample = parse_launches(list_of(p, "sample", "plan"), plan, names, "sample");
    return plan;
}

}  // namespace cuda
}  // namespace bessemer
