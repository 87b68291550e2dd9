// pybind11 bindings: bessemer._C (EngineFile, Executor, cpu_features).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "communicator.h"
#include "contract_py.h"
#include "rank_file.h"
#include "executor.h"
#include "gptq_columns_py.h"
#include "int4_output_search_py.h"
#include "int4_fake_quant_py.h"
#include "int4_scale_search_py.h"
#include "int4_superblock_search_py.h"

namespace py = pybind11;
using bessemer::EngineFile;
using bessemer::Executor;

PYBIND11_MODULE(_C, m) {
    m.doc() = "Bessemer C++ runtime: rank-file mmap, plan executor, CPU kernels";
    // the engine contract's functions and errors, as every extension has them (format/csrc/contract_py.h)
    bessemer::def_contract(m);

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
        .def(py::init<std::shared_ptr<EngineFile>, int, int, int, const std::string&>(), py::arg("file"),
             py::arg("num_threads"), py::arg("kv_block_size"), py::arg("num_kv_blocks"), py::arg("isa") = "auto",
             "reads the plan and tensor table from the rank file's own header")
        .def("step", &Executor::step, py::arg("batch"), "batch: a StepBatch (format/step.py) -> logits [L, V]")
        .def_property_readonly("isa", &Executor::isa)
        .def_property_readonly("num_threads", &Executor::num_threads)
        .def_property("active_threads", &Executor::active_threads, &Executor::set_active_threads)
        .def_property_readonly("num_kv_blocks", &Executor::num_kv_blocks)
        .def_property_readonly("kv_block_size", &Executor::kv_block_size)
        .def_property_readonly("kv_cache_bytes", &Executor::kv_cache_bytes)
        .def_property_readonly("kernels", &Executor::kernels)
        .def_property("profiling", &Executor::profiling, &Executor::set_profiling,
                      "per-op timing on/off (turning it on clears the stats)")
        .def("profile_stats", &Executor::profile_stats, "op -> (calls, seconds) since profiling was turned on")
        .def("attach_communicator", &Executor::attach_communicator, py::arg("comm"))
        .def_property_readonly("needs_communicator", &Executor::needs_communicator);

    using bessemer::Collectives;
    using bessemer::ShmCommunicator;
    py::class_<Collectives, std::shared_ptr<Collectives>>(m, "Collectives")
        .def_property_readonly("rank", &Collectives::rank)
        .def_property_readonly("world", &Collectives::world)
        .def_property_readonly("failed", &Collectives::failed)
        .def_property_readonly("error", &Collectives::error)
        .def("all_reduce", [](Collectives& c, py::array_t<float, py::array::c_style> x) {
            if (x.ndim() != 2) throw std::invalid_argument("all_reduce: x must be 2-D float32");
            bool ok;
            {
                py::gil_scoped_release release;
                ok = c.all_reduce(x.mutable_data(), int(x.shape(0)), int(x.shape(1)), x.shape(1));
            }
            if (!ok) throw std::runtime_error(c.error());
        }, py::arg("x"), "in place: x (rows, width) float32, C order")
        .def("all_gather", [](Collectives& c, py::array_t<float, py::array::c_style> x, int full) {
            if (x.ndim() != 2) throw std::invalid_argument("all_gather: x must be 2-D float32");
            py::array_t<float> y({x.shape(0), py::ssize_t(full)});
            bool ok;
            {
                py::gil_scoped_release release;
                ok = c.all_gather(x.data(), x.shape(1), int(x.shape(0)), int(x.shape(1)), y.mutable_data(),
                                  full, full);
            }
            if (!ok) throw std::runtime_error(c.error());
            return y;
        }, py::arg("x"), py::arg("full_width"));

    py::class_<ShmCommunicator, Collectives, std::shared_ptr<ShmCommunicator>>(m, "ShmCommunicator")
        .def(py::init<const std::string&, int, int, int64_t, double, bool>(), py::arg("name"), py::arg("rank"),
             py::arg("world"), py::arg("slot_bytes"), py::arg("timeout_s"), py::arg("create"))
        .def("bcast_send", [](ShmCommunicator& c, py::array_t<int32_t, py::array::c_style | py::array::forcecast> a) {
            bool ok;
            {
                py::gil_scoped_release release;
                ok = c.bcast_send(a.data(), a.size());
            }
            if (!ok) throw std::runtime_error(c.error());
        }, py::arg("words"))
        .def("bcast_recv", [](ShmCommunicator& c) {
            std::vector<int32_t> v;
            bool ok;
            {
                py::gil_scoped_release release;
                ok = c.bcast_recv(&v);
            }
            if (!ok) throw std::runtime_error(c.error());
            py::array_t<int32_t> a(py::ssize_t(v.size()));
            std::copy(v.begin(), v.end(), a.mutable_data());
            return a;
        })
        .def("barrier", [](ShmCommunicator& c, double timeout_s) {
            bool ok;
            {
                py::gil_scoped_release release;
                ok = c.barrier(timeout_s);
            }
            if (!ok) throw std::runtime_error(c.error());
        }, py::arg("timeout_s"))
        .def("abort", &ShmCommunicator::abort, py::arg("reason"))
        .def("beat", &ShmCommunicator::beat)
        .def("unlink", &ShmCommunicator::unlink)
        .def_property_readonly("slot_bytes", &ShmCommunicator::slot_bytes)
        .def_property_readonly("timeout_s", &ShmCommunicator::timeout_s);

    py::class_<bessemer::PyCollectives, Collectives, std::shared_ptr<bessemer::PyCollectives>>(m, "PyCollectives")
        .def(py::init<py::object, int, int>(), py::arg("impl"), py::arg("rank"), py::arg("world"));

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
    m.def("supported_kernels", [](const std::string& target) { return bessemer::supported_kernels(target); },
          py::arg("target") = "cpu");

    bessemer::def_int4_scale_search(m);  // build time: quantization/scale_search.py
    bessemer::def_int4_superblock_search(m);  // build time: quantization/superblock.py
    bessemer::def_gptq_columns(m);  // build time: quantization/gptq.py
    bessemer::def_int4_output_search(m);  // build time: quantization/scale_search.py (w4a16-awq experts)
    bessemer::def_int4_fake_quant(m);  // build time: quantization/awq.py
}
