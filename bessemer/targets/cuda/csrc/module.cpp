// pybind11 bindings: bessemer._cuda, the cuda target's executor. Built on every machine
// with no CUDA headers or libraries: the driver is loaded only when a Driver is opened.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "driver.h"
#include "kernel.h"
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
}
