// attention@1's prepare: checks the step against the plan's KV cache, keeps its parameters
// and declares what it needs from the executor (KV reads and window, scratch, workspaces).
#include <algorithm>
#include <cmath>

#include "attention.h"
#include "kernels.h"

namespace bessemer {

namespace {

AttentionParams& prepare_common(KernelCall& c, const PlanInfo& p) {
    if (same_rows(c, p) != ROWS_TOKENS) kernel_error(c, "operands must be tokens buffers");
    const int64_t layer = attr_int(c, "layer"), H = attr_int(c, "num_heads");
    const int64_t Hkv = attr_int(c, "num_kv_heads"), D = attr_int(c, "head_dim");
    const double window = attr_or(c, "sliding_window", 0.0);
    if (layer < 0 || layer >= p.kv_layers)
        kernel_error(c, "layer " + std::to_string(layer) + " outside the KV cache's " +
                            std::to_string(p.kv_layers) + " layers");
    if (Hkv != p.kv_heads || D != p.head_dim)
        kernel_error(c, "num_kv_heads/head_dim differ from the plan's kv_cache");
    if (H <= 0 || Hkv <= 0 || H % Hkv != 0) kernel_error(c, "num_heads must be a multiple of num_kv_heads");
    if (H / Hkv > 64) kernel_error(c, "num_heads / num_kv_heads must be <= 64");
    if (D <= 0 || D > 1024) kernel_error(c, "head_dim must be in 1..1024");
    if (window < 0 || window != std::floor(window)) kernel_error(c, "sliding_window must be an integer >= 0");
    expect_width(c, c.ins[0], int(H * D), "q");
    expect_width(c, c.ins[1], int(Hkv * D), "k");
    expect_width(c, c.ins[2], int(Hkv * D), "v");
    expect_width(c, c.outs[0], int(H * D), "o");
    for (const ViewRef& in : c.ins)
        if (views_overlap(c.outs[0], in)) kernel_error(c, "output view overlaps an input view");
    AttentionParams& a = c.set_params<AttentionParams>();
    a.layer = int(layer);
    a.H = int(H);
    a.Hkv = int(Hkv);
    a.D = int(D);
    a.window = int64_t(window);
    a.scale = float(attr(c, "scale"));
    KernelNeeds& n = c.needs;
    n.reads_kv = true;
    n.kv_window = a.window;
    // per thread: a tile's transposed queries, output and key/value block (prefill), or a
    // row's key/value block and its G heads' state (decode); neither grows with the context
    const int64_t G = H / Hkv;
    const int64_t tile = D * kLanes * 2 + int64_t(kKB) * kLanes + 2 * int64_t(kKB) * D;
    n.thread_floats = std::max(tile, row_scratch_floats(G, D)) + 64;
    // shared: the key-block partials of decode rows split over threads (attention.cpp splits
    // only when they fit: 128 (row, block) pairs per thread pair, e.g. 2 rows of 16384 keys on 2 threads)
    n.shared_floats_per_thread_pair = 128 * H * (D + kPartialHead);
    n.ints_per_seq = 1;  // tile prefix sums
    n.ints_per_row = 1;  // decode rows
    return a;
}

}  // namespace

void prepare_attention(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 3, 1, 0, 0);
    prepare_common(c, p);
}

// attention_sinks@1: attention@1 whose softmax denominator also counts exp(sinks[h]) (a
// logit with no value: gpt-oss). The same paths; only the final normalisation changes.
void prepare_attention_sinks(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 3, 1, 1, 1);
    AttentionParams& a = prepare_common(c, p);
    expect_weight(c, 0, {DT_F32}, {LAYOUT_ROW_MAJOR}, {int64_t(a.H)});
    a.sinks = true;
}

}  // namespace bessemer
