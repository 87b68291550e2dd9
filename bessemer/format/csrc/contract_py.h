// The engine contract's functions as every extension exposes them (bessemer._C and
// bessemer._cuda both call def_contract), so tests/test_format_contract.py checks each
// native reader against bessemer/format, and Python code can run the one step check;
// and the reader's OsError raised as Python's OSError in both.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <stdexcept>
#include <string>
#include <vector>

#include "contract.h"
#include "rank_file.h"
#include "step_batch_py.h"

namespace bessemer {

inline void def_contract(pybind11::module_& m) {
    namespace py = pybind11;
    // the rank-file reader's operating-system failures as the matching OSError subclass
    // (FileNotFoundError, PermissionError, ...)
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const OsError& e) {
            errno = e.err;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, e.path.c_str());
        }
    });
    m.def("format_contract", []() {
        py::dict d;
        d["format"] = py::make_tuple(kFormatMajor, kFormatMinor);
        d["magic"] = py::bytes(kEngineMagic, sizeof(kEngineMagic));
        d["align"] = py::make_tuple(kPreambleBytes, kDataAlign, kTensorAlign);
        py::list dtypes, layouts, kv;
        for (const auto& t : kDTypes) dtypes.append(py::make_tuple(t.name, t.id, t.bits));
        for (const auto& l : kLayouts) {
            py::list ok;
            for (int i = 0; i < l.num_dtypes; ++i) ok.append(dtype_name(l.dtypes[i]));
            layouts.append(py::make_tuple(l.name, l.id, l.ndim, l.row_align, l.col_align, l.k_multiple, ok));
        }
        for (const auto& k : kKvDTypes) kv.append(py::make_tuple(dtype_name(k.dtype), k.scale_bytes, k.scales));
        d["dtypes"] = dtypes;
        d["layouts"] = layouts;
        d["kv_dtypes"] = kv;
        d["rows"] = py::make_tuple(kRowKindNames[0], kRowKindNames[1]);
        return d;
    }, "the compiled contract (format.h, contract.h): ids, constants and tables");
    m.def("stored_nbytes", [](int dtype, int layout, std::vector<int64_t> shape) {
        std::string why;
        const int64_t n = stored_nbytes(dtype, layout, shape, &why);
        if (n < 0) throw std::invalid_argument(why);
        return n;
    }, py::arg("dtype"), py::arg("layout"), py::arg("shape"));
    m.def("kv_bytes_per_token", [](int layers, int heads, int head_dim, const std::string& dtype) {
        const int64_t n = kv_bytes_per_token(layers, heads, head_dim, dtype_id(dtype));
        if (n < 0) throw std::invalid_argument("not a KV cache dtype: " + dtype);
        return n;
    }, py::arg("num_layers"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("dtype"));
    m.def("check_step_batch", [](const py::object& batch, int64_t token_limit, int num_kv_blocks, int block_size,
                                 bool reads_kv, int64_t kv_window) {
        StepLimits limits;
        limits.token_limit = token_limit;
        limits.num_kv_blocks = num_kv_blocks;
        limits.block_size = block_size;
        limits.reads_kv = reads_kv;
        limits.kv_window = kv_window;
        return check_step_batch(PyStepBatch(batch).batch(), limits);
    }, py::arg("batch"), py::arg("token_limit"), py::arg("num_kv_blocks"), py::arg("block_size"),
       py::arg("reads_kv") = true, py::arg("kv_window") = 0,
       "the contract's step check (step_batch.h): raises ValueError naming the first bad index; "
       "returns max(1, max context_lens)");
}

}  // namespace bessemer
