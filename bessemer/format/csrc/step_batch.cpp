#include "step_batch.h"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

namespace bessemer {

namespace {
[[noreturn]] void fail(const std::string& msg) { throw std::invalid_argument(msg); }
std::string str(int64_t v) { return std::to_string(v); }
}  // namespace

int check_step_batch(const StepBatch& b, const StepLimits& lim) {
    const int64_t T = b.T, S = b.S, L = b.L, B = b.B, bs = lim.block_size;
    if (T > (1 << 24) || L > (1 << 24) || S > (1 << 24) || B > (1 << 24)) fail("step inputs too large");
    for (int64_t t = 0; t < T; ++t)
        if (b.token_ids[t] < 0 || b.token_ids[t] >= lim.token_limit)
            fail("token_ids[" + str(t) + "]=" + str(b.token_ids[t]) + " outside [0, " + str(lim.token_limit) + ")");
    if (b.cu_seqlens[0] != 0 || b.cu_seqlens[S] != T) fail("cu_seqlens must start at 0 and end at T=" + str(T));
    for (int64_t i = 0; i < S * B; ++i)
        if (b.block_tables[i] < -1 || b.block_tables[i] >= lim.num_kv_blocks)
            fail("block_tables entry " + str(b.block_tables[i]) + " outside [-1, " + str(lim.num_kv_blocks) + ")");
    int max_ctx = 1;
    for (int64_t s = 0; s < S; ++s) {
        if (b.cu_seqlens[s + 1] < b.cu_seqlens[s]) fail("cu_seqlens must be non-decreasing");
        const int64_t cl = b.context_lens[s];
        if (cl < 0 || cl > B * bs)
            fail("context_lens[" + str(s) + "]=" + str(cl) + " outside [0, " + str(B * bs) +
                 "] (block_tables width x kv_block_size)");
        max_ctx = std::max<int>(max_ctx, int(cl));
        int64_t pmin = std::numeric_limits<int64_t>::max(), pmax = -1;
        for (int64_t t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t) {
            if (b.positions[t] < 0 || b.positions[t] >= cl)
                fail("positions[" + str(t) + "]=" + str(b.positions[t]) + " outside [0, context_lens[" + str(s) +
                     "]=" + str(cl) + ")");
            pmin = std::min<int64_t>(pmin, b.positions[t]);
            pmax = std::max<int64_t>(pmax, b.positions[t]);
        }
        if (lim.reads_kv && pmax >= 0) {
            const int64_t lo = lim.kv_window > 0 ? std::max<int64_t>(0, pmin - lim.kv_window + 1) : 0;
            for (int64_t blk = lo / bs; blk <= pmax / bs; ++blk)
                if (b.block_tables[s * B + blk] < 0)
                    fail("block_tables[" + str(s) + "][" + str(blk) + "] is -1 but the step reads or writes that block");
        }
    }
    for (int64_t i = 0; i < L; ++i)
        if (b.logits_indices[i] < 0 || b.logits_indices[i] >= T)
            fail("logits_indices[" + str(i) + "]=" + str(b.logits_indices[i]) + " outside [0, " + str(T) + ")");
    return max_ctx;
}

}  // namespace bessemer
