// The subset of the CUDA driver API the cuda executor uses, declared here so that the
// extension compiles and links on machines with no CUDA headers or libraries.
//
// Every type, enum value and function signature below is checked against the official
// cuda.h at compile time (tests/cuda_executor/conformance.cpp, run by tests/cuda_executor/test_cuda_driver.py
// with the cuda.h that Triton's wheel ships). The functions are not linked: the loader
// (driver.cpp) dlopens libcuda.so.1 and asks cuGetProcAddress_v2 for each one at
// kDriverAbiVersion, so the driver hands back the variant whose signature is declared
// here even when it is newer (a CUDA 13 driver serves the CUDA 12.4 ABI).
//
// Names are the official ones inside namespace bessemer::cu, so the code reads like CUDA
// code and the conformance test can include both headers in one translation unit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace bessemer {
namespace cu {

// The ABI version requested from cuGetProcAddress_v2 (12.4: the first with
// cuFuncGetParamInfo). The driver must be at least this version.
constexpr int kDriverAbiVersion = 12040;

typedef unsigned long long CUdeviceptr;  // official: CUdeviceptr_v2 = unsigned long long
typedef int CUdevice;
typedef std::uint64_t cuuint64_t;  // official: uint64_t
typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUstream_st* CUstream;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphExec_st* CUgraphExec;

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    CUDA_ERROR_UNKNOWN = 999
} CUresult;

typedef enum CUdevice_attribute_enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37,
    CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
} CUdevice_attribute;

typedef enum CUfunction_attribute_enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
} CUfunction_attribute;

typedef enum CUstream_flags_enum { CU_STREAM_DEFAULT = 0x0, CU_STREAM_NON_BLOCKING = 0x1 } CUstream_flags;

typedef enum CUstreamCaptureMode_enum {
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2
} CUstreamCaptureMode;

typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;

typedef enum CUdriverProcAddress_flags_enum { CU_GET_PROC_ADDRESS_DEFAULT = 0 } CUdriverProcAddress_flags;

typedef enum CUclusterSchedulingPolicy_enum {
    CU_CLUSTER_SCHEDULING_POLICY_DEFAULT = 0,
    CU_CLUSTER_SCHEDULING_POLICY_SPREAD = 1
} CUclusterSchedulingPolicy;

typedef enum CUlaunchAttributeID_enum {
    CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
    CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4,
    CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5,
    CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
} CUlaunchAttributeID;

// 64 bytes, 8-byte aligned (official members hold pointers); only the members Triton's
// launch flags need are named.
typedef union CUlaunchAttributeValue_union {
    char pad[64];
    void* align_as_official;
    int cooperative;
    struct {
        unsigned int x;
        unsigned int y;
        unsigned int z;
    } clusterDim;
    CUclusterSchedulingPolicy clusterSchedulingPolicyPreference;
    int programmaticStreamSerializationAllowed;
} CUlaunchAttributeValue;

typedef struct CUlaunchAttribute_st {
    CUlaunchAttributeID id;
    char pad[8 - sizeof(CUlaunchAttributeID)];
    CUlaunchAttributeValue value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig_st {
    unsigned int gridDimX;
    unsigned int gridDimY;
    unsigned int gridDimZ;
    unsigned int blockDimX;
    unsigned int blockDimY;
    unsigned int blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute* attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

constexpr unsigned int kMemHostAllocPortable = 0x01;  // official: the macro CU_MEMHOSTALLOC_PORTABLE

// X(field, "symbol asked of cuGetProcAddress", the official header's versioned name, type)
// The versioned name is what cuda.h's unversioned macro resolves to at this ABI.
#define BESSEMER_CUDA_FUNCTIONS(X)                                                                   \
    X(cuInit, "cuInit", cuInit, CUresult(unsigned int))                                              \
    X(cuDriverGetVersion, "cuDriverGetVersion", cuDriverGetVersion, CUresult(int*))                  \
    X(cuGetErrorName, "cuGetErrorName", cuGetErrorName, CUresult(CUresult, const char**))            \
    X(cuGetErrorString, "cuGetErrorString", cuGetErrorString, CUresult(CUresult, const char**))      \
    X(cuDeviceGetCount, "cuDeviceGetCount", cuDeviceGetCount, CUresult(int*))                        \
    X(cuDeviceGet, "cuDeviceGet", cuDeviceGet, CUresult(CUdevice*, int))                             \
    X(cuDeviceGetName, "cuDeviceGetName", cuDeviceGetName, CUresult(char*, int, CUdevice))           \
    X(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", cuDeviceGetPCIBusId, CUresult(char*, int, CUdevice)) \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", cuDeviceGetAttribute,                            \
      CUresult(int*, CUdevice_attribute, CUdevice))                                                  \
    X(cuDeviceTotalMem, "cuDeviceTotalMem", cuDeviceTotalMem_v2, CUresult(size_t*, CUdevice))        \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain,                \
      CUresult(CUcontext*, CUdevice))                                                                \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2,          \
      CUresult(CUdevice))                                                                            \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", cuCtxSetCurrent, CUresult(CUcontext))                      \
    X(cuCtxSynchronize, "cuCtxSynchronize", cuCtxSynchronize, CUresult())                            \
    X(cuMemGetInfo, "cuMemGetInfo", cuMemGetInfo_v2, CUresult(size_t*, size_t*))                     \
    X(cuMemAlloc, "cuMemAlloc", cuMemAlloc_v2, CUresult(CUdeviceptr*, size_t))                       \
    X(cuMemFree, "cuMemFree", cuMemFree_v2, CUresult(CUdeviceptr))                                   \
    X(cuMemHostAlloc, "cuMemHostAlloc", cuMemHostAlloc, CUresult(void**, size_t, unsigned int))      \
    X(cuMemFreeHost, "cuMemFreeHost", cuMemFreeHost, CUresult(void*))                                \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2,                                  \
      CUresult(CUdeviceptr, const void*, size_t, CUstream))                                          \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2,                                  \
      CUresult(void*, CUdeviceptr, size_t, CUstream))                                                \
    X(cuMemsetD8Async, "cuMemsetD8Async", cuMemsetD8Async,                                           \
      CUresult(CUdeviceptr, unsigned char, size_t, CUstream))                                        \
    X(cuStreamCreate, "cuStreamCreate", cuStreamCreate, CUresult(CUstream*, unsigned int))           \
    X(cuStreamDestroy, "cuStreamDestroy", cuStreamDestroy_v2, CUresult(CUstream))                    \
    X(cuStreamSynchronize, "cuStreamSynchronize", cuStreamSynchronize, CUresult(CUstream))           \
    X(cuModuleLoadData, "cuModuleLoadData", cuModuleLoadData, CUresult(CUmodule*, const void*))      \
    X(cuModuleUnload, "cuModuleUnload", cuModuleUnload, CUresult(CUmodule))                          \
    X(cuModuleGetFunction, "cuModuleGetFunction", cuModuleGetFunction,                               \
      CUresult(CUfunction*, CUmodule, const char*))                                                  \
    X(cuFuncGetAttribute, "cuFuncGetAttribute", cuFuncGetAttribute,                                 \
      CUresult(int*, CUfunction_attribute, CUfunction))                                              \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", cuFuncSetAttribute,                                 \
      CUresult(CUfunction, CUfunction_attribute, int))                                               \
    X(cuFuncGetParamInfo, "cuFuncGetParamInfo", cuFuncGetParamInfo,                                 \
      CUresult(CUfunction, size_t, size_t*, size_t*))                                                \
    X(cuLaunchKernelEx, "cuLaunchKernelEx", cuLaunchKernelEx,                                       \
      CUresult(const CUlaunchConfig*, CUfunction, void**, void**))                                   \
    X(cuStreamBeginCapture, "cuStreamBeginCapture", cuStreamBeginCapture_v2,                         \
      CUresult(CUstream, CUstreamCaptureMode))                                                       \
    X(cuStreamEndCapture, "cuStreamEndCapture", cuStreamEndCapture, CUresult(CUstream, CUgraph*))    \
    X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags,       \
      CUresult(CUgraphExec*, CUgraph, unsigned long long))                                           \
    X(cuGraphLaunch, "cuGraphLaunch", cuGraphLaunch, CUresult(CUgraphExec, CUstream))                \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", cuGraphExecDestroy, CUresult(CUgraphExec))           \
    X(cuGraphDestroy, "cuGraphDestroy", cuGraphDestroy, CUresult(CUgraph))

// cuGetProcAddress_v2 itself is the one symbol taken with dlsym.
typedef CUresult GetProcAddressFn(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                  CUdriverProcAddressQueryResult* symbolStatus);

template <class F> using FnPtr = F*;

// The function table the loader fills.
struct DriverApi {
#define BESSEMER_CUDA_FIELD(field, symbol, official, signature) FnPtr<signature> field = nullptr;
    BESSEMER_CUDA_FUNCTIONS(BESSEMER_CUDA_FIELD)
#undef BESSEMER_CUDA_FIELD
};

}  // namespace cu
}  // namespace bessemer
