// A StepBatch (format/step.py) read from Python, for every extension's step(): the six
// arrays as C-ordered int32 (any integer dtype converted, anything else refused) with their
// lengths checked against each other. The index checks are check_step_batch's
// (step_batch.h); what only one target assumes (the cuda kernels' consecutive positions,
// its step capacity) is checked by that target.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "step_batch.h"

namespace bessemer {

class PyStepBatch {
   public:
    using I32 = pybind11::array_t<int32_t, pybind11::array::c_style | pybind11::array::forcecast>;

    // batch: any object with the six attributes (a StepBatch).
    explicit PyStepBatch(const pybind11::object& batch)
        : PyStepBatch(attr(batch, "token_ids"), attr(batch, "positions"), attr(batch, "cu_seqlens"),
                      attr(batch, "context_lens"), attr(batch, "block_tables"), attr(batch, "logits_indices")) {}

    PyStepBatch(const pybind11::object& token_ids, const pybind11::object& positions,
                const pybind11::object& cu_seqlens, const pybind11::object& context_lens,
                const pybind11::object& block_tables, const pybind11::object& logits_indices)
        : tok_(as_i32(token_ids, "token_ids", 1)),
          pos_(as_i32(positions, "positions", 1)),
          cu_(as_i32(cu_seqlens, "cu_seqlens", 1)),
          ctx_(as_i32(context_lens, "context_lens", 1)),
          bt_(as_i32(block_tables, "block_tables", 2)),
          li_(as_i32(logits_indices, "logits_indices", 1)) {
        const int64_t T = tok_.shape(0), L = li_.shape(0);
        if (pos_.shape(0) != T) fail("positions has " + str(pos_.shape(0)) + " entries, token_ids " + str(T));
        if (cu_.shape(0) < 1) fail("cu_seqlens must have S+1 >= 1 entries");
        const int64_t S = cu_.shape(0) - 1;
        if (ctx_.shape(0) != S) fail("context_lens has " + str(ctx_.shape(0)) + " entries, expected S=" + str(S));
        if (bt_.shape(0) != S) fail("block_tables has " + str(bt_.shape(0)) + " rows, expected S=" + str(S));
        const int64_t B = bt_.shape(1);
        if (T > (1 << 24) || L > (1 << 24) || S > (1 << 24) || B > (1 << 24)) fail("step inputs too large");
        b_.T = int(T);
        b_.S = int(S);
        b_.L = int(L);
        b_.B = int(B);
        b_.token_ids = tok_.data();
        b_.positions = pos_.data();
        b_.cu_seqlens = cu_.data();
        b_.context_lens = ctx_.data();
        b_.block_tables = bt_.data();
        b_.logits_indices = li_.data();
    }

    // Points into the arrays this object holds: valid while it lives.
    const StepBatch& batch() const { return b_; }

   private:
    [[noreturn]] static void fail(const std::string& msg) { throw std::invalid_argument(msg); }
    static std::string str(int64_t v) { return std::to_string(v); }

    static pybind11::object attr(const pybind11::object& batch, const char* name) {
        if (!pybind11::hasattr(batch, name))
            fail(std::string("step: the batch has no ") + name + " (a StepBatch has six arrays)");
        return batch.attr(name);
    }

    static I32 as_i32(const pybind11::object& obj, const char* name, int ndim) {
        if (pybind11::isinstance<pybind11::array>(obj)) {
            const char kind = pybind11::reinterpret_borrow<pybind11::array>(obj).dtype().kind();
            if (kind != 'i' && kind != 'u') fail(std::string(name) + ": expected an int32 array");
        }
        I32 arr = I32::ensure(obj);
        if (!arr) {
            PyErr_Clear();
            fail(std::string(name) + ": expected an int32 array");
        }
        if (arr.ndim() != ndim)
            fail(std::string(name) + ": expected " + std::to_string(ndim) + "-D array, got " +
                 std::to_string(arr.ndim()) + "-D");
        return arr;
    }

    I32 tok_, pos_, cu_, ctx_, bt_, li_;
    StepBatch b_;
};

}  // namespace bessemer
