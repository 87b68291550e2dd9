// Compile-time check that bessemer/targets/cuda/csrc/cuda_api.h declares the driver API
// exactly as the official cuda.h does: sizes and field offsets of every struct, every enum
// value, and every function's type (argument by argument, after mapping our types to the
// official ones). Compiled with `g++ -std=c++17 -fsyntax-only -I<cuda include> ...` by
// tests/test_cuda_driver.py; any difference is a compile error naming the item.
#include "cuda_api.h"  // first: cuda.h's unversioned macros must not rename our fields

#include <cuda.h>

#include <cstddef>
#include <type_traits>

namespace ours = bessemer::cu;

// Official<T>: our type -> the official type it stands for (identity for builtins).
template <class T> struct Official { using type = T; };
template <class T> struct Official<T*> { using type = typename Official<T>::type*; };
template <class T> struct Official<const T> { using type = const typename Official<T>::type; };
template <class R, class... A> struct Official<R(A...)> {
    using type = typename Official<R>::type(typename Official<A>::type...);
};
#define MAP(t) template <> struct Official<ours::t> { using type = ::t; };
MAP(CUresult)
MAP(CUdevice_attribute)
MAP(CUfunction_attribute)
MAP(CUstreamCaptureMode)
MAP(CUdriverProcAddressQueryResult)
MAP(CUlaunchAttributeID)
MAP(CUlaunchAttributeValue)
MAP(CUlaunchAttribute)
MAP(CUlaunchConfig)
MAP(CUclusterSchedulingPolicy)
template <> struct Official<ours::CUctx_st> { using type = ::CUctx_st; };
template <> struct Official<ours::CUmod_st> { using type = ::CUmod_st; };
template <> struct Official<ours::CUfunc_st> { using type = ::CUfunc_st; };
template <> struct Official<ours::CUstream_st> { using type = ::CUstream_st; };
template <> struct Official<ours::CUgraph_st> { using type = ::CUgraph_st; };
template <> struct Official<ours::CUgraphExec_st> { using type = ::CUgraphExec_st; };
#undef MAP

// Scalars and handles: the same type once mapped.
static_assert(std::is_same<Official<ours::CUdeviceptr>::type, ::CUdeviceptr>::value, "CUdeviceptr");
static_assert(std::is_same<Official<ours::CUdevice>::type, ::CUdevice>::value, "CUdevice");
static_assert(std::is_same<Official<ours::cuuint64_t>::type, ::cuuint64_t>::value, "cuuint64_t");
static_assert(std::is_same<Official<ours::CUcontext>::type, ::CUcontext>::value, "CUcontext");
static_assert(std::is_same<Official<ours::CUmodule>::type, ::CUmodule>::value, "CUmodule");
static_assert(std::is_same<Official<ours::CUfunction>::type, ::CUfunction>::value, "CUfunction");
static_assert(std::is_same<Official<ours::CUstream>::type, ::CUstream>::value, "CUstream");
static_assert(std::is_same<Official<ours::CUgraph>::type, ::CUgraph>::value, "CUgraph");
static_assert(std::is_same<Official<ours::CUgraphExec>::type, ::CUgraphExec>::value, "CUgraphExec");

// Enums: same underlying size, same values.
#define SAME_SIZE(t) static_assert(sizeof(ours::t) == sizeof(::t), "size of " #t);
#define SAME_VALUE(v) static_assert(static_cast<long long>(ours::v) == static_cast<long long>(::v), "value of " #v);
SAME_SIZE(CUresult)
SAME_SIZE(CUdevice_attribute)
SAME_SIZE(CUfunction_attribute)
SAME_SIZE(CUstreamCaptureMode)
SAME_SIZE(CUdriverProcAddressQueryResult)
SAME_SIZE(CUlaunchAttributeID)
SAME_SIZE(CUclusterSchedulingPolicy)
SAME_VALUE(CUDA_SUCCESS)
SAME_VALUE(CUDA_ERROR_INVALID_VALUE)
SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY)
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED)
SAME_VALUE(CUDA_ERROR_NO_DEVICE)
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE)
SAME_VALUE(CUDA_ERROR_INVALID_IMAGE)
SAME_VALUE(CUDA_ERROR_INVALID_CONTEXT)
SAME_VALUE(CUDA_ERROR_NO_BINARY_FOR_GPU)
SAME_VALUE(CUDA_ERROR_INVALID_HANDLE)
SAME_VALUE(CUDA_ERROR_NOT_FOUND)
SAME_VALUE(CUDA_ERROR_ILLEGAL_ADDRESS)
SAME_VALUE(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
SAME_VALUE(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
SAME_VALUE(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
SAME_VALUE(CUDA_ERROR_UNKNOWN)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
SAME_VALUE(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
SAME_VALUE(CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
SAME_VALUE(CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
SAME_VALUE(CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
SAME_VALUE(CU_FUNC_ATTRIBUTE_NUM_REGS)
SAME_VALUE(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
SAME_VALUE(CU_STREAM_DEFAULT)
SAME_VALUE(CU_STREAM_NON_BLOCKING)
SAME_VALUE(CU_STREAM_CAPTURE_MODE_GLOBAL)
SAME_VALUE(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
SAME_VALUE(CU_STREAM_CAPTURE_MODE_RELAXED)
SAME_VALUE(CU_GET_PROC_ADDRESS_SUCCESS)
SAME_VALUE(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
SAME_VALUE(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
SAME_VALUE(CU_GET_PROC_ADDRESS_DEFAULT)
SAME_VALUE(CU_CLUSTER_SCHEDULING_POLICY_DEFAULT)
SAME_VALUE(CU_CLUSTER_SCHEDULING_POLICY_SPREAD)
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_IGNORE)
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_COOPERATIVE)
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE)
SAME_VALUE(CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
static_assert(ours::kMemHostAllocPortable == CU_MEMHOSTALLOC_PORTABLE, "value of CU_MEMHOSTALLOC_PORTABLE");

// Structs: same size and alignment, every declared field at the same offset with the same size.
#define SAME_LAYOUT(t)                                                  \
    static_assert(sizeof(ours::t) == sizeof(::t), "size of " #t);       \
    static_assert(alignof(ours::t) == alignof(::t), "alignment of " #t);
#define SAME_FIELD(t, f)                                                                    \
    static_assert(offsetof(ours::t, f) == offsetof(::t, f), "offset of " #t "." #f);       \
    static_assert(sizeof(ours::t::f) == sizeof(::t::f), "size of " #t "." #f);
SAME_LAYOUT(CUlaunchAttributeValue)
SAME_FIELD(CUlaunchAttributeValue, cooperative)
SAME_FIELD(CUlaunchAttributeValue, clusterDim)
SAME_FIELD(CUlaunchAttributeValue, clusterDim.x)
SAME_FIELD(CUlaunchAttributeValue, clusterDim.y)
SAME_FIELD(CUlaunchAttributeValue, clusterDim.z)
SAME_FIELD(CUlaunchAttributeValue, clusterSchedulingPolicyPreference)
SAME_FIELD(CUlaunchAttributeValue, programmaticStreamSerializationAllowed)
SAME_LAYOUT(CUlaunchAttribute)
SAME_FIELD(CUlaunchAttribute, id)
SAME_FIELD(CUlaunchAttribute, value)
SAME_LAYOUT(CUlaunchConfig)
SAME_FIELD(CUlaunchConfig, gridDimX)
SAME_FIELD(CUlaunchConfig, gridDimY)
SAME_FIELD(CUlaunchConfig, gridDimZ)
SAME_FIELD(CUlaunchConfig, blockDimX)
SAME_FIELD(CUlaunchConfig, blockDimY)
SAME_FIELD(CUlaunchConfig, blockDimZ)
SAME_FIELD(CUlaunchConfig, sharedMemBytes)
SAME_FIELD(CUlaunchConfig, hStream)
SAME_FIELD(CUlaunchConfig, attrs)
SAME_FIELD(CUlaunchConfig, numAttrs)

// Functions: each declared type, mapped, is exactly the official function's type at the
// version cuda.h's unversioned name resolves to. Checked inside our namespace so that the
// X list's unqualified type names mean ours (the official ones are reached as ::name).
#define SAME_FUNCTION(field, symbol, official, signature)                                     \
    static_assert(std::is_same<::Official<signature>::type, decltype(::official)>::value,    \
                  "signature of " symbol " (" #official ")");
namespace bessemer {
namespace cu {
BESSEMER_CUDA_FUNCTIONS(SAME_FUNCTION)
static_assert(std::is_same<::Official<GetProcAddressFn>::type, decltype(::cuGetProcAddress_v2)>::value,
              "signature of cuGetProcAddress_v2");
}  // namespace cu
}  // namespace bessemer

int main() { return 0; }
