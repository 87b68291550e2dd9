// The Python binding of int4_fake_quant (bessemer._C), called by quantization/awq.py at build time.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // std::optional col_scale

#include <optional>
#include <stdexcept>
#include <string>

#include "int4_fake_quant.h"

namespace bessemer {

inline void def_int4_fake_quant(pybind11::module_& m) {
    namespace py = pybind11;
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    m.def("int4_fake_quant", [](F32 w, int64_t group, bool zero_point, std::optional<F32> col_scale,
                                int64_t threads) {
        if (w.ndim() != 2 || group <= 0 || w.shape(1) % group != 0)
            throw std::invalid_argument("int4_fake_quant: w must be (N, K) with K a multiple of group " +
                                        std::to_string(group));
        const int64_t n = w.shape(0), k = w.shape(1);
        if (col_scale && (col_scale->ndim() != 1 || col_scale->shape(0) != k))
            throw std::invalid_argument("int4_fake_quant: col_scale must be (K,) = (" + std::to_string(k) + ",)");
        if (threads < 0) throw std::invalid_argument("int4_fake_quant: threads must be >= 0 (0: one per core)");
        py::array_t<float> out({n, k});
        float* dst = out.mutable_data();
        const float* cs = col_scale ? col_scale->data() : nullptr;
        {
            py::gil_scoped_release unlocked;  // the build's other threads (reading, packing) run meanwhile
            int4_fake_quant(w.data(), n, k, group, zero_point, cs, dst, threads);
        }
        return out;
    }, py::arg("w"), py::arg("group"), py::arg("zero_point"), py::arg("col_scale") = py::none(),
       py::arg("threads") = 0,
       "dequantize(quantize(w * col_scale)) / col_scale on the 4-bit grid (N, K) fp32, bit-identical to "
       "quantization/awq.fake_quant_int4_reference");
}

}  // namespace bessemer
