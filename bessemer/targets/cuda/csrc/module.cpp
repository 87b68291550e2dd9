// pybind11 bindings: bessemer._cuda, the cuda target's executor. Built on every machine
// with no CUDA headers or libraries: the driver is loaded only when a Driver is opened.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "driver.h"
#include "executor.h"
#include "kernel.h"
#include "contract_py.h"
#include "plan_parse.h"
#include "spec_parse.h"
#include "step_batch_py.h"

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

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;
using I32 = bessemer::PyStepBatch::I32;

void need_length(const py::array& a, int64_t n, const char* what) {
    if (a.size() != n)
        throw std::invalid_argument(std::string(what) + " has " + std::to_string(a.size()) + " entries, expected " +
                                    std::to_string(n));
}

// Executor.step: the runtime's step inputs (the six arrays of a StepBatch, read and checked as
// on every target: format/csrc/step_batch_py.h) plus optional sampling arrays; returns
// (tokens [L] int32 or None, logits [L, vocab] float32 or None).
py::tuple run_step(Executor& ex, const py::object& token_ids, const py::object& positions, const py::object& cu_seqlens,
                   const py::object& context_lens, const py::object& block_tables, const py::object& logits_indices,
                   const py::object& temperature, const py::object& top_k, const py::object& top_p,
                   const py::object& uniform, bool want_tokens, bool want_logits) {
    const bessemer::PyStepBatch batch(token_ids, positions, cu_seqlens, context_lens, block_tables, logits_indices);
    StepRequest r;
    r.batch = batch.batch();
    const int64_t L = r.batch.L;
    F32 temp, topp, uni;
    I32 topk;
    if (!temperature.is_none()) {
        temp = temperature.cast<F32>();
        topp = top_p.cast<F32>();
        uni = uniform.cast<F32>();
        topk = top_k.cast<I32>();
        need_length(temp, L, "temperature");
        need_length(topp, L, "top_p");
        need_length(uni, L, "uniform");
        need_length(topk, L, "top_k");
        r.temperature = temp.data();
        r.top_p = topp.data();
        r.uniform = uni.data();
        r.top_k = topk.data();
    }
    py::object tokens = py::none(), logits = py::none();
    StepOutput out;
    if (want_tokens) {
        py::array_t<int32_t> t(L);
        out.tokens = t.mutable_data();
        tokens = t;
    }
    if (want_logits) {
        const py::ssize_t V = py::ssize_t(ex.plan().vocab_size);
        if (auto slab = ex.lease_host_logits(L)) {
            // the array is a view of the pinned buffer and holds it (a capsule owning the
            // lease) until it is freed: a later step never writes into logits still in use
            out.logits = reinterpret_cast<float*>(slab->data());
            py::capsule lease(new std::shared_ptr<PinnedBuffer>(std::move(slab)),
                              [](void* p) { delete static_cast<std::shared_ptr<PinnedBuffer>*>(p); });
            logits = py::array_t<float>({py::ssize_t(L), V}, {V * py::ssize_t(sizeof(float)), py::ssize_t(sizeof(float))},
                                        out.logits, lease);
        } else {
            py::array_t<float> l({py::ssize_t(L), V});
            out.logits = l.mutable_data();
            logits = l;
        }
    }
    {
        py::gil_scoped_release release;
        ex.step(r, out);
    }
    return py::make_tuple(tokens, logits);
}

// Kernel metadata given from Python (the launcher tests): read as the rank header's are,
// through its JSON text, so there is one metadata reader.
KernelSpec kernel_spec_from_python(const py::dict& metadata) {
    const std::string text = py::module_::import("json").attr("dumps")(metadata).cast<std::string>();
    return kernel_spec_from(bessemer::json::parse(text.data(), text.size()));
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
    m.doc() = "Bessemer cuda executor: CUDA driver through dlopen, AOT Triton cubins, device KV cache";

    auto unavailable = py::register_exception<DriverUnavailable>(m, "DriverUnavailable", PyExc_RuntimeError);
    py::register_exception<DeviceMismatch>(m, "DeviceMismatch", PyExc_RuntimeError);
    py::register_exception<CudaError>(m, "CudaError", PyExc_RuntimeError);
    (void)unavailable;

    m.attr("DRIVER_ABI_VERSION") = bessemer::cu::kDriverAbiVersion;
    // the engine contract's functions and errors, as every extension has them (format/csrc/contract_py.h)
    bessemer::def_contract(m);
    m.def("read_launch_plan", [](const std::string& rank_file) {
        const LaunchPlan plan = read_launch_plan(bessemer::EngineFile(rank_file));
        py::dict d;
        d["kernels"] = plan.kernels.size();
        d["weights"] = plan.weights.size();
        d["forward"] = plan.forward.size();
        d["sample"] = plan.sample.size();
        d["vocab_size"] = plan.vocab_size;
        d["kv_bytes_per_token"] =
            bessemer::kv_bytes_per_token(plan.kv.layers, plan.kv.heads, plan.kv.head_dim, plan.kv.dtype);
        return d;
    }, py::arg("rank_file"), "reads and checks a cuda rank file as the Executor does, without a GPU: a summary");
    m.attr("LIBRARY_ENV") = kLibraryEnv;
    m.attr("SYNC_ENV") = kSyncEnv;

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
                                                 kernel_spec_from_python(metadata));
             }),
             py::arg("device"), py::arg("cubin"), py::arg("metadata"))
        .def_property_readonly("entry", [](const Kernel& k) { return k.spec().entry; })
        .def_property_readonly("block_threads", &Kernel::block_threads)
        .def("launch", [](const Kernel& k, std::array<uint32_t, 3> grid, py::bytes packed) {
            std::string data = packed;
            if (data.size() != k.spec().packed_bytes())
                throw std::invalid_argument("packed parameters are " + std::to_string(data.size()) + " bytes, kernel " +
                                            k.spec().entry + " takes " + std::to_string(k.spec().packed_bytes()));
            k.device()->make_current();  // the calling thread may not be the one that loaded it
            k.launch(nullptr, grid, reinterpret_cast<uint8_t*>(&data[0]));
        }, py::arg("grid"), py::arg("packed"));

    py::class_<Executor>(m, "Executor")
        .def(py::init([](std::shared_ptr<Device> device, const std::string& rank_file, uint64_t upload_chunk_bytes,
                         const py::object& progress, const py::object& sync_launches) {
                 LoadOptions options;
                 options.upload_chunk_bytes = upload_chunk_bytes;
                 options.sync_launches = sync_launches.is_none() ? sync_launches_from_environment()
                                                                 : sync_launches.cast<bool>();
                 if (!progress.is_none())
                     options.progress = [progress](size_t done, size_t total) { progress(done, total); };
                 const bessemer::EngineFile file(rank_file);  // unmapped once weights and cubins are on the GPU
                 return std::make_unique<Executor>(device, file, read_launch_plan(file), options);
             }),
             py::arg("device"), py::arg("rank_file"), py::arg("upload_chunk_bytes") = 64ull << 20,
             py::arg("progress") = py::none(), py::arg("sync_launches") = py::none(),
             "loads a cuda rank file: read and checked by the engine contract's reader (format/csrc), "
             "weights uploaded, every cubin loaded; sync_launches None: $BESSEMER_CUDA_SYNC decides")
        .def_property_readonly("sync_launches", &Executor::sync_launches)
        .def_property_readonly("failure", [](const Executor& e) -> py::object {
            const std::string f = e.failure();
            return f.empty() ? py::object(py::none()) : py::object(py::str(f));
        }, "why no step can run any more (the GPU failed during one), or None")
        .def_property_readonly("host_logits_rows", &Executor::host_logits_rows)
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
