// One AOT-compiled Triton kernel on the device: its cubin loaded, its parameter table checked
// against the driver's (cuFuncGetParamInfo), its launch configuration derived from the
// compiled metadata, and a launch that packs arguments the way Triton's own launcher does
// (see GPU.md: parameters in signature order, then the global and profile scratch pointers;
// block = 32 x compiled num_warps; all shared memory dynamic; attributes only when the
// metadata asks for them).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_memory.h"
#include "driver.h"

namespace bessemer {
namespace cuda {

struct ParamSpec {
    std::string name, type;  // Triton type: "*bf16", "i32", "fp32", "*u8" (scratch), ...
    uint32_t offset = 0, size = 0;
    uint32_t divisibility = 1;  // 16: the value was promised 16-divisible at compile time
    bool is_pointer() const { return !type.empty() && type[0] == '*'; }
};

// What the engine stores for one compiled kernel (targets/cuda/compile.py writes it).
struct KernelSpec {
    std::string entry;
    int num_warps = 4, num_ctas = 1;
    uint32_t shared = 0;
    uint64_t global_scratch_size = 0, global_scratch_align = 1;
    uint64_t profile_scratch_size = 0, profile_scratch_align = 1;
    bool launch_pdl = false, launch_cooperative_grid = false;
    std::vector<ParamSpec> params;  // the two scratch pointers included, last
    uint32_t packed_bytes() const;
};

constexpr uint32_t kDefaultSharedLimit = 48 * 1024;

class Kernel {
   public:
    // Loads the cubin and checks it; throws std::invalid_argument naming the kernel and the
    // mismatch, CudaError for a driver failure.
    Kernel(std::shared_ptr<Device> device, const uint8_t* cubin, size_t cubin_bytes, KernelSpec spec);
    ~Kernel();
    Kernel(const Kernel&) = delete;
    Kernel& operator=(const Kernel&) = delete;

    const KernelSpec& spec() const { return spec_; }
    const std::shared_ptr<Device>& device() const { return device_; }
    uint32_t block_threads() const { return 32u * uint32_t(spec_.num_warps); }
    // grid: Triton's program grid (x is multiplied by num_ctas here, as Triton does).
    // packed: the parameter bytes laid out by spec().params. Empty grids are skipped. The
    // caller has made the device's context current on this thread (the executor does once
    // per step; a launch is too hot a path to set it each time).
    void launch(cu::CUstream stream, const std::array<uint32_t, 3>& grid, uint8_t* packed) const;

   private:
    void check_params() const;
    std::shared_ptr<Device> device_;
    KernelSpec spec_;
    cu::CUmodule module_ = nullptr;
    cu::CUfunction function_ = nullptr;
    std::vector<cu::CUlaunchAttribute> attrs_;
};

}  // namespace cuda
}  // namespace bessemer
