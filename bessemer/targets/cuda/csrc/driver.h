// The CUDA driver, loaded at run time: dlopen("libcuda.so.1") (or $BESSEMER_LIBCUDA, which
// the tests point at a fake driver), cuGetProcAddress_v2 for every other function at the
// ABI declared in cuda_api.h, cuInit. Nothing here is linked against CUDA.
//
// Errors are one line: DriverUnavailable when there is no driver, no GPU, or a driver too
// old; DeviceMismatch when the GPU is not the one the engine was built for; CudaError for a
// failing call (naming the call, the CUDA error name and its description).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "cuda_api.h"

namespace bessemer {
namespace cuda {

struct DriverUnavailable : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct DeviceMismatch : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct CudaError : std::runtime_error {
    CudaError(cu::CUresult code_, const std::string& what) : std::runtime_error(what), code(code_) {}
    cu::CUresult code;
};

constexpr const char* kLibraryEnv = "BESSEMER_LIBCUDA";
constexpr const char* kDefaultLibrary = "libcuda.so.1";

class Driver {
   public:
    // Loads and initializes the driver; throws DriverUnavailable.
    static std::shared_ptr<Driver> open();
    ~Driver();
    Driver(const Driver&) = delete;
    Driver& operator=(const Driver&) = delete;

    const cu::DriverApi& api() const { return api_; }
    const std::string& library() const { return library_; }
    int version() const { return version_; }  // e.g. 12080 for 12.8
    int device_count() const { return device_count_; }
    // Throws CudaError "<what> failed: CUDA_ERROR_X (description)" unless r is CUDA_SUCCESS.
    void check(cu::CUresult r, const std::string& what) const;
    std::string error_text(cu::CUresult r) const;

   private:
    Driver() = default;
    void* handle_ = nullptr;
    std::string library_;
    cu::DriverApi api_;
    int version_ = 0;
    int device_count_ = 0;
};

// "12.8" from 12080.
std::string version_text(int version);

struct DeviceInfo {
    int ordinal = 0;
    std::string name, pci_bus_id;
    int cc_major = 0, cc_minor = 0;
    int multiprocessors = 0;
    int shared_per_block_optin = 0;
    int l2_bytes = 0;
    int memory_bus_bits = 0;
    size_t total_bytes = 0, free_bytes = 0;
};

// One GPU, through its primary context (shared with any other user of the driver in this
// process, e.g. torch in the GPU tests). Every public method makes the context current on
// the calling thread first.
class Device {
   public:
    Device(std::shared_ptr<Driver> driver, int ordinal);  // throws DriverUnavailable (bad ordinal)
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    const std::shared_ptr<Driver>& driver() const { return driver_; }
    const cu::DriverApi& api() const { return driver_->api(); }
    void check(cu::CUresult r, const std::string& what) const { driver_->check(r, what); }
    void make_current() const;
    int ordinal() const { return ordinal_; }
    DeviceInfo info() const;  // memory figures are read now
    // Throws DeviceMismatch unless this GPU runs cubins built for `arch` ("sm_90a": exactly
    // compute capability 9.0; "sm_90": 9.x).
    void require_arch(const std::string& arch) const;

   private:
    std::shared_ptr<Driver> driver_;
    int ordinal_;
    cu::CUdevice device_ = 0;
    cu::CUcontext context_ = nullptr;
    std::string name_;
    int cc_major_ = 0, cc_minor_ = 0;
};

}  // namespace cuda
}  // namespace bessemer
