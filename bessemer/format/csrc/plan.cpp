#include "plan.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

namespace bessemer {

namespace {

using json::as_int;
using json::as_list;
using json::member;

[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }

ViewRef parse_view(const json::Value& v, const std::vector<BufferInfo>& buffers, const std::string& where) {
    if (v.kind != json::Kind::Array || v.items.size() != 3) fail(where + ": a view is [buf, col, width]");
    ViewRef r;
    r.buf = int(as_int(v.items[0], where));
    r.col = int(as_int(v.items[1], where));
    r.width = int(as_int(v.items[2], where));
    if (r.buf < 0 || size_t(r.buf) >= buffers.size() || !buffers[r.buf].defined)
        fail(where + ": view refers to unknown buffer " + std::to_string(r.buf));
    const int bw = buffers[r.buf].width;
    if (r.col < 0 || r.width <= 0 || int64_t(r.col) + r.width > bw)
        fail(where + ": view [" + std::to_string(r.buf) + ", " + std::to_string(r.col) + ", " +
             std::to_string(r.width) + "] is outside buffer " + std::to_string(r.buf) + " (width " +
             std::to_string(bw) + ")");
    return r;
}

// Tensors own disjoint byte ranges: a table whose entries share bytes would let one
// tensor's codes be read as another's (a re-signed file passes the checksum).
void check_disjoint(const std::vector<std::unique_ptr<TensorRef>>& tensors, const uint8_t* base) {
    std::vector<std::pair<int64_t, const TensorRef*>> spans;  // (offset, tensor), non-empty only
    for (const auto& t : tensors)
        if (t->nbytes > 0) spans.emplace_back(static_cast<const uint8_t*>(t->data) - base, t.get());
    std::sort(spans.begin(), spans.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (size_t i = 1; i < spans.size(); ++i) {
        const auto& prev = spans[i - 1];
        if (prev.first + prev.second->nbytes > spans[i].first)
            fail("tensor " + spans[i].second->name + ": data at offset " + std::to_string(spans[i].first) +
                 " overlaps tensor " + prev.second->name + " [" + std::to_string(prev.first) + ", +" +
                 std::to_string(prev.second->nbytes) + ")");
    }
}

// Which columns of each buffer some earlier step has written, as sorted disjoint
// [begin, end) runs: a step may only read what the plan initialised before it.
class WrittenColumns {
public:
    explicit WrittenColumns(size_t buffers) : runs_(buffers) {}

    void write(const ViewRef& v) {
        auto& runs = runs_[v.buf];
        runs.emplace_back(v.col, v.col + v.width);
        std::sort(runs.begin(), runs.end());
        std::vector<std::pair<int, int>> merged;
        for (const auto& r : runs) {
            if (!merged.empty() && r.first <= merged.back().second)
                merged.back().second = std::max(merged.back().second, r.second);
            else
                merged.push_back(r);
        }
        runs.swap(merged);
    }

    bool covers(const ViewRef& v) const {
        for (const auto& r : runs_[v.buf])
            if (r.first <= v.col && v.col + v.width <= r.second) return true;
        return false;
    }

private:
    std::vector<std::vector<std::pair<int, int>>> runs_;  // per buffer id
};

void check_reads_initialised(const PlanDesc& p) {
    WrittenColumns written(p.buffers.size());
    auto view_text = [](const ViewRef& v) {
        return "[" + std::to_string(v.buf) + ", " + std::to_string(v.col) + ", " + std::to_string(v.width) + "]";
    };
    for (size_t i = 0; i < p.steps.size(); ++i) {
        const PlanStep& s = p.steps[i];
        for (const ViewRef& v : s.ins)
            if (!written.covers(v))
                fail("plan step " + std::to_string(i) + " (" + s.op + "@" + std::to_string(s.version) + ")" +
                     (s.node.empty() ? "" : " (" + s.node + ")") + " reads view " + view_text(v) +
                     " that no earlier step wrote; rebuild the engine");
        for (const ViewRef& v : s.outs) written.write(v);
    }
    if (!written.covers(p.logits))
        fail("plan logits view " + view_text(p.logits) + " is never written by a step; rebuild the engine");
}

}  // namespace

KvCacheDesc parse_kv_cache(const json::Value& kv) {
    KvCacheDesc d;
    d.layers = int(as_int(member(kv, "num_layers", "kv_cache"), "kv_cache num_layers"));
    if (d.layers < 0) fail("kv_cache: num_layers must be >= 0");
    if (d.layers > 0) {
        d.heads = int(as_int(member(kv, "num_kv_heads", "kv_cache"), "kv_cache num_kv_heads"));
        d.head_dim = int(as_int(member(kv, "head_dim", "kv_cache"), "kv_cache head_dim"));
        if (d.heads <= 0 || d.head_dim <= 0) fail("kv_cache: num_kv_heads/head_dim must be > 0");
    }
    std::string name = "float32";
    if (const json::Value* dt = kv.find("dtype")) {
        if (dt->kind == json::Kind::String) name = dt->str;
        else if (dt->kind == json::Kind::Int) name = dtype_name(int(dt->integer));
    }
    d.dtype = dtype_id(name);
    const KvDTypeInfo* kvt = kv_dtype_info(d.dtype);
    if (!kvt) {
        std::string ok;
        for (const KvDTypeInfo& k : kKvDTypes) ok += std::string(ok.empty() ? "" : ", ") + dtype_name(k.dtype);
        fail("kv_cache: dtype '" + name + "' not supported (" + ok + ")");
    }
    // One-byte codes need their scales (only the dynamic per-(token, head) kind exists), and
    // only they have them: an executor sizes the cache by this rule (kv_bytes_per_token).
    const json::Value* sc = kv.find("scales");
    const std::string scales = sc && sc->kind == json::Kind::String ? sc->str : std::string();
    if (kvt->scale_bytes > 0 && scales != kvt->scales)
        fail("kv_cache: dtype " + name + " needs scales '" + kvt->scales + "', got '" + scales +
             "'; rebuild the engine");
    if (kvt->scale_bytes == 0 && sc && sc->kind != json::Kind::Null)
        fail("kv_cache: dtype " + name + " has no scales, the plan gives some; rebuild the engine");
    return d;
}

void parse_tensor_table(const EngineFile& file, const json::Value& table, TensorTable* out) {
    const uint64_t fsize = file.size(), doff = file.data_offset();
    const uint8_t* base = file.data() + doff;
    for (const json::Value& e : as_list(table, "tensor table")) {
        if (e.kind != json::Kind::Object) fail("tensor table entries must be objects");
        auto t = std::make_unique<TensorRef>();
        const json::Value& nm = member(e, "name", "tensor");
        if (nm.kind != json::Kind::String) fail("tensor name must be a string");
        t->name = nm.str;
        const std::string where = "tensor " + t->name;
        t->dtype = int(as_int(member(e, "dtype", where), where + ": dtype"));
        t->layout = int(as_int(member(e, "layout", where), where + ": layout"));
        for (const json::Value& s : as_list(member(e, "shape", where), where + ": shape")) {
            const int64_t v = as_int(s, where + ": shape");
            if (v < 0) fail(where + ": negative dimension in shape");
            t->shape.push_back(v);
        }
        const int64_t offset = as_int(member(e, "offset", where), where + ": offset");
        t->nbytes = as_int(member(e, "nbytes", where), where + ": nbytes");
        if (out->by_name.count(t->name)) fail(where + ": duplicate name in the tensor table");
        std::string why;
        const int64_t expect = stored_nbytes(t->dtype, t->layout, t->shape, &why);
        if (expect < 0) fail(where + ": " + why);
        if (t->nbytes != expect)
            fail(where + ": nbytes " + std::to_string(t->nbytes) + " does not match its dtype/layout/shape (" +
                 std::to_string(expect) + " bytes expected)");
        if (offset < 0 || offset % int64_t(kTensorAlign) != 0)
            fail(where + ": offset " + std::to_string(offset) + " is not a non-negative multiple of " +
                 std::to_string(kTensorAlign));
        if (uint64_t(offset) > fsize || doff + uint64_t(offset) + uint64_t(t->nbytes) > fsize)
            fail(where + ": data [" + std::to_string(offset) + ", +" + std::to_string(t->nbytes) +
                 ") runs past the end of the file");
        t->data = base + offset;
        out->by_name[t->name] = t.get();
        out->tensors.push_back(std::move(t));
    }
    check_disjoint(out->tensors, base);
}

PlanDesc parse_plan(const json::Value& plan) {
    PlanDesc p;
    for (const json::Value& b : as_list(member(plan, "buffers", "plan"), "plan buffers")) {
        const int64_t id = as_int(member(b, "id", "plan buffer"), "plan buffer id");
        const int64_t width = as_int(member(b, "width", "plan buffer"), "plan buffer width");
        const json::Value* rows = b.find("rows");
        const std::string kind = rows && rows->kind == json::Kind::String ? rows->str : kRowKindNames[ROWS_TOKENS];
        if (id < 0 || id > 1000000) fail("plan buffer id " + std::to_string(id) + " out of range");
        if (width <= 0 || width > (1 << 30)) fail("plan buffer " + std::to_string(id) + ": bad width");
        if (size_t(id) >= p.buffers.size()) p.buffers.resize(id + 1);
        BufferInfo& info = p.buffers[id];
        if (info.defined) fail("plan buffer " + std::to_string(id) + " defined twice");
        info.defined = true;
        info.width = int(width);
        if (kind == kRowKindNames[ROWS_TOKENS]) info.rows = ROWS_TOKENS;
        else if (kind == kRowKindNames[ROWS_SELECTED]) info.rows = ROWS_SELECTED;
        else fail("plan buffer " + std::to_string(id) + ": rows must be 'tokens' or 'selected'");
    }
    const json::Value* kv = plan.find("kv_cache");
    if (kv && kv->kind != json::Kind::Null) p.kv = parse_kv_cache(*kv);
    p.vocab_size = int(as_int(member(plan, "vocab_size", "plan"), "plan vocab_size"));
    if (p.vocab_size <= 0) fail("plan vocab_size must be > 0");
    p.logits = parse_view(member(plan, "logits", "plan"), p.buffers, "plan logits");
    if (p.logits.width != p.vocab_size)
        fail("plan logits view has width " + std::to_string(p.logits.width) + ", vocab_size is " +
             std::to_string(p.vocab_size));
    int idx = 0;
    for (const json::Value& d : as_list(member(plan, "steps", "plan"), "plan steps")) {
        const std::string where = "plan step " + std::to_string(idx++);
        PlanStep s;
        const json::Value& op = member(d, "op", where);
        if (op.kind != json::Kind::String) fail(where + ": op must be a string");
        s.op = op.str;
        s.version = int(as_int(member(d, "version", where), where + ": version"));
        if (const json::Value* node = d.find("node"); node && node->kind == json::Kind::String) s.node = node->str;
        const std::string label = where + " (" + s.op + "@" + std::to_string(s.version) + ")";
        if (const json::Value* ins = d.find("ins"))
            for (const json::Value& v : as_list(*ins, label + " ins")) s.ins.push_back(parse_view(v, p.buffers, label));
        if (const json::Value* outs = d.find("outs"))
            for (const json::Value& v : as_list(*outs, label + " outs")) s.outs.push_back(parse_view(v, p.buffers, label));
        if (const json::Value* ws = d.find("weights"))
            for (const json::Value& w : as_list(*ws, label + " weights")) {
                if (w.kind != json::Kind::String) fail(label + ": weight names must be strings");
                s.weights.push_back(w.str);
            }
        if (const json::Value* attrs = d.find("attrs"); attrs && attrs->kind != json::Kind::Null) {
            if (attrs->kind != json::Kind::Object) fail(label + ": attrs must be an object");
            for (const auto& kv_pair : attrs->members) {
                if (!kv_pair.second.is_number() || !std::isfinite(kv_pair.second.number()))
                    fail(label + ": attr '" + kv_pair.first + "' must be a finite number");
                s.attrs[kv_pair.first] = kv_pair.second.number();
            }
        }
        p.steps.push_back(std::move(s));
    }
    if (p.steps.empty()) fail("plan has no steps; rebuild the engine");
    check_reads_initialised(p);
    return p;
}

RankHeader read_rank_header(const EngineFile& file) {
    RankHeader h;
    h.json = json::parse(file.header_ptr(), file.header_len());
    if (h.json.kind != json::Kind::Object) fail(file.path() + ": the header is not a JSON object");
    parse_tensor_table(file, member(h.json, "tensors", "header"), &h);
    h.plan = parse_plan(member(h.json, "plan", "header"));
    return h;
}

}  // namespace bessemer
