// The Python binding of int4_symmetric_scale_search (bessemer._C), called by
// quantization/scale_search.py at build time.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "int4_scale_search.h"

namespace bessemer {

inline void def_int4_scale_search(pybind11::module_& m) {
    namespace py = pybind11;
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
    m.def("int4_symmetric_scale_search", [](F32 w, int64_t group, F32 importance, F64 divisors, int64_t threads) {
        if (w.ndim() != 2 || group <= 0 || w.shape(1) % group != 0)
            throw std::invalid_argument("int4_symmetric_scale_search: w must be (N, K) with K a multiple of group " +
                                        std::to_string(group));
        const int64_t n = w.shape(0), k = w.shape(1);
        if (importance.ndim() != 1 || importance.shape(0) != k || divisors.ndim() != 1)
            throw std::invalid_argument("int4_symmetric_scale_search: importance must be (K,) = (" +
                                        std::to_string(k) + ",) and divisors 1-D");
        if (threads < 0) throw std::invalid_argument("int4_symmetric_scale_search: threads must be >= 0 (0: one per core)");
        py::array_t<float> scales({n, k / group});
        float* out = scales.mutable_data();
        {
            py::gil_scoped_release unlocked;  // the build's other threads (reading, packing) run meanwhile
            int4_symmetric_scale_search(w.data(), n, k, group, importance.data(), divisors.data(), divisors.shape(0),
                                        out, threads);
        }
        return scales;
    }, py::arg("w"), py::arg("group"), py::arg("importance"), py::arg("divisors"), py::arg("threads") = 0,
       "Symmetric int4 group scales (N, K // group), bit-identical to "
       "quantization/scale_search.int4_symmetric_scales_reference");
}

}  // namespace bessemer
