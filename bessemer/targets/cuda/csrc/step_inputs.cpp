#include "step_inputs.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

namespace bessemer {
namespace cuda {

namespace {

constexpr uint64_t kAlign = 64;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

std::array<int64_t, kNumStepArrays> elems_for(const LaunchPlan& plan, const Counts& c) {
    std::array<int64_t, kNumStepArrays> e{};
    e[kTokenIds] = e[kPositions] = e[kSlotMapping] = c[kTokens];
    e[kCuSeqlens] = c[kSeqs] + 1;
    e[kContextLens] = c[kSeqs];
    e[kBlockTables] = c[kSeqs] * plan.max_blocks_per_seq;
    e[kLogitsIndices] = e[kTemperature] = e[kTopK] = e[kTopP] = e[kUniform] = e[kSampledTokens] = c[kSelected];
    e[kPrefillTilesArr] = 2 * c[kPrefillTiles];
    e[kDecodeSeqsArr] = c[kDecodeSeqs];
    return e;
}

}  // namespace

StepLayout layout_for(const LaunchPlan& plan, const Counts& counts) {
    StepLayout l;
    l.elems = elems_for(plan, counts);
    uint64_t at = 0;
    for (int i = 0; i < kNumStepArrays; ++i) {
        if (i == kSampledTokens) l.upload_bytes = at;
        l.offset[size_t(i)] = at;
        at = align_up(at + uint64_t(l.elems[size_t(i)]) * 4);
    }
    l.total_bytes = at;
    return l;
}

uint64_t capacity_bytes(const LaunchPlan& plan) {
    uint64_t at = 0;
    for (const auto& a : plan.step_inputs) at = align_up(at + uint64_t(a.elems) * 4);
    return at;
}

bool is_decode(const StepRequest& r) {
    const StepBatch& b = r.batch;
    if (b.T != b.S || b.L != b.S) return false;
    for (int i = 0; i < b.S; ++i)
        if (b.cu_seqlens[i + 1] != i + 1 || b.logits_indices[i] != i) return false;
    return true;
}

Counts derive_step(const LaunchPlan& plan, const StepRequest& r, int64_t num_blocks, int64_t pad_to_seqs,
                   int32_t pad_block, uint8_t* staging, StepLayout* layout) {
    const StepBatch& b = r.batch;
    const int64_t T = b.T, S = b.S, L = b.L, W = b.B, BS = plan.kv_block_size;
    // this target's step capacity, before anything is read
    if (T < 1 || S < 1) bad("a step needs at least one sequence and one token");
    if (T > plan.max_num_tokens)
        bad("the step has " + std::to_string(T) + " tokens; the engine allows " + std::to_string(plan.max_num_tokens) +
            " per step (--max-num-tokens)");
    if (S > plan.max_batch_size)
        bad("the step has " + std::to_string(S) + " sequences; the engine allows " +
            std::to_string(plan.max_batch_size) + " (--max-batch-size)");
    if (L > plan.step_inputs[kLogitsIndices].elems) bad("more selected rows than the engine's logits capacity");
    if (W > plan.max_blocks_per_seq)
        bad("a sequence uses " + std::to_string(W) + " KV blocks; the engine allows " +
            std::to_string(plan.max_blocks_per_seq));
    // every index, as on every target
    StepLimits limits;
    limits.token_limit = plan.vocab_size;
    limits.num_kv_blocks = int(num_blocks);
    limits.block_size = int(BS);
    limits.reads_kv = true;  // attention reads every block from position 0 (no window)
    check_step_batch(b, limits);
    // what the kernels assume
    for (int64_t s = 0; s < S; ++s) {
        const int32_t lo = b.cu_seqlens[s], hi = b.cu_seqlens[s + 1], context = b.context_lens[s];
        if (hi == lo) bad("every sequence needs at least one row (cu_seqlens must increase)");
        for (int32_t i = lo; i < hi; ++i)
            if (b.positions[i] != context - (hi - lo) + (i - lo))
                bad("each sequence's rows must be its consecutive positions ending at context_lens - 1");
    }
    for (int64_t j = 0; j < L; ++j) {
        const float t = r.temperature ? r.temperature[j] : 0.f, p = r.top_p ? r.top_p[j] : 1.f;
        const float u = r.uniform ? r.uniform[j] : 0.f;
        if (!(t >= 0.f) || !std::isfinite(t)) bad("temperature must be finite and >= 0");
        if (!(p > 0.f && p <= 1.f)) bad("top_p must be in (0, 1]");
        if (!(u >= 0.f && u < 1.f)) bad("the uniform draws must be in [0, 1)");
    }
    const bool padded = pad_to_seqs > S;
    if (padded && (!is_decode(r) || pad_to_seqs > plan.max_batch_size)) bad("only a decode step can be padded");
    const int64_t Sp = padded ? pad_to_seqs : S, Tp = padded ? pad_to_seqs : T, Lp = padded ? pad_to_seqs : L;

    // counts: prefill tiles of every multi-row sequence, decode rows
    Counts c{};
    c[kTokens] = Tp;
    c[kSelected] = Lp;
    c[kSeqs] = Sp;
    for (int64_t s = 0; s < S; ++s) {
        const int64_t n = b.cu_seqlens[s + 1] - b.cu_seqlens[s];
        if (n == 1)
            ++c[kDecodeSeqs];
        else
            c[kPrefillTiles] += (n + plan.tile_tokens - 1) / plan.tile_tokens;
    }
    if (padded) c[kDecodeSeqs] = Sp;
    *layout = layout_for(plan, c);
    if (layout->total_bytes > capacity_bytes(plan)) bad("the step's inputs exceed the engine's step capacity");
    auto i32 = [&](int a) { return reinterpret_cast<int32_t*>(staging + layout->offset[size_t(a)]); };
    auto f32 = [&](int a) { return reinterpret_cast<float*>(staging + layout->offset[size_t(a)]); };

    int32_t *tok = i32(kTokenIds), *pos = i32(kPositions), *slot = i32(kSlotMapping), *cu = i32(kCuSeqlens),
            *ctx = i32(kContextLens), *bt = i32(kBlockTables), *li = i32(kLogitsIndices),
            *tiles = i32(kPrefillTilesArr), *dec = i32(kDecodeSeqsArr), *topk = i32(kTopK);
    float *temp = f32(kTemperature), *topp = f32(kTopP), *uni = f32(kUniform);
    const int64_t B = plan.max_blocks_per_seq;
    int64_t ntiles = 0, ndec = 0;
    for (int64_t s = 0; s < S; ++s) {
        const int32_t lo = b.cu_seqlens[s], hi = b.cu_seqlens[s + 1], n = hi - lo;
        const int32_t* row = b.block_tables + s * W;
        for (int64_t k = 0; k < B; ++k) bt[s * B + k] = k < W ? row[k] : -1;
        cu[s] = lo;
        ctx[s] = b.context_lens[s];
        for (int32_t i = lo; i < hi; ++i) {
            const int32_t p = b.positions[i];
            tok[i] = b.token_ids[i];
            pos[i] = p;
            slot[i] = row[p / BS] * int32_t(BS) + p % int32_t(BS);
        }
        if (n == 1) {
            dec[ndec++] = int32_t(s);
        } else {
            for (int32_t q0 = 0; q0 < n; q0 += int32_t(plan.tile_tokens)) {
                tiles[2 * ntiles] = int32_t(s);
                tiles[2 * ntiles + 1] = q0;
                ++ntiles;
            }
        }
    }
    cu[S] = int32_t(T);
    for (int64_t j = 0; j < L; ++j) {
        li[j] = b.logits_indices[j];
        temp[j] = r.temperature ? r.temperature[j] : 0.f;
        topp[j] = r.top_p ? r.top_p[j] : 1.f;
        uni[j] = r.uniform ? r.uniform[j] : 0.f;
        topk[j] = r.top_k ? r.top_k[j] : 0;
    }
    for (int64_t s = S; s < Sp; ++s) {  // decode padding: one greedy row at position 0 of the pad block
        tok[s] = 0;
        pos[s] = 0;
        slot[s] = pad_block * int32_t(BS);
        cu[s + 1] = int32_t(s + 1);
        ctx[s] = 1;
        bt[s * B] = pad_block;
        for (int64_t k = 1; k < B; ++k) bt[s * B + k] = -1;
        li[s] = int32_t(s);
        dec[ndec++] = int32_t(s);
        temp[s] = 0.f;
        topp[s] = 1.f;
        uni[s] = 0.f;
        topk[s] = 0;
    }
    return c;
}

}  // namespace cuda
}  // namespace bessemer
