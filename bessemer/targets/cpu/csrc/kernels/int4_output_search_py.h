// The Python binding of int4_output_error_scale_search (bessemer._C), called by
// quantization/scale_search.py at build time.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "int4_output_search.h"

namespace bessemer {

inline void def_int4_output_search(pybind11::module_& m) {
    namespace py = pybind11;
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
    m.def("int4_output_error_scale_search", [](F32 w, int64_t group, F32 moments, F32 plain, F64 divisors,
                                               int64_t threads) {
        const std::string name = "int4_output_error_scale_search: ";
        if (w.ndim() != 2 || group <= 0 || w.shape(1) % group != 0)
            throw std::invalid_argument(name + "w must be (N, K) with K a multiple of group " + std::to_string(group));
        const int64_t n = w.shape(0), k = w.shape(1), groups = k / group;
        const std::string g = std::to_string(group);
        if (moments.ndim() != 3 || moments.shape(0) != groups || moments.shape(1) != group ||
            moments.shape(2) != group)
            throw std::invalid_argument(name + "moments must be (K // group, group, group) = (" +
                                        std::to_string(groups) + ", " + g + ", " + g +
                                        "): scale_search.group_second_moments of the rows w reads");
        if (plain.ndim() != 2 || plain.shape(0) != n || plain.shape(1) != groups || divisors.ndim() != 1)
            throw std::invalid_argument(name + "plain scales must be (N, K // group) = (" + std::to_string(n) + ", " +
                                        std::to_string(groups) + ") and divisors 1-D");
        if (threads < 0) throw std::invalid_argument(name + "threads must be >= 0 (0: one per core)");
        py::array_t<float> scales({n, groups});
        float* out = scales.mutable_data();
        {
            py::gil_scoped_release unlocked;  // the build's other threads (reading, packing) run meanwhile
            int4_output_error_scale_search(w.data(), n, k, group, moments.data(), plain.data(), divisors.data(),
                                           divisors.shape(0), threads, out);
        }
        return scales;
    }, py::arg("w"), py::arg("group"), py::arg("moments"), py::arg("plain"), py::arg("divisors"),
       py::arg("threads") = 0,
       "Symmetric int4 group scales (N, K // group) for the output error e^T M e of each group: "
       "quantization/scale_search.int4_symmetric_scales_for_inputs (its NumPy reference: "
       "int4_symmetric_scales_for_inputs_reference)");
}

}  // namespace bessemer
