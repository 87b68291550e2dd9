// The Python binding of gptq_block_columns (bessemer._C), called by quantization/gptq.py at
// build time.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "gptq_columns.h"

namespace bessemer {

inline void def_gptq_columns(pybind11::module_& m) {
    namespace py = pybind11;
    using Out = py::array_t<float, py::array::c_style>;  // no forcecast: wt and qt are written in place
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    using I64 = py::array_t<int64_t, py::array::c_style | py::array::forcecast>;
    m.def("gptq_block_columns", [](Out wt, F32 hinv, int64_t i1, int64_t i2, I64 cols, Out qt, const std::string& kind,
                                   F32 scale, std::optional<F32> offset, std::optional<F32> divisor, int64_t group,
                                   int64_t threads) {
        auto fail = [](const std::string& what) { throw std::invalid_argument("gptq_block_columns: " + what); };
        if (wt.ndim() != 2 || qt.ndim() != 2 || hinv.ndim() != 2) fail("wt, qt (K, N) and hinv (K, K) must be 2-D");
        const int64_t k = wt.shape(0), n = wt.shape(1);
        if (qt.shape(0) != k || qt.shape(1) != n || hinv.shape(0) != k || hinv.shape(1) != k)
            fail("wt and qt must be (K, N) and hinv (K, K), K = " + std::to_string(k));
        if (!wt.writeable() || !qt.writeable()) fail("wt and qt must be writeable");
        if (i1 < 0 || i2 <= i1 || i2 > k || cols.ndim() != 1 || cols.shape(0) != k) fail("need 0 <= i1 < i2 <= K, cols (K,)");
        GptqGrid grid{};
        if (kind == "int4") {
            if (!offset || !divisor || group <= 0) fail("an int4 grid needs offset, divisor and group");
            const int64_t groups = (k + group - 1) / group;
            for (const F32* a : {&scale, &*offset, &*divisor})
                if (a->ndim() != 2 || a->shape(1) != n || a->shape(0) < groups) fail("int4 grid arrays must be (K / group, N)");
            for (int64_t i = 0; i < k; ++i)
                if (cols.data()[i] < 0 || cols.data()[i] / group >= scale.shape(0)) fail("a column index lies outside the grid");
            grid = {GptqGrid::kInt4, scale.data(), offset->data(), divisor->data(), group};
        } else if (kind == "e4m3") {
            if (scale.ndim() != 1 || scale.shape(0) != n) fail("an e4m3 grid's scale must be (N,)");
            grid = {GptqGrid::kE4m3, scale.data(), nullptr, nullptr, 0};
        } else {
            fail("kind must be int4 or e4m3, got " + kind);
        }
        if (threads < 0) fail("threads must be >= 0 (0: one per core)");
        const int64_t b = i2 - i1;
        py::array_t<float> err({n, b});
        float* e = err.mutable_data();
        float* w = wt.mutable_data() + i1 * n;
        float* q = qt.mutable_data() + i1 * n;
        const float* h = hinv.data() + i1 * k + i1;
        const int64_t* c = cols.data() + i1;
        {
            py::gil_scoped_release unlocked;
            gptq_block_columns(w, b, n, h, k, c, grid, q, e, threads);
        }
        return err;
    }, py::arg("wt"), py::arg("hinv"), py::arg("i1"), py::arg("i2"), py::arg("cols"), py::arg("qt"), py::arg("kind"),
       py::arg("scale"), py::arg("offset") = py::none(), py::arg("divisor") = py::none(), py::arg("group") = 0,
       py::arg("threads") = 0,
       "GPTQ's columns i1..i2 of wt (K, N), in place: grid values into qt (K, N), returns the scaled "
       "errors (N, i2 - i1); bit-identical to quantization/gptq.gptq_columns_reference");
}

}  // namespace bessemer
