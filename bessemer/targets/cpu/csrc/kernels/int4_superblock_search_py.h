// The Python binding of int4_superblock_search (bessemer._C), called by
// quantization/superblock.py at build time.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "int4_superblock_search.h"

namespace bessemer {

inline void def_int4_superblock_search(pybind11::module_& m) {
    namespace py = pybind11;
    using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
    using F64 = py::array_t<double, py::array::c_style | py::array::forcecast>;
    m.def("int4_superblock_search", [](F32 w, F32 importance, F64 factors, int64_t threads) {
        if (w.ndim() != 2 || w.shape(1) % kSuperblockSub != 0)
            throw std::invalid_argument("int4_superblock_search: w must be (N, K) with K a multiple of " +
                                        std::to_string(kSuperblockSub));
        const int64_t n = w.shape(0), k = w.shape(1);
        if (importance.ndim() != 1 || importance.shape(0) != k || factors.ndim() != 1)
            throw std::invalid_argument("int4_superblock_search: importance must be (K,) = (" + std::to_string(k) +
                                        ",) and factors 1-D");
        if (threads < 0) throw std::invalid_argument("int4_superblock_search: threads must be >= 0 (0: one per core)");
        py::array_t<float> scale({n, k / kSuperblockSub}), minimum({n, k / kSuperblockSub});
        float* s = scale.mutable_data();
        float* mn = minimum.mutable_data();
        {
            py::gil_scoped_release unlocked;  // the build's other threads (reading, packing) run meanwhile
            int4_superblock_search(w.data(), n, k, importance.data(), factors.data(), factors.shape(0), s, mn, threads);
        }
        return py::make_tuple(scale, minimum);
    }, py::arg("w"), py::arg("importance"), py::arg("factors"), py::arg("threads") = 0,
       "Sub-block (scale, minimum), (N, K // 32) each, bit-identical to "
       "quantization/superblock.sub_block_params_reference");
}

}  // namespace bessemer
