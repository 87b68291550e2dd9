// Engine header JSON (as Python objects) -> LaunchPlan, every field checked.
#include "plan_parse.h"

#include <map>
#include <stdexcept>

#include "spec_parse.h"

namespace bessemer {
namespace cuda {

namespace {

const char* kCountNames[kNumCounts] = {"tokens", "selected", "seqs", "prefill_tiles", "decode_seqs"};
const char* kStepNames[kNumStepArrays] = {"token_ids",     "positions",    "slot_mapping", "cu_seqlens",
                                          "context_lens",  "block_tables", "logits_indices", "prefill_tiles",
                                          "decode_seqs",   "temperature",  "top_k",        "top_p",
                                          "uniform",       "sampled_tokens"};

[[noreturn]] void bad(const std::string& what) {
    throw std::invalid_argument("cuda plan: " + what + "; rebuild the engine with this version's build-engine");
}

py::dict as_dict(const py::handle& h, const std::string& where) {
    if (!py::isinstance<py::dict>(h)) bad(where + " is not an object");
    return py::reinterpret_borrow<py::dict>(h);
}

bool has(const py::dict& d, const char* key) { return d.contains(key); }

GridDim parse_grid_dim(const py::handle& h, const std::string& where) {
    GridDim g;
    if (py::isinstance<py::int_>(h)) {
        g.times = h.cast<int64_t>();
        if (g.times < 0) bad(where + ": negative grid dimension");
        return g;
    }
    py::dict d = as_dict(h, where + " grid dimension");
    g.count = count_index(field<std::string>(d, "count", where));
    if (g.count < 0) bad(where + ": unknown count " + field<std::string>(d, "count", where));
    g.per = field<int64_t>(d, "per", where);
    g.times = field<int64_t>(d, "times", where);
    if (g.per < 1 || g.times < 0) bad(where + ": grid rule per/times out of range");
    return g;
}

struct Names {
    std::map<std::string, int> weights, workspace;
    std::map<int, int> buffers;  // id -> index
};

Arg parse_arg(const py::handle& h, const ParamSpec& param, const LaunchPlan& plan, const Names& names,
              const std::string& where) {
    py::dict d = as_dict(h, where);
    const std::string w = where + " argument " + param.name;
    Arg a;
    if (has(d, "i32") || has(d, "count")) {
        if (param.type != "i32") bad(w + ": an i32 value for a " + param.type + " parameter");
        if (has(d, "i32")) {
            a.kind = Arg::Kind::I32;
            a.i32 = field<int32_t>(d, "i32", w);
        } else {
            a.kind = Arg::Kind::Count;
            a.index = count_index(field<std::string>(d, "count", w));
            if (a.index < 0) bad(w + ": unknown count");
        }
        return a;
    }
    if (has(d, "f32")) {
        if (param.type != "fp32") bad(w + ": an f32 value for a " + param.type + " parameter");
        a.kind = Arg::Kind::F32;
        a.f32 = field<float>(d, "f32", w);
        return a;
    }
    if (!param.is_pointer()) bad(w + ": a pointer for a " + param.type + " parameter");
    a.kind = Arg::Kind::Pointer;
    if (has(d, "null")) {
        a.region = Region::Null;
    } else if (has(d, "buffer")) {
        auto it = names.buffers.find(field<int>(d, "buffer", w));
        if (it == names.buffers.end()) bad(w + ": unknown buffer");
        const BufferSpec& b = plan.buffers[size_t(it->second)];
        const int64_t col = field<int64_t>(d, "col", w);
        if (col < 0 || col >= b.width) bad(w + ": column " + std::to_string(col) + " outside the buffer");
        a.region = Region::Buffer;
        a.index = it->second;
        a.offset = uint64_t(col) * uint64_t(b.elem_bytes);
    } else if (has(d, "weight")) {
        auto it = names.weights.find(field<std::string>(d, "weight", w));
        if (it == names.weights.end()) bad(w + ": weight " + field<std::string>(d, "weight", w) + " is not stored");
        a.region = Region::Weight;
        a.index = it->second;
    } else if (has(d, "step")) {
        a.region = Region::Step;
        a.index = step_array_index(field<std::string>(d, "step", w));
        if (a.index < 0) bad(w + ": step input " + field<std::string>(d, "step", w) + " is unknown to this runtime");
    } else if (has(d, "kv")) {
        const std::string kv = field<std::string>(d, "kv", w);
        if (kv != "k" && kv != "v") bad(w + ": kv must be k or v");
        a.region = kv == "k" ? Region::KvK : Region::KvV;
        a.index = field<int>(d, "layer", w);
        if (a.index < 0 || a.index >= plan.kv.num_layers) bad(w + ": layer out of range");
    } else if (has(d, "workspace")) {
        auto it = names.workspace.find(field<std::string>(d, "workspace", w));
        if (it == names.workspace.end()) bad(w + ": unknown workspace array");
        a.region = Region::Workspace;
        a.index = it->second;
    } else {
        bad(w + ": unknown argument kind");
    }
    return a;
}

LaunchCase parse_case(const py::dict& d, const LaunchPlan& plan, const Names& names, const std::string& where) {
    LaunchCase c;
    c.kernel = field<int>(d, "kernel", where);
    if (c.kernel < 0 || size_t(c.kernel) >= plan.kernels.size()) bad(where + ": kernel id out of range");
    const KernelSpec& k = plan.kernels[size_t(c.kernel)];
    py::list grid = field<py::list>(d, "grid", where);
    if (grid.size() != 3) bad(where + ": grid must have 3 dimensions");
    for (size_t i = 0; i < 3; ++i) c.grid[i] = parse_grid_dim(grid[i], where);
    py::list args = field<py::list>(d, "args", where);
    if (k.params.size() < 2 || args.size() != k.params.size() - 2)
        bad(where + ": " + std::to_string(args.size()) + " arguments for kernel " + k.entry + " with " +
            std::to_string(k.params.size()) + " parameters (2 of them scratch)");
    for (size_t i = 0; i < args.size(); ++i) c.args.push_back(parse_arg(args[i], k.params[i], plan, names, where));
    return c;
}

std::vector<LaunchItem> parse_launches(const py::list& items, const LaunchPlan& plan, const Names& names,
                                       const char* section) {
    std::vector<LaunchItem> out;
    for (size_t i = 0; i < items.size(); ++i) {
        py::dict d = as_dict(items[i], std::string(section) + " launch");
        LaunchItem item;
        item.node = field_or<std::string>(d, "node", "", section);
        item.op = field_or<std::string>(d, "op", "", section);
        const std::string where = std::string(section) + "[" + std::to_string(i) + "] (" + item.node + ")";
        if (has(d, "cases")) {
            item.by = count_index(field<std::string>(d, "by", where));
            if (item.by < 0) bad(where + ": unknown count to choose by");
            for (const auto& c : field<py::list>(d, "cases", where)) {
                py::dict cd = as_dict(c, where);
                LaunchCase lc = parse_case(cd, plan, names, where);
                lc.max_rows = cd["max_rows"].is_none() ? -1 : field<int64_t>(cd, "max_rows", where);
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

ArraySpec parse_array(const py::handle& h, const std::string& where) {
    ArraySpec a;
    a.name = field<std::string>(h, "name", where);
    a.dtype = field<std::string>(h, "dtype", where + " " + a.name);
    a.elems = field<int64_t>(h, "elems", where + " " + a.name);
    a.elem_bytes = dtype_bytes(a.dtype);
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

int dtype_bytes(const std::string& dtype) {
    if (dtype == "bfloat16" || dtype == "float16") return 2;
    if (dtype == "float32" || dtype == "int32") return 4;
    if (dtype == "uint8" || dtype == "int8" || dtype == "float8_e4m3") return 1;
    throw std::invalid_argument("cuda plan: dtype " + dtype + " is not one this runtime handles");
}

const LaunchCase& LaunchItem::pick(const Counts& c) const {
    if (by < 0) return cases[0];
    for (const auto& lc : cases)
        if (lc.max_rows < 0 || c[by] <= lc.max_rows) return lc;
    return cases.back();
}

LaunchPlan parse_plan(const py::dict& header, uint64_t data_size) {
    if (field<std::string>(header, "target", "rank header") != "cuda") bad("the rank file is not a cuda one");
    py::dict p = as_dict(header["plan"], "plan");
    if (field<std::string>(p, "schema", "plan") != "cuda-launch" || field<int>(p, "version", "plan") != 1)
        bad("schema " + field<std::string>(p, "schema", "plan") + " v" + std::to_string(field<int>(p, "version", "plan")) +
            " is not cuda-launch v1");
    LaunchPlan plan;
    plan.act_dtype = field<std::string>(p, "act_dtype", "plan");
    py::dict limits = as_dict(p["limits"], "plan limits");
    plan.max_num_tokens = field<int64_t>(limits, "max_num_tokens", "plan limits");
    plan.max_batch_size = field<int64_t>(limits, "max_batch_size", "plan limits");
    plan.max_blocks_per_seq = field<int64_t>(limits, "max_blocks_per_seq", "plan limits");
    plan.kv_block_size = field<int64_t>(limits, "kv_block_size", "plan limits");
    if (plan.max_num_tokens < 1 || plan.max_batch_size < 1 || plan.max_blocks_per_seq < 1 || plan.kv_block_size < 1)
        bad("limits must be positive");
    plan.tile_tokens = field<int64_t>(as_dict(p["attention"], "plan attention"), "tile_tokens", "plan attention");
    if (plan.tile_tokens < 1) bad("attention tile_tokens must be positive");
    plan.vocab_size = field<int64_t>(p, "vocab_size", "plan");
    plan.logits_buffer = field<int>(as_dict(p["logits"], "plan logits"), "buffer", "plan logits");

    Names names;
    for (const auto& b : field<py::list>(p, "buffers", "plan")) {
        BufferSpec s;
        s.id = field<int>(b, "id", "plan buffer");
        s.width = field<int64_t>(b, "width", "plan buffer");
        s.dtype = field<std::string>(b, "dtype", "plan buffer");
        s.elem_bytes = dtype_bytes(s.dtype);
        if (s.width < 1) bad("buffer " + std::to_string(s.id) + " has no width");
        names.buffers[s.id] = int(plan.buffers.size());
        plan.buffers.push_back(s);
    }
    auto logits = names.buffers.find(plan.logits_buffer);
    if (logits == names.buffers.end() || plan.buffers[size_t(logits->second)].dtype != "float32" ||
        plan.buffers[size_t(logits->second)].width != plan.vocab_size)
        bad("the logits buffer must be a float32 buffer of vocab_size columns");
    plan.logits_buffer = logits->second;
    for (const auto& w : field<py::list>(p, "workspace", "plan")) {
        names.workspace[field<std::string>(w, "name", "plan workspace")] = int(plan.workspace.size());
        plan.workspace.push_back(parse_array(w, "plan workspace"));
    }
    plan.step_inputs.resize(kNumStepArrays);
    std::vector<bool> seen(kNumStepArrays, false);
    for (const auto& s : field<py::list>(p, "step_inputs", "plan")) {
        ArraySpec a = parse_array(s, "plan step input");
        const int i = step_array_index(a.name);
        if (i < 0) bad("step input " + a.name + " is unknown to this runtime");
        const bool is_float = i == kTemperature || i == kTopP || i == kUniform;
        if (a.dtype != (is_float ? "float32" : "int32")) bad("step input " + a.name + " has dtype " + a.dtype);
        plan.step_inputs[size_t(i)] = a;
        seen[size_t(i)] = true;
    }
    for (int i = 0; i < kNumStepArrays; ++i)
        if (!seen[size_t(i)]) bad(std::string("step input ") + kStepNames[i] + " is missing");
    py::dict kv = as_dict(p["kv_cache"], "plan kv_cache");
    plan.kv.num_layers = field<int>(kv, "num_layers", "plan kv_cache");
    plan.kv.num_kv_heads = field<int>(kv, "num_kv_heads", "plan kv_cache");
    plan.kv.head_dim = field<int>(kv, "head_dim", "plan kv_cache");
    plan.kv.dtype = field<std::string>(kv, "dtype", "plan kv_cache");
    plan.kv.elem_bytes = dtype_bytes(plan.kv.dtype);
    // one-byte codes carry a float32 scale per (token, KV head) after each block's codes
    const bool scaled = has(kv, "scales");
    if (scaled && field<std::string>(kv, "scales", "plan kv_cache") != "dynamic_per_token_head_float32")
        bad("plan kv_cache: scales " + field<std::string>(kv, "scales", "plan kv_cache") + " is unknown to this runtime");
    if (scaled != (plan.kv.elem_bytes == 1)) bad("plan kv_cache: one-byte codes need scales, and only they have them");
    plan.kv.scale_bytes = scaled ? 4 : 0;

    std::map<std::string, WeightRef> cubins;
    for (const auto& t : field<py::list>(header, "tensors", "rank header")) {
        WeightRef w;
        w.name = field<std::string>(t, "name", "tensor");
        w.offset = field<uint64_t>(t, "offset", "tensor " + w.name);
        w.nbytes = field<uint64_t>(t, "nbytes", "tensor " + w.name);
        if (w.offset > data_size || w.nbytes > data_size - w.offset)
            bad("tensor " + w.name + " runs past the end of the data section");
        if (w.offset % 64) bad("tensor " + w.name + " is not 64-byte aligned");
        if (w.name.rfind("cubin/", 0) == 0) {
            cubins[w.name] = w;
        } else {
            names.weights[w.name] = int(plan.weights.size());
            plan.weights.push_back(w);
        }
    }
    for (const auto& k : field<py::list>(header, "kernels", "rank header")) {
        plan.kernels.push_back(kernel_spec_from(k));
        const std::string cubin = field<std::string>(k, "cubin", "kernel " + plan.kernels.back().entry);
        auto it = cubins.find(cubin);
        if (it == cubins.end()) bad("kernel " + plan.kernels.back().entry + ": cubin tensor " + cubin + " is missing");
        plan.kernel_cubins.push_back(it->second);
    }
    plan.forward = parse_launches(field<py::list>(p, "forward", "plan"), plan, names, "forward");
    plan.sample = parse_launches(field<py::list>(p, "sample", "plan"), plan, names, "sample");
    return plan;
}

}  // namespace cuda
}  // namespace bessemer
