#include "kernel.h"

#include <stdexcept>

namespace bessemer {
namespace cuda {

uint32_t KernelSpec::packed_bytes() const {
    uint32_t end = 0;
    for (const auto& p : params) end = std::max(end, p.offset + p.size);
    return end;
}

Kernel::Kernel(std::shared_ptr<Device> device, const uint8_t* cubin, size_t cubin_bytes, KernelSpec spec)
    : device_(std::move(device)), spec_(std::move(spec)) {
    if (cubin_bytes < 64) throw std::invalid_argument("kernel " + spec_.entry + ": cubin of " +
                                                      std::to_string(cubin_bytes) + " bytes is truncated");
    if (spec_.num_warps < 1 || spec_.num_warps > 32 || spec_.num_ctas < 1)
        throw std::invalid_argument("kernel " + spec_.entry + ": num_warps " + std::to_string(spec_.num_warps) +
                                    " / num_ctas " + std::to_string(spec_.num_ctas) + " out of range");
    device_->make_current();
    const auto& api = device_->api();
    device_->check(api.cuModuleLoadData(&module_, cubin), "cuModuleLoadData(" + spec_.entry + ")");
    device_->check(api.cuModuleGetFunction(&function_, module_, spec_.entry.c_str()),
                   "cuModuleGetFunction(" + spec_.entry + ")");
    check_params();
    if (spec_.shared > kDefaultSharedLimit) {
        device_->check(api.cuFuncSetAttribute(function_, cu::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                              int(spec_.shared)),
                       "cuFuncSetAttribute(" + spec_.entry + ", max dynamic shared " + std::to_string(spec_.shared) +
                           " bytes)");
    }
    auto attribute = [](cu::CUlaunchAttributeID id) {
        cu::CUlaunchAttribute a{};
        a.id = id;
        return a;
    };
    if (spec_.launch_pdl) {
        auto a = attribute(cu::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
        a.value.programmaticStreamSerializationAllowed = 1;
        attrs_.push_back(a);
    }
    if (spec_.launch_cooperative_grid) {
        auto a = attribute(cu::CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
        a.value.cooperative = 1;
        attrs_.push_back(a);
    }
    if (spec_.num_ctas != 1) {
        auto a = attribute(cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
        a.value.clusterDim.x = uint32_t(spec_.num_ctas);
        a.value.clusterDim.y = a.value.clusterDim.z = 1;
        attrs_.push_back(a);
        auto b = attribute(cu::CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
        b.value.clusterSchedulingPolicyPreference = cu::CU_CLUSTER_SCHEDULING_POLICY_SPREAD;
        attrs_.push_back(b);
    }
}

Kernel::~Kernel() {
    if (module_) {
        device_->make_current();
        device_->api().cuModuleUnload(module_);
    }
}

void Kernel::check_params() const {
    const auto& api = device_->api();
    for (size_t i = 0; i < spec_.params.size(); ++i) {
        size_t offset = 0, size = 0;
        const cu::CUresult r = api.cuFuncGetParamInfo(function_, i, &offset, &size);
        const ParamSpec& p = spec_.params[i];
        if (r == cu::CUDA_ERROR_INVALID_VALUE) {
            throw std::invalid_argument("kernel " + spec_.entry + ": the cubin has " + std::to_string(i) +
                                        " parameters, the engine's metadata " + std::to_string(spec_.params.size()) +
                                        "; the engine is corrupt or from another compiler: rebuild it");
        }
        device_->check(r, "cuFuncGetParamInfo(" + spec_.entry + ", " + std::to_string(i) + ")");
        if (offset != p.offset || size != p.size) {
            throw std::invalid_argument("kernel " + spec_.entry + ": parameter " + std::to_string(i) + " (" + p.name +
                                        ") is at offset " + std::to_string(offset) + " size " + std::to_string(size) +
                                        " in the loaded cubin but offset " + std::to_string(p.offset) + " size " +
                                        std::to_string(p.size) + " in the engine; rebuild the engine");
        }
    }
    size_t offset = 0, size = 0;
    if (api.cuFuncGetParamInfo(function_, spec_.params.size(), &offset, &size) == cu::CUDA_SUCCESS) {
        throw std::invalid_argument("kernel " + spec_.entry + ": the cubin has more than the " +
                                    std::to_string(spec_.params.size()) +
                                    " parameters the engine describes; rebuild the engine");
    }
}

void Kernel::launch(cu::CUstream stream, const std::array<uint32_t, 3>& grid, uint8_t* packed) const {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;
    void* args[64];
    if (spec_.params.size() > 64) throw std::invalid_argument("kernel " + spec_.entry + ": more than 64 parameters");
    for (size_t i = 0; i < spec_.params.size(); ++i) args[i] = packed + spec_.params[i].offset;
    cu::CUlaunchConfig config{};
    config.gridDimX = grid[0] * uint32_t(spec_.num_ctas);
    config.gridDimY = grid[1];
    config.gridDimZ = grid[2];
    config.blockDimX = block_threads();
    config.blockDimY = 1;
    config.blockDimZ = 1;
    config.sharedMemBytes = spec_.shared;
    config.hStream = stream;
    config.attrs = const_cast<cu::CUlaunchAttribute*>(attrs_.data());
    config.numAttrs = unsigned(attrs_.size());
    const cu::CUresult r = device_->api().cuLaunchKernelEx(&config, function_, args, nullptr);
    if (r != cu::CUDA_SUCCESS) device_->check(r, "cuLaunchKernelEx(" + spec_.entry + ")");  // message built on failure only
}

}  // namespace cuda
}  // namespace bessemer
