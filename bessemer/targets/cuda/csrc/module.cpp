// pybind11 bindings: bessemer._cuda, the cuda target's executor. Built on every machine
// with no CUDA headers or libraries: the driver is loaded only when a Driver is opened.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "driver.h"
#include "executor.h"
#include "kernel.h"
#include "plan_parse.h"
#include "spec_parse.h"

namespace py = pybind11;
using namespace bessemer::cuda;

namespace {

py::dict info_dict(const DeviceInfo& i) {
    py::dict d;
    d["ordinal"] = i.ordinal;
    d["name"] = i.name;
    d["pci_bus_id"] = i.pci_bus_id;
    d["compute_capability"] = std::to_string(i.cc_major) + "." + std::to_string(i.cc_minor);
    d["multiprocessors"] = i.multiprocessors;
    d["shared_per_block_optin"] = i.shared_per_block_optin;
    d["l2_bytes"] = i.l2_bytes;
    d["memory_bus_bits"] = i.memory_bus_bits;
    d["total_bytes"] = i.total_bytes;
    d["free_bytes"] = i.free_bytes;
    return d;
}

using I32 = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;
using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

I32 i32(const py::object& o) { return o.cast<I32>(); }

void need_length(const py::array& a, int64_t n, const char* what) {
    if (a.size() != n)
        throw std::invalid_argument(std::string(what) + " has " + std::to_string(a.size()) + " entries, expected " +
                                    std::to_string(n));
}

// Executor.step: the runtime's step inputs (as for the cpu executor) plus optional sampling
// arrays; returns (tokens [L] int32 or None, logits [L, vocab] float32 or None).
py::tuple run_step(Executor& ex, const py::object& token_ids, const py::object& positions, const py::object& cu_seqlens,
                   const py::object& context_lens, const py::object& block_tables, const py::object& logits_indices,
                   const py::object& temperature, const py::object& top_k, const py::object& top_p,
                   const py::object& uniform, bool want_tokens, bool want_logits) {
    I32 tok = i32(token_ids), pos = i32(positions), cu = i32(cu_seqlens), ctx = i32(context_lens), li = i32(logits_indices);
    I32 bt = i32(block_tables);
    StepRequest r;
    r.tokens = tok.size();
    r.seqs = ctx.size();
    r.selected = li.size();
    need_length(pos, r.tokens, "positions");
    need_length(cu, r.seqs + 1, "cu_seqlens");
    if (bt.ndim() != 2 || bt.shape(0) != r.seqs) throw std::invalid_argument("block_tables must be [sequences, blocks]");
    r.table_width = bt.shape(1);
    r.token_ids = tok.data();
    r.positions = pos.data();
    r.cu_seqlens = cu.data();
    r.context_lens = ctx.data();
    r.block_tables = bt.data();
    r.logits_indices = li.data();
    F32 temp, topp, uni;
    I32 topk;
    if (!temperature.is_none()) {
        temp = temperature.cast<F32>();
        topp = top_p.cast<F32>();
        uni = uniform.cast<F32>();
        topk = i32(top_k);
        need_length(temp, r.selected, "temperature");
        need_length(topp, r.selected, "top_p");
        need_length(uni, r.selected, "uniform");
        need_length(topk, r.selected, "top_k");
        r.temperature = temp.data();
        r.top_p = topp.data();
        r.uniform = uni.data();
        r.top_k = topk.data();
    }
    py::object tokens = py::none(), logits = py::none();
    StepOutput out;
    if (want_tokens) {
        py::array_t<int32_t> t(r.selected);
        out.tokens = t.mutable_data();
        tokens = t;
    }
    if (want_logits) {
        py::array_t<float> l({py::ssize_t(r.selected), py::ssize_t(ex.plan().vocab_size)});
        out.logits = l.mutable_data();
        logits = l;
    }
    {
        py::gil_scoped_release release;
        ex.step(r, out);
    }
    return py::make_tuple(tokens, logits);
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
    m.doc() = "Bessemer cuda executor: CUDA driver through dlopen, AOT Triton cubins, device KV cache";

    auto unavailable = py::register_exception<DriverUnavailable>(m, "DriverUnavailable", PyExc_RuntimeError);
    py::register_exception<DeviceMismatch>(m, "DeviceMismatch", PyExc_RuntimeError);
    py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
    (void)unavailable;

    m.attr("DRIVER_ABI_VERSION") = bessemer::cu::kDriverAbiVersion;
    m.attr("LIBRARY_ENV") = kLibraryEnv;

    py::class_<Driver, std::shared_ptr<Driver>>(m, "Driver")
        .def_static("open", &Driver::open, "dlopen the driver, resolve the API, cuInit (raises DriverUnavailable)")
        .def_property_readonly("library", &Driver::library)
        .def_property_readonly("version", [](const Driver& d) { return version_text(d.version()); })
        .def_property_readonly("device_count", &Driver::device_count);

    py::class_<Device, std::shared_ptr<Device>>(m, "Device")
        .def(py::init<std::shared_ptr<Driver>, int>(), py::arg("driver"), py::arg("ordinal"))
        .def("info", [](const Device& d) { return info_dict(d.info()); })
        .def("require_arch", &Device::require_arch, py::arg("arch"))
        .def_property_readonly("ordinal", &Device::ordinal);

    // Low-level access used by the launcher tests (the executor drives kernels itself).
    py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel")
        .def(py::init([](std::shared_ptr<Device> device, py::bytes cubin, const py::dict& metadata) {
                 const std::string data = cubin;
                 return std::make_shared<Kernel>(device, reinterpret_cast<const uint8_t*>(data.data()), data.size(),
                                                 kernel_spec_from(metadata));
             }),
             py::arg("device"), py::arg("cubin"), py::arg("metadata"))
        .def_property_readonly("entry", [](const Kernel& k) { return k.spec().entry; })
        .def_property_readonly("block_threads", &Kernel::block_threads)
        .def("launch", [](const Kernel& k, std::array<uint32_t, 3> grid, py::bytes packed) {
            std::string data = packed;
            if (data.size() != k.spec().packed_bytes())
                throw std::invalid_argument("packed parameters are " + std::to_string(data.size()) + " bytes, kernel " +
                                            k.spec().entry + " takes " + std::to_string(k.spec().packed_bytes()));
            k.launch(nullptr, grid, reinterpret_cast<uint8_t*>(&data[0]));
        }, py::arg("grid"), py::arg("packed"));

    py::class_<Executor>(m, "Executor")
        .def(py::init([](std::shared_ptr<Device> device, const std::string& rank_file, uint64_t data_offset,
                         const py::dict& header, uint64_t upload_chunk_bytes, const py::object& progress) {
                 LoadOptions options;
                 options.upload_chunk_bytes = upload_chunk_bytes;
                 if (!progress.is_none())
                     options.progress = [progress](size_t done, size_t total) { progress(done, total); };
                 LaunchPlan plan = parse_plan(header, header["data_size"].cast<uint64_t>());
                 return std::make_unique<Executor>(device, rank_file, data_offset, std::move(plan), options);
             }),
             py::arg("device"), py::arg("rank_file"), py::arg("data_offset"), py::arg("header"),
             py::arg("upload_chunk_bytes") = 64ull << 20, py::arg("progress") = py::none())
        .def_property_readonly("kv_bytes_per_block", &Executor::kv_bytes_per_block)
        .def("allocate_kv_cache", &Executor::allocate_kv_cache, py::arg("num_blocks"))
        .def_property_readonly("num_kv_blocks", &Executor::num_kv_blocks)
        .def_property_readonly("kv_cache_bytes", &Executor::kv_cache_bytes)
        .def_property_readonly("weight_bytes", &Executor::weight_bytes)
        .def_property_readonly("activation_bytes", &Executor::activation_bytes)
        .def_property_readonly("vocab_size", [](const Executor& e) { return e.plan().vocab_size; })
        .def("capture_graphs", &Executor::capture_graphs, py::arg("buckets"))
        .def_property_readonly("graph_buckets", &Executor::graph_buckets)
        .def_property("use_graphs", &Executor::use_graphs, &Executor::set_use_graphs)
        .def("step", &run_step, py::arg("token_ids"), py::arg("positions"), py::arg("cu_seqlens"),
             py::arg("context_lens"), py::arg("block_tables"), py::arg("logits_indices"),
             py::arg("temperature") = py::none(), py::arg("top_k") = py::none(), py::arg("top_p") = py::none(),
             py::arg("uniform") = py::none(), py::arg("want_tokens") = false, py::arg("want_logits") = true)
        .def("stats", [](const Executor& e) {
            const ExecutorStats s = e.stats();
            py::dict d;
            d["steps"] = s.steps;
            d["eager_steps"] = s.eager_steps;
            d["graph_steps"] = s.graph_steps;
            d["launches"] = s.launches;
            d["uploaded_bytes"] = s.uploaded_bytes;
            return d;
        })
        .def("step_layout", [](const Executor& e, const py::dict& counts) {
            Counts c{};
            for (int i = 0; i < kNumCounts; ++i) c[size_t(i)] = counts[count_name(i)].cast<int64_t>();
            const StepLayout l = layout_for(e.plan(), c);
            py::dict d;
            for (int i = 0; i < kNumStepArrays; ++i)
                d[step_array_name(i)] = py::make_tuple(l.offset[size_t(i)], l.elems[size_t(i)]);
            d["upload_bytes"] = l.upload_bytes;
            return d;
        }, py::arg("counts"), "where each step array lies (byte offset, elements) for these counts")
        .def("memory_map", [](const Executor& e) {
            py::dict d;
            for (const auto& kv : e.memory_map()) d[py::str(kv.first)] = py::make_tuple(kv.second.first, kv.second.second);
            return d;
        })
        .def("read_device", [](Executor& e, uint64_t ptr, uint64_t nbytes) {
            std::string buf(nbytes, '\0');
            e.read_device(ptr, nbytes, &buf[0]);
            return py::bytes(buf);
        }, py::arg("ptr"), py::arg("nbytes"));
}
