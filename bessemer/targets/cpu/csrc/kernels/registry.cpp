// Kernel table ((target, op, version) -> prepare/run) and the validation helpers used by prepare.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "kernel_api.h"
#include "kernels.h"

namespace bessemer {

namespace {

constexpr const char* kTarget = "cpu";

const KernelDef kKernels[] = {
    {kTarget, "add", 1, prepare_add, run_add},
    {kTarget, "add_rms_norm", 1, prepare_add_rms_norm, run_add_rms_norm},
    {kTarget, "all_gather", 1, prepare_all_gather, run_all_gather},
    {kTarget, "all_reduce", 1, prepare_all_reduce, run_all_reduce},
    {kTarget, "attention", 1, prepare_attention, run_attention},
    {kTarget, "attention_sinks", 1, prepare_attention_sinks, run_attention},
    {kTarget, "embedding", 1, prepare_embedding, run_embedding},
    {kTarget, "embedding_w4a16", 1, prepare_embedding_w4a16, run_embedding_w4a16},
    {kTarget, "embedding_w8a16", 1, prepare_embedding_w8a16, run_embedding_w8a16},
    {kTarget, "gather_rows", 1, prepare_gather_rows, run_gather_rows},
    {kTarget, "gelu_tanh_mul", 1, prepare_gelu_tanh_mul, run_gelu_tanh_mul},
    {kTarget, "linear", 1, prepare_linear, run_linear},
    {kTarget, "linear_fp8", 1, prepare_linear_fp8, run_linear_fp8},
    {kTarget, "linear_fp8", 2, prepare_linear_fp8, run_linear_fp8},
    {kTarget, "linear_w4a16", 1, prepare_linear_w4a16, run_linear_w4a16},
    {kTarget, "linear_w4a16", 2, prepare_linear_w4a16, run_linear_w4a16},
    {kTarget, "linear_w4a16", 3, prepare_linear_w4a16, run_linear_w4a16},
    {kTarget, "linear_w4k", 1, prepare_linear_w4k, run_linear_w4k},
    {kTarget, "linear_w4a8", 1, prepare_linear_w4a8, run_linear_w4a8},
    {kTarget, "linear_w8a16", 1, prepare_linear_w8a16, run_linear_w8a16},
    {kTarget, "linear_w8a8", 1, prepare_linear_w8a8, run_linear_w8a8},
    {kTarget, "moe", 1, prepare_moe, run_moe},
    {kTarget, "moe_fp8", 1, prepare_moe_fp8, run_moe_fp8},
    {kTarget, "moe_mxfp4", 1, prepare_moe_mxfp4, run_moe_mxfp4},
    {kTarget, "moe_w4a16", 1, prepare_moe_w4a16, run_moe_w4a16},
    {kTarget, "moe_w8a16", 1, prepare_moe_w8a16, run_moe_w8a16},
    {kTarget, "rms_norm", 1, prepare_rms_norm, run_rms_norm},
    {kTarget, "rms_norm_heads", 1, prepare_rms_norm_heads, run_rms_norm_heads},
    {kTarget, "rope", 1, prepare_rope, run_rope},
    {kTarget, "scale", 1, prepare_scale, run_scale},
    {kTarget, "sigmoid_gate_mul", 1, prepare_sigmoid_gate_mul, run_sigmoid_gate_mul},
    {kTarget, "silu_mul", 1, prepare_silu_mul, run_silu_mul},
};

std::string call_label(const KernelCall& c) {
    std::string s = c.op + "@" + std::to_string(c.version);
    if (!c.node.empty()) s += " (" + c.node + ")";
    return s;
}

}  // namespace

const KernelDef* find_kernel(const std::string& target, const std::string& op, int version) {
    for (const KernelDef& k : kKernels)
        if (target == k.target && op == k.op && version == k.version) return &k;
    return nullptr;
}

std::string supported_kernels(const std::string& target) {
    std::string s;
    for (const KernelDef& k : kKernels) {
        if (target != k.target) continue;
        if (!s.empty()) s += ", ";
        s += std::string(k.op) + "@" + std::to_string(k.version);
    }
    return s;
}

void kernel_error(const KernelCall& c, const std::string& msg) {
    throw std::invalid_argument(call_label(c) + ": " + msg);
}

void expect_arity(const KernelCall& c, size_t nin, size_t nout, size_t nw_min, size_t nw_max) {
    if (c.ins.size() != nin || c.outs.size() != nout)
        kernel_error(c, "expects " + std::to_string(nin) + " input and " + std::to_string(nout) +
                            " output views, got " + std::to_string(c.ins.size()) + " and " +
                            std::to_string(c.outs.size()));
    if (c.weights.size() < nw_min || c.weights.size() > nw_max)
        kernel_error(c, "expects " + std::to_string(nw_min) +
                            (nw_max != nw_min ? "-" + std::to_string(nw_max) : std::string()) +
                            " weights, got " + std::to_string(c.weights.size()));
}

RowKind view_rows(const KernelCall& c, const PlanInfo& p, const ViewRef& v) {
    if (v.buf < 0 || size_t(v.buf) >= p.buffers.size() || !p.buffers[v.buf].defined)
        kernel_error(c, "view refers to unknown buffer " + std::to_string(v.buf));
    return p.buffers[v.buf].rows;
}

RowKind same_rows(KernelCall& c, const PlanInfo& p) {
    const ViewRef& first = !c.outs.empty() ? c.outs[0] : c.ins.at(0);
    RowKind r = view_rows(c, p, first);
    for (const auto* vs : {&c.ins, &c.outs})
        for (const ViewRef& v : *vs)
            if (view_rows(c, p, v) != r)
                kernel_error(c, "all operand buffers must have the same row kind (tokens/selected)");
    c.rows = r;
    return r;
}

void expect_width(const KernelCall& c, const ViewRef& v, int width, const char* what) {
    if (v.width != width)
        kernel_error(c, std::string(what) + " view has width " + std::to_string(v.width) +
                            ", expected " + std::to_string(width));
}

double attr(const KernelCall& c, const char* name) {
    auto it = c.attrs.find(name);
    if (it == c.attrs.end()) kernel_error(c, std::string("missing attr '") + name + "'");
    return it->second;
}

double attr_or(const KernelCall& c, const char* name, double dflt) {
    auto it = c.attrs.find(name);
    return it == c.attrs.end() ? dflt : it->second;
}

int64_t attr_int(const KernelCall& c, const char* name) {
    double v = attr(c, name);
    if (v != std::floor(v) || std::fabs(v) > 1e15)
        kernel_error(c, std::string("attr '") + name + "' must be an integer");
    return int64_t(v);
}

void expect_weight(const KernelCall& c, size_t i, std::initializer_list<int> dtypes,
                   std::initializer_list<int> layouts, std::vector<int64_t> shape) {
    const TensorRef* t = c.weights.at(i);
    if (std::find(dtypes.begin(), dtypes.end(), t->dtype) == dtypes.end()) {
        std::string ok;
        for (int d : dtypes) ok += std::string(ok.empty() ? "" : "/") + dtype_name(d);
        kernel_error(c, "weight " + t->name + ": dtype " + dtype_name(t->dtype) +
                            " not supported (expects " + ok + ")");
    }
    if (std::find(layouts.begin(), layouts.end(), t->layout) == layouts.end()) {
        std::string ok;
        for (int l : layouts) ok += std::string(ok.empty() ? "" : "/") + layout_name(l);
        kernel_error(c, "weight " + t->name + ": layout " + layout_name(t->layout) +
                            " not supported (expects " + ok + ")");
    }
    if (!shape.empty() && t->shape != shape) {
        auto fmt = [](const std::vector<int64_t>& s) {
            std::string r = "[";
            for (size_t k = 0; k < s.size(); ++k) r += (k ? ", " : "") + std::to_string(s[k]);
            return r + "]";
        };
        kernel_error(c, "weight " + t->name + ": shape " + fmt(t->shape) + ", expected " + fmt(shape));
    }
}

void expect_linear(KernelCall& c, const PlanInfo& p, size_t nw_min, size_t nw_max, int* N, int* K) {
    expect_arity(c, 1, 1, nw_min, nw_max);
    same_rows(c, p);
    *N = c.outs[0].width;
    *K = c.ins[0].width;
    if (*N <= 0 || *K <= 0) kernel_error(c, "empty input or output view");
}

bool views_overlap(const ViewRef& a, const ViewRef& b) {
    return a.buf == b.buf && a.col < b.col + b.width && b.col < a.col + a.width;
}

void check_inplace_or_disjoint(const KernelCall& c, const ViewRef& out, const ViewRef& in) {
    if (views_overlap(out, in) && !(out.buf == in.buf && out.col == in.col))
        kernel_error(c, "output view partially overlaps an input view");
}

void prepare_same_width_pair(KernelCall& c, const PlanInfo& p, const char* in0, const char* in1) {
    expect_arity(c, 2, 1, 0, 0);
    same_rows(c, p);
    const int w = c.outs[0].width;
    expect_width(c, c.ins[0], w, in0);
    expect_width(c, c.ins[1], w, in1);
    check_inplace_or_disjoint(c, c.outs[0], c.ins[0]);
    check_inplace_or_disjoint(c, c.outs[0], c.ins[1]);
}

}  // namespace bessemer
