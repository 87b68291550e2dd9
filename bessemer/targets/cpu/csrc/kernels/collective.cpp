// all_reduce@1, all_gather@1: tensor-parallel collectives over the step's Collectives
// (targets/cpu/csrc/communicator.*). prepare checks the views and keeps the rank attrs so the
// executor can refuse a communicator of another rank or group size.
#include "kernels.h"

namespace bessemer {

namespace {
void prepare_comm_attrs(KernelCall& c) {
    c.iv[0] = attr_int(c, "tp_rank");
    c.iv[1] = attr_int(c, "tp_size");
    if (c.iv[1] < 1 || c.iv[0] < 0 || c.iv[0] >= c.iv[1]) kernel_error(c, "tp_rank must be in [0, tp_size)");
}
}  // namespace

// ---------------------------------------------------------------- all_reduce@1
void prepare_all_reduce(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 0, 0);
    same_rows(c, p);
    expect_width(c, c.ins[0], c.outs[0].width, "x");
    if (views_overlap(c.ins[0], c.outs[0]) && c.ins[0].col != c.outs[0].col)
        kernel_error(c, "output view partially overlaps the input view");
    prepare_comm_attrs(c);
}

void run_all_reduce(const KernelCall& c, const StepContext& ctx) {
    const int rows = ctx.rows(c.rows), W = c.outs[0].width;
    float* y = ctx.ptr(c.outs[0]);
    const float* x = ctx.ptr(c.ins[0]);
    const int64_t ldx = ctx.ld(c.ins[0]), ldy = ctx.ld(c.outs[0]);
    if (x != y)
        for (int r = 0; r < rows; ++r) std::copy(x + r * ldx, x + r * ldx + W, y + r * ldy);
    if (ctx.comm) ctx.comm->all_reduce(y, rows, W, ldy);
}

// ---------------------------------------------------------------- all_gather@1
void prepare_all_gather(KernelCall& c, const PlanInfo& p) {
    expect_arity(c, 1, 1, 0, 0);
    same_rows(c, p);
    prepare_comm_attrs(c);
    const int full = int(attr_int(c, "full_width"));
    expect_width(c, c.outs[0], full, "gathered");
    int start, stop;
    shard_range(full, int(c.iv[1]), int(c.iv[0]), &start, &stop);
    expect_width(c, c.ins[0], stop - start, "shard");
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "output view overlaps the input view");
    c.iv[2] = full;
}

void run_all_gather(const KernelCall& c, const StepContext& ctx) {
    if (!ctx.comm) return;
    ctx.comm->all_gather(ctx.ptr(c.ins[0]), ctx.ld(c.ins[0]), ctx.rows(c.rows), c.ins[0].width,
                         ctx.ptr(c.outs[0]), ctx.ld(c.outs[0]), int(c.iv[2]));
}

}  // namespace bessemer
