// pybind11 bindings: bessemer._C (EngineFile, Executor, cpu_features).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>

#include "engine_file.h"
#include "executor.h"

namespace py = pybind11;
using bessemer::EngineFile;
using bessemer::Executor;

PYBIND11_MODULE(_C, m) {
    m.doc() = "Bessemer C++ runtime: rank-file mmap, plan executor, CPU kernels";

    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const bessemer::OsError& e) {
            errno = e.err;
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, e.path.c_str());
        }
    });

    py::class_<EngineFile, std::shared_ptr<EngineFile>>(m, "EngineFile")
        .def(py::init<const std::string&>(), py::arg("path"))
        .def_property_readonly("format_major", &EngineFile::format_major)
        .def_property_readonly("format_minor", &EngineFile::format_minor)
        .def_property_readonly("header", [](const EngineFile& f) {
            return py::bytes(f.header_ptr(), f.header_len());
        })
        .def_property_readonly("data_offset", &EngineFile::data_offset)
        .def_property_readonly("size", &EngineFile::size)
        .def_property_readonly("path", &EngineFile::path)
        .def("__repr__", [](const EngineFile& f) {
            return "<EngineFile " + f.path() + " v" + std::to_string(f.format_major()) + "." +
                   std::to_string(f.format_minor()) + " " + std::to_string(f.size()) + " bytes>";
        });

    py::class_<Executor>(m, "Executor")
        .def(py::init<std::shared_ptr<EngineFile>, const py::object&, const py::dict&, int, int, int,
                      const std::string&>(),
             py::arg("file"), py::arg("tensors"), py::arg("plan"), py::arg("num_threads"),
             py::arg("kv_block_size"), py::arg("num_kv_blocks"), py::arg("isa") = "auto")
        .def("step", &Executor::step, py::arg("token_ids"), py::arg("positions"), py::arg("cu_seqlens"),
             py::arg("context_lens"), py::arg("block_tables"), py::arg("logits_indices"))
        .def_property_readonly("isa", &Executor::isa)
        .def_property_readonly("num_threads", &Executor::num_threads)
        .def_property_readonly("num_kv_blocks", &Executor::num_kv_blocks)
        .def_property_readonly("kv_block_size", &Executor::kv_block_size)
        .def_property_readonly("kv_cache_bytes", &Executor::kv_cache_bytes)
        .def_property_readonly("kernels", &Executor::kernels)
        .def_property("profiling", &Executor::profiling, &Executor::set_profiling,
                      "per-op timing on/off (turning it on clears the stats)")
        .def("profile_stats", &Executor::profile_stats, "op -> (calls, seconds) since profiling was turned on");

    m.def("cpu_features", []() {
        const bessemer::CpuFeatures f = bessemer::detect_cpu_features();
        py::dict d;
        d["avx2"] = f.avx2;
        d["fma"] = f.fma;
        d["f16c"] = f.f16c;
        d["avx512f"] = f.avx512f;
        d["avx512bw"] = f.avx512bw;
        d["avx512vl"] = f.avx512vl;
        d["avx512dq"] = f.avx512dq;
        d["avx512_bf16"] = f.avx512_bf16;
        d["avx512_vnni"] = f.avx512_vnni;
        return d;
    });
    m.def("supported_kernels", []() { return bessemer::supported_kernels(); });
}
