// all_reduce@1, all_gather@1: tensor-parallel collectives over the step's Collectives
// (targets/cpu/csrc/communicator.*). prepare checks the views and declares the rank and
// group size (KernelNeeds) so the executor can refuse a communicator of another group.
#include "kernels.h"

namespace bessemer {

namespace {
void prepare_comm_attrs(KernelCall& c) {
    const int64_t rank = attr_int(c, "tp_rank"), size = attr_int(c, "tp_size");
    if (size < 1 || rank < 0 || rank >= size) kernel_error(c, "tp_rank must be in [0, tp_size)");
    c.needs.tp_rank = int(rank);
    c.needs.tp_size = int(size);
}

struct GatherParams : KernelParams {
    int full;  // gathered width
};
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
    shard_range(full, c.needs.tp_size, c.needs.tp_rank, &start, &stop);
    expect_width(c, c.ins[0], stop - start, "shard");
    if (views_overlap(c.ins[0], c.outs[0])) kernel_error(c, "output view overlaps the input view");
    c.set_params<GatherParams>().full = full;
}

void run_all_gather(const KernelCall& c, const StepContext& ctx) {
    if (!ctx.comm) return;
    ctx.comm->all_gather(ctx.ptr(c.ins[0]), ctx.ld(c.ins[0]), ctx.rows(c.rows), c.ins[0].width,
                         ctx.ptr(c.outs[0]), ctx.ld(c.outs[0]), c.get<GatherParams>().full);
}

}  // namespace bessemer
