#include "driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace bessemer {
namespace cuda {

std::string version_text(int version) {
    return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

std::shared_ptr<Driver> Driver::open() {
    const char* env = std::getenv(kLibraryEnv);
    const std::string library = env && *env ? env : kDefaultLibrary;
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
        const char* why = dlerror();
        throw DriverUnavailable("no CUDA driver: cannot load " + library + " (" + (why ? why : "unknown error") +
                                "); install the NVIDIA driver on a machine with a GPU, or run a cpu engine");
    }
    std::shared_ptr<Driver> d(new Driver());
    d->handle_ = handle;
    d->library_ = library;
    auto* get_proc = reinterpret_cast<cu::GetProcAddressFn*>(dlsym(handle, "cuGetProcAddress_v2"));
    if (!get_proc) {
        throw DriverUnavailable(library + " has no cuGetProcAddress_v2: the CUDA driver is older than 12.0; "
                                "update the NVIDIA driver (this runtime needs CUDA " +
                                version_text(cu::kDriverAbiVersion) + " or newer)");
    }
    std::vector<std::string> missing;
    using namespace cu;  // the function list names its types unqualified
#define BESSEMER_CUDA_RESOLVE(field, symbol, official, signature)                                             \
    {                                                                                                          \
        void* fn = nullptr;                                                                                    \
        cu::CUdriverProcAddressQueryResult status = cu::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;                  \
        if (get_proc(symbol, &fn, cu::kDriverAbiVersion, cu::CU_GET_PROC_ADDRESS_DEFAULT, &status) !=          \
                cu::CUDA_SUCCESS ||                                                                            \
            status != cu::CU_GET_PROC_ADDRESS_SUCCESS || !fn)                                                  \
            missing.push_back(symbol);                                                                         \
        else                                                                                                   \
            d->api_.field = reinterpret_cast<cu::FnPtr<signature>>(fn);                                        \
    }
    BESSEMER_CUDA_FUNCTIONS(BESSEMER_CUDA_RESOLVE)
#undef BESSEMER_CUDA_RESOLVE
    // cuDriverGetVersion works before cuInit; an old driver is named as such, not as a list
    // of missing functions.
    if (d->api_.cuDriverGetVersion) d->api_.cuDriverGetVersion(&d->version_);
    if (d->version_ && d->version_ < cu::kDriverAbiVersion) {
        throw DriverUnavailable("the CUDA driver supports CUDA " + version_text(d->version_) +
                                "; this runtime needs " + version_text(cu::kDriverAbiVersion) +
                                " or newer: update the NVIDIA driver");
    }
    if (!missing.empty()) {
        std::string names;
        for (const auto& m : missing) names += (names.empty() ? "" : ", ") + m;
        throw DriverUnavailable(library + " lacks " + names + " at CUDA " + version_text(cu::kDriverAbiVersion) +
                                "; update the NVIDIA driver");
    }
    const cu::CUresult init = d->api_.cuInit(0);
    if (init != cu::CUDA_SUCCESS) {
        throw DriverUnavailable("the CUDA driver found no usable GPU (cuInit: " + d->error_text(init) +
                                "); check nvidia-smi and CUDA_VISIBLE_DEVICES");
    }
    d->check(d->api_.cuDeviceGetCount(&d->device_count_), "cuDeviceGetCount");
    if (d->device_count_ == 0) {
        throw DriverUnavailable("the CUDA driver sees no GPU; check nvidia-smi and CUDA_VISIBLE_DEVICES");
    }
    return d;
}

Driver::~Driver() {
    // The library stays loaded: contexts and modules of other users in this process (and
    // any late destructor of ours) may still call into it.
}

std::string Driver::error_text(cu::CUresult r) const {
    const char* name = nullptr;
    const char* text = nullptr;
    if (api_.cuGetErrorName) api_.cuGetErrorName(r, &name);
    if (api_.cuGetErrorString) api_.cuGetErrorString(r, &text);
    std::string out = name ? name : "CUDA error " + std::to_string(int(r));
    if (text) out += std::string(" (") + text + ")";
    return out;
}

void Driver::check(cu::CUresult r, const std::string& what) const {
    if (r != cu::CUDA_SUCCESS) throw CudaError(r, what + " failed: " + error_text(r));
}

Device::Device(std::shared_ptr<Driver> driver, int ordinal) : driver_(std::move(driver)), ordinal_(ordinal) {
    if (ordinal < 0 || ordinal >= driver_->device_count()) {
        throw DriverUnavailable("GPU " + std::to_string(ordinal) + " does not exist: the driver sees " +
                                std::to_string(driver_->device_count()) + " (numbered from 0 within "
                                "CUDA_VISIBLE_DEVICES); pick another --device");
    }
    const auto& a = api();
    check(a.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
    char name[256] = {0};
    check(a.cuDeviceGetName(name, sizeof(name) - 1, device_), "cuDeviceGetName");
    name_ = name;
    check(a.cuDeviceGetAttribute(&cc_major_, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device_),
          "cuDeviceGetAttribute(compute capability major)");
    check(a.cuDeviceGetAttribute(&cc_minor_, cu::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device_),
          "cuDeviceGetAttribute(compute capability minor)");
    check(a.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
    make_current();
}

Device::~Device() {
    if (context_) api().cuDevicePrimaryCtxRelease(device_);
}

void Device::make_current() const { check(api().cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }

DeviceInfo Device::info() const {
    make_current();
    const auto& a = api();
    DeviceInfo i;
    i.ordinal = ordinal_;
    i.name = name_;
    i.cc_major = cc_major_;
    i.cc_minor = cc_minor_;
    char bus[64] = {0};
    if (a.cuDeviceGetPCIBusId(bus, sizeof(bus) - 1, device_) == cu::CUDA_SUCCESS) i.pci_bus_id = bus;
    check(a.cuDeviceGetAttribute(&i.multiprocessors, cu::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device_),
          "cuDeviceGetAttribute(multiprocessors)");
    check(a.cuDeviceGetAttribute(&i.shared_per_block_optin, cu::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                                 device_),
          "cuDeviceGetAttribute(shared memory per block)");
    check(a.cuDeviceGetAttribute(&i.l2_bytes, cu::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device_),
          "cuDeviceGetAttribute(L2 size)");
    check(a.cuDeviceGetAttribute(&i.memory_bus_bits, cu::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, device_),
          "cuDeviceGetAttribute(memory bus width)");
    check(a.cuMemGetInfo(&i.free_bytes, &i.total_bytes), "cuMemGetInfo");
    return i;
}

void Device::require_arch(const std::string& arch) const {
    // "sm_XY" or "sm_XYa": cubins run on compute capability X.Y' with Y' >= Y; the "a"
    // (architecture-specific features, e.g. Hopper's wgmma) only on exactly X.Y.
    int major = 0, minor = 0;
    bool specific = false;
    const char* s = arch.c_str();
    if (arch.size() >= 5 && std::strncmp(s, "sm_", 3) == 0) {
        const std::string digits = arch.substr(3, arch.size() - 3 - (arch.back() == 'a' ? 1 : 0));
        specific = arch.back() == 'a';
        if (digits.size() >= 2 && digits.find_first_not_of("0123456789") == std::string::npos) {
            major = std::stoi(digits.substr(0, digits.size() - 1));
            minor = digits.back() - '0';
        }
    }
    if (major == 0) throw DeviceMismatch("engine GPU arch '" + arch + "' is not of the form sm_XY or sm_XYa; rebuild it");
    const bool ok = specific ? (cc_major_ == major && cc_minor_ == minor) : (cc_major_ == major && cc_minor_ >= minor);
    if (!ok) {
        throw DeviceMismatch("the engine was built for " + arch + " (compute capability " + std::to_string(major) + "." +
                             std::to_string(minor) + (specific ? std::string(" exactly") : " or a later " + std::to_string(major) + ".x") + ") but GPU " +
                             std::to_string(ordinal_) + " (" + name_ + ") is compute capability " +
                             std::to_string(cc_major_) + "." + std::to_string(cc_minor_) +
                             "; run it on such a GPU or rebuild the engine with --gpu-arch for this one");
    }
}

}  // namespace cuda
}  // namespace bessemer
