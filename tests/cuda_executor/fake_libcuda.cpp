// A fake libcuda.so.1 for testing the cuda executor on machines without a GPU.
//
// Built by the tests (g++ -shared) and selected with BESSEMER_LIBCUDA=<path>. It implements
// the driver subset of bessemer/targets/cuda/csrc/cuda_api.h on host memory ("device"
// pointers are host addresses, copies really copy), and checks what a real driver would
// refuse: copies outside an allocation, a block size other than the cubin's .reqntid,
// dynamic shared memory above 48 KiB without the opt-in attribute, allocation, copies or
// synchronization while a stream is being captured, a cubin for another arch, a launch, copy
// or synchronization from a thread with no current context. Kernels are not executed. cuFuncGetParamInfo answers from the cubin's own parameter table
// (.nv.info.<kernel>, EIATTR_KPARAM_INFO), as the driver does.
//
// Every call of interest is appended as one JSON object per line to $BESSEMER_FAKE_CUDA_LOG:
// launches with grid, block, shared bytes, attributes and the packed parameter bytes (hex,
// laid out by the parameter table exactly as the driver packs them), allocations, copies,
// captures and graph launches (a graph launch also logs each captured launch again, with
// "replay": graph id).
//
// Configuration (environment, read at cuInit):
//   BESSEMER_FAKE_CUDA_DEVICES   number of GPUs (default 1; 0: cuInit fails with NO_DEVICE)
//   BESSEMER_FAKE_CUDA_CC        compute capability "9.0" (default)
//   BESSEMER_FAKE_CUDA_MEMORY_MIB device memory (default 4096; fractions allowed)
//   BESSEMER_FAKE_CUDA_VERSION   driver version (default 12080)
//   BESSEMER_FAKE_CUDA_PARAM_OVERRIDE "<kernel>:<index>:<offset>:<size>" misreports one parameter
//   BESSEMER_FAKE_CUDA_FAIL_LAUNCH=N  the Nth kernel run (eager launches and graph replays'
//                                nodes, counted from 1 since cuInit) is refused at launch with
//                                CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES; the context stays usable
//   BESSEMER_FAKE_CUDA_FAULT_LAUNCH=N the Nth kernel run faults on the device: it is accepted,
//                                the next synchronization reports CUDA_ERROR_ILLEGAL_ADDRESS and
//                                from then on every call does (a real context does not recover)
//   BESSEMER_FAKE_CUDA_GRAPH_MIB  device memory each instantiated graph takes (default 0; fractions allowed)
//
// Test code: the state is one process-wide object, which is what a driver is.
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_api.h"

using namespace bessemer::cu;

namespace {

constexpr int kMaxStaticShared = 48 * 1024;

struct Param {
    uint32_t offset, size;
};

struct Function {
    std::string entry;
    size_t module = 0;  // index of its cuModuleLoadData call in this process
    std::vector<Param> params;
    uint32_t reqntid = 0;
    int registers = 0;
    int max_dynamic_shared = kMaxStaticShared;
};

struct Module {
    std::map<std::string, Function*> functions;
};

struct Node {
    std::string json;  // the launch as logged at capture time
};

struct Graph {
    std::vector<Node> nodes;
};

struct State {
    std::mutex mu;
    bool initialized = false;
    int devices = 1, cc_major = 9, cc_minor = 0;
    size_t memory = size_t(4096) << 20, allocated = 0, pinned = 0, peak_pinned = 0;
    std::map<uintptr_t, size_t> allocations;       // device base -> bytes
    std::map<uintptr_t, size_t> host_allocations;  // pinned base -> bytes
    std::map<CUstream, int> streams;               // stream -> id
    std::map<CUstream, Graph*> capturing;
    std::map<CUgraphExec, Graph*> execs;
    std::vector<Module*> modules;
    int next_stream = 1, next_graph = 1;
    std::map<Graph*, int> graph_ids;
    FILE* log = nullptr;
    std::string log_path;
    std::string override_entry;
    int override_index = -1;
    Param override_param{0, 0};
    int64_t kernel_runs = 0, fail_launch = 0, fault_launch = 0;
    bool faulted = false;          // a kernel faulted; reported at the next synchronization
    CUresult sticky = CUDA_SUCCESS;  // once reported, every call returns it
    size_t graph_bytes = 0;
    std::map<CUgraphExec, size_t> graph_memory;
};

// The context current on the calling thread (cuCtxSetCurrent), as the driver keeps it.
thread_local CUcontext current_context = nullptr;

State& state() {
    static State s;
    return s;
}

void log_line(const std::string& line) {
    // The log path is read on every call: tests point each run at a fresh file while the
    // library (loaded once per process) stays.
    State& s = state();
    const char* path = std::getenv("BESSEMER_FAKE_CUDA_LOG");
    const std::string want = path ? path : "";
    if (want != s.log_path) {
        if (s.log) std::fclose(s.log);
        s.log = want.empty() ? nullptr : std::fopen(want.c_str(), "a");
        s.log_path = want;
    }
    if (!s.log) return;
    std::fputs(line.c_str(), s.log);
    std::fputc('\n', s.log);
    std::fflush(s.log);
}

std::string fmt(const char* f, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, f);
    std::vsnprintf(buf, sizeof(buf), f, ap);
    va_end(ap);
    return buf;
}

std::string hex(const uint8_t* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out(2 * n, '0');
    for (size_t i = 0; i < n; ++i) {
        out[2 * i] = digits[p[i] >> 4];
        out[2 * i + 1] = digits[p[i] & 15];
    }
    return out;
}

int stream_id(CUstream s) {
    if (!s) return 0;
    auto it = state().streams.find(s);
    return it == state().streams.end() ? -1 : it->second;
}

bool capturing_any() { return !state().capturing.empty(); }

// [p, p + n) inside one device allocation?
bool in_device_allocation(uintptr_t p, size_t n) {
    auto& a = state().allocations;
    auto it = a.upper_bound(p);
    if (it == a.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
}

CUresult refuse(const std::string& fn, CUresult code, const std::string& why) {
    log_line(fmt("{\"fn\":\"%s\",\"error\":%d,\"why\":\"%s\"}", fn.c_str(), int(code), why.c_str()));
    return code;
}

// What a call that needs the calling thread's context returns without one.
CUresult need_context(const char* fn) {
    if (!current_context) return refuse(fn, CUDA_ERROR_INVALID_CONTEXT, "no current context on this thread");
    return CUDA_SUCCESS;
}

// The fault of an earlier kernel: reported by the first synchronization after it, then by
// every call.
CUresult fault_at_sync(const char* fn) {
    State& s = state();
    if (s.faulted && s.sticky == CUDA_SUCCESS) s.sticky = CUDA_ERROR_ILLEGAL_ADDRESS;
    if (s.sticky != CUDA_SUCCESS) return refuse(fn, s.sticky, "an earlier kernel faulted");
    return CUDA_SUCCESS;
}

CUresult sticky_error(const char* fn) {
    if (state().sticky != CUDA_SUCCESS) return refuse(fn, state().sticky, "an earlier kernel faulted");
    return CUDA_SUCCESS;
}

// Counts one kernel run; what the fault configuration makes of it.
CUresult run_kernel(const char* fn) {
    State& s = state();
    ++s.kernel_runs;
    if (s.kernel_runs == s.fail_launch)
        return refuse(fn, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, fmt("kernel run %lld", (long long)s.kernel_runs));
    if (s.kernel_runs == s.fault_launch) {
        s.faulted = true;
        log_line(fmt("{\"fn\":\"fault\",\"in\":\"%s\",\"run\":%lld}", fn, (long long)s.kernel_runs));
    }
    return CUDA_SUCCESS;
}

// ---- cubin reading (ELF64, .nv.info.<kernel>) ----
template <class T> T rd(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}

bool parse_cubin(const uint8_t* data, std::vector<Function*>* out, int* sm) {
    if (std::memcmp(data, "\x7f" "ELF", 4) != 0 || data[4] != 2) return false;
    *sm = int(rd<uint32_t>(data + 0x30) & 0xFF);
    const uint64_t shoff = rd<uint64_t>(data + 0x28);
    const uint16_t shentsize = rd<uint16_t>(data + 0x3A), shnum = rd<uint16_t>(data + 0x3C),
                   shstrndx = rd<uint16_t>(data + 0x3E);
    auto header = [&](int i) { return data + shoff + uint64_t(i) * shentsize; };
    const uint8_t* names = data + rd<uint64_t>(header(shstrndx) + 0x18);
    for (int i = 0; i < shnum; ++i) {
        const char* name = reinterpret_cast<const char*>(names + rd<uint32_t>(header(i)));
        if (std::strncmp(name, ".nv.info.", 9) != 0) continue;
        auto* f = new Function();
        f->entry = name + 9;
        const uint8_t* p = data + rd<uint64_t>(header(i) + 0x18);
        const uint8_t* end = p + rd<uint64_t>(header(i) + 0x20);
        std::map<int, Param> by_ordinal;
        while (p + 4 <= end) {
            const int format = p[0], attr = p[1];
            if (format != 4) {  // not EIFMT_SVAL: 2 value bytes
                p += 4;
                continue;
            }
            const uint16_t size = rd<uint16_t>(p + 2);
            const uint8_t* v = p + 4;
            if (attr == 0x17) {  // EIATTR_KPARAM_INFO: index u32, ordinal u16, offset u16, packed u32
                const uint32_t packed = rd<uint32_t>(v + 8);
                by_ordinal[rd<uint16_t>(v + 4)] = Param{rd<uint16_t>(v + 6), (packed >> 18) & 0x3FFF};
            } else if (attr == 0x10) {  // EIATTR_REQNTID
                f->reqntid = rd<uint32_t>(v);
            }
            p += 4 + size;
        }
        for (auto& kv : by_ordinal) f->params.push_back(kv.second);
        out->push_back(f);
    }
    return true;
}

// ---- the driver API ----
CUresult fake_cuInit(unsigned int) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    // configuration is read afresh at every cuInit (one library per test process)
    s.devices = 1;
    s.cc_major = 9;
    s.cc_minor = 0;
    s.memory = size_t(4096) << 20;
    s.override_entry.clear();
    s.override_index = -1;
    s.kernel_runs = s.fail_launch = s.fault_launch = 0;
    s.faulted = false;
    s.sticky = CUDA_SUCCESS;
    s.graph_bytes = 0;
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_FAIL_LAUNCH")) s.fail_launch = std::atoll(v);
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_FAULT_LAUNCH")) s.fault_launch = std::atoll(v);
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_GRAPH_MIB")) s.graph_bytes = size_t(std::atof(v) * double(1 << 20));
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_DEVICES")) s.devices = std::atoi(v);
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_CC")) std::sscanf(v, "%d.%d", &s.cc_major, &s.cc_minor);
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_MEMORY_MIB")) s.memory = size_t(std::atof(v) * double(1 << 20));
    if (const char* v = std::getenv("BESSEMER_FAKE_CUDA_PARAM_OVERRIDE")) {
        char entry[256];
        unsigned idx, off, size;
        if (std::sscanf(v, "%255[^:]:%u:%u:%u", entry, &idx, &off, &size) == 4) {
            s.override_entry = entry;
            s.override_index = int(idx);
            s.override_param = Param{off, size};
        }
    }
    log_line(fmt("{\"fn\":\"cuInit\",\"devices\":%d}", s.devices));
    if (s.devices <= 0) return CUDA_ERROR_NO_DEVICE;
    s.initialized = true;
    return CUDA_SUCCESS;
}

CUresult fake_cuDriverGetVersion(int* v) {
    const char* e = std::getenv("BESSEMER_FAKE_CUDA_VERSION");
    *v = e ? std::atoi(e) : 12080;
    return CUDA_SUCCESS;
}

const char* error_name(CUresult r) {
    switch (r) {
        case CUDA_SUCCESS: return "CUDA_SUCCESS";
        case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
        case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
        case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
        case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
        case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
        case CUDA_ERROR_INVALID_IMAGE: return "CUDA_ERROR_INVALID_IMAGE";
        case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
        case CUDA_ERROR_ILLEGAL_ADDRESS: return "CUDA_ERROR_ILLEGAL_ADDRESS";
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES";
        case CUDA_ERROR_NO_BINARY_FOR_GPU: return "CUDA_ERROR_NO_BINARY_FOR_GPU";
        case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
        case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
        case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED";
        default: return "CUDA_ERROR_UNKNOWN";
    }
}

CUresult fake_cuGetErrorName(CUresult r, const char** s) {
    *s = error_name(r);
    return CUDA_SUCCESS;
}

CUresult fake_cuGetErrorString(CUresult r, const char** s) {
    switch (r) {  // the real driver's wording
        case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *s = "an illegal memory access was encountered"; break;
        case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: *s = "too many resources requested for launch"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
        default: *s = "fake driver error";
    }
    return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetCount(int* n) {
    *n = state().initialized ? state().devices : 0;
    return state().initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult fake_cuDeviceGet(CUdevice* d, int ordinal) {
    if (ordinal < 0 || ordinal >= state().devices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetName(char* name, int len, CUdevice d) {
    std::snprintf(name, size_t(len), "Fake GPU %d (compute %d.%d)", d, state().cc_major, state().cc_minor);
    return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetPCIBusId(char* bus, int len, CUdevice d) {
    std::snprintf(bus, size_t(len), "0000:%02x:00.0", d + 1);
    return CUDA_SUCCESS;
}

CUresult fake_cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice) {
    switch (a) {
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = state().cc_major; break;
        case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = state().cc_minor; break;
        case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = 132; break;
        case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 227 * 1024; break;
        case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 << 20; break;
        case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *v = 6144; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult fake_cuDeviceTotalMem(size_t* n, CUdevice) {
    *n = state().memory;
    return CUDA_SUCCESS;
}

CUcontext context_of(CUdevice d) { return reinterpret_cast<CUcontext>(uintptr_t(0x1000 + d)); }

CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
    *c = context_of(d);
    log_line(fmt("{\"fn\":\"cuDevicePrimaryCtxRetain\",\"device\":%d}", d));
    return CUDA_SUCCESS;
}

CUresult fake_cuDevicePrimaryCtxRelease(CUdevice d) {
    log_line(fmt("{\"fn\":\"cuDevicePrimaryCtxRelease\",\"device\":%d}", d));
    return CUDA_SUCCESS;
}

CUresult fake_cuCtxSetCurrent(CUcontext c) {
    current_context = c;
    return CUDA_SUCCESS;
}

CUresult fake_cuCtxSynchronize() {
    if (capturing_any()) return refuse("cuCtxSynchronize", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (CUresult r = need_context("cuCtxSynchronize")) return r;
    return fault_at_sync("cuCtxSynchronize");
}

CUresult fake_cuMemGetInfo(size_t* free_bytes, size_t* total) {
    *free_bytes = state().memory - state().allocated;
    *total = state().memory;
    return CUDA_SUCCESS;
}

CUresult fake_cuMemAlloc(CUdeviceptr* p, size_t n) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (capturing_any()) return refuse("cuMemAlloc", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (n == 0) return CUDA_ERROR_INVALID_VALUE;
    if (s.allocated + n > s.memory) return refuse("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY, fmt("%zu bytes", n));
    void* mem = std::aligned_alloc(256, (n + 255) / 256 * 256);
    if (!mem) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memset(mem, 0xA5, n);  // uninitialized device memory is not zero
    *p = CUdeviceptr(uintptr_t(mem));
    s.allocations[uintptr_t(mem)] = n;
    s.allocated += n;
    log_line(fmt("{\"fn\":\"cuMemAlloc\",\"ptr\":%llu,\"bytes\":%zu}", *p, n));
    return CUDA_SUCCESS;
}

CUresult fake_cuMemFree(CUdeviceptr p) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.allocations.find(uintptr_t(p));
    if (it == s.allocations.end()) return refuse("cuMemFree", CUDA_ERROR_INVALID_VALUE, "not an allocation");
    s.allocated -= it->second;
    s.allocations.erase(it);
    std::free(reinterpret_cast<void*>(p));
    log_line(fmt("{\"fn\":\"cuMemFree\",\"ptr\":%llu}", p));
    return CUDA_SUCCESS;
}

CUresult fake_cuMemHostAlloc(void** p, size_t n, unsigned int flags) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    if (capturing_any()) return refuse("cuMemHostAlloc", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    *p = std::aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (!*p) return CUDA_ERROR_OUT_OF_MEMORY;
    s.host_allocations[uintptr_t(*p)] = n;
    s.pinned += n;
    if (s.pinned > s.peak_pinned) s.peak_pinned = s.pinned;
    log_line(fmt("{\"fn\":\"cuMemHostAlloc\",\"ptr\":%llu,\"bytes\":%zu,\"flags\":%u,\"pinned\":%zu}",
                 (unsigned long long)uintptr_t(*p), n, flags, s.pinned));
    return CUDA_SUCCESS;
}

CUresult fake_cuMemFreeHost(void* p) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.host_allocations.find(uintptr_t(p));
    if (it == s.host_allocations.end()) return refuse("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE, "not pinned");
    s.pinned -= it->second;
    s.host_allocations.erase(it);
    std::free(p);
    log_line(fmt("{\"fn\":\"cuMemFreeHost\",\"pinned\":%zu}", s.pinned));
    return CUDA_SUCCESS;
}

// [p, p + n) inside one pinned host allocation?
bool in_pinned_allocation(uintptr_t p, size_t n) {
    auto& a = state().host_allocations;
    auto it = a.upper_bound(p);
    if (it == a.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
}

CUresult fake_cuMemcpyHtoDAsync(CUdeviceptr dst, const void* src, size_t n, CUstream st) {
    if (state().capturing.count(st)) return refuse("cuMemcpyHtoDAsync", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (CUresult r = need_context("cuMemcpyHtoDAsync")) return r;
    if (CUresult r = sticky_error("cuMemcpyHtoDAsync")) return r;
    if (!in_device_allocation(uintptr_t(dst), n))
        return refuse("cuMemcpyHtoDAsync", CUDA_ERROR_INVALID_VALUE, "destination outside every allocation");
    std::memcpy(reinterpret_cast<void*>(dst), src, n);
    log_line(fmt("{\"fn\":\"cuMemcpyHtoDAsync\",\"dst\":%llu,\"bytes\":%zu,\"stream\":%d}", dst, n, stream_id(st)));
    return CUDA_SUCCESS;
}

CUresult fake_cuMemcpyDtoHAsync(void* dst, CUdeviceptr src, size_t n, CUstream st) {
    if (state().capturing.count(st)) return refuse("cuMemcpyDtoHAsync", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (CUresult r = need_context("cuMemcpyDtoHAsync")) return r;
    if (CUresult r = sticky_error("cuMemcpyDtoHAsync")) return r;
    if (!in_device_allocation(uintptr_t(src), n))
        return refuse("cuMemcpyDtoHAsync", CUDA_ERROR_INVALID_VALUE, "source outside every allocation");
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    log_line(fmt("{\"fn\":\"cuMemcpyDtoHAsync\",\"src\":%llu,\"dst\":%llu,\"bytes\":%zu,\"stream\":%d,\"pinned\":%d}", src,
                 (unsigned long long)uintptr_t(dst), n, stream_id(st), int(in_pinned_allocation(uintptr_t(dst), n))));
    return CUDA_SUCCESS;
}

CUresult fake_cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream st) {
    if (state().capturing.count(st)) return refuse("cuMemsetD8Async", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (CUresult r = need_context("cuMemsetD8Async")) return r;
    if (CUresult r = sticky_error("cuMemsetD8Async")) return r;
    if (!in_device_allocation(uintptr_t(dst), n))
        return refuse("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE, "destination outside every allocation");
    std::memset(reinterpret_cast<void*>(dst), v, n);
    log_line(fmt("{\"fn\":\"cuMemsetD8Async\",\"dst\":%llu,\"bytes\":%zu,\"value\":%d}", dst, n, int(v)));
    return CUDA_SUCCESS;
}

CUresult fake_cuStreamCreate(CUstream* st, unsigned int flags) {
    State& s = state();
    *st = reinterpret_cast<CUstream>(new int(s.next_stream));
    s.streams[*st] = s.next_stream++;
    log_line(fmt("{\"fn\":\"cuStreamCreate\",\"stream\":%d,\"flags\":%u}", s.streams[*st], flags));
    return CUDA_SUCCESS;
}

CUresult fake_cuStreamDestroy(CUstream st) {
    if (!state().streams.erase(st)) return CUDA_ERROR_INVALID_HANDLE;
    delete reinterpret_cast<int*>(st);
    return CUDA_SUCCESS;
}

CUresult fake_cuStreamSynchronize(CUstream st) {
    if (state().capturing.count(st)) return refuse("cuStreamSynchronize", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    if (CUresult r = need_context("cuStreamSynchronize")) return r;
    if (CUresult r = fault_at_sync("cuStreamSynchronize")) return r;
    log_line(fmt("{\"fn\":\"cuStreamSynchronize\",\"stream\":%d}", stream_id(st)));
    return CUDA_SUCCESS;
}

CUresult fake_cuModuleLoadData(CUmodule* m, const void* image) {
    State& s = state();
    if (capturing_any()) return refuse("cuModuleLoadData", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "during capture");
    std::vector<Function*> functions;
    int sm = 0;
    if (!parse_cubin(static_cast<const uint8_t*>(image), &functions, &sm))
        return refuse("cuModuleLoadData", CUDA_ERROR_INVALID_IMAGE, "not a cubin");
    if (sm != s.cc_major * 10 + s.cc_minor) {
        for (auto* f : functions) delete f;
        return refuse("cuModuleLoadData", CUDA_ERROR_NO_BINARY_FOR_GPU, fmt("cubin sm_%d", sm));
    }
    auto* mod = new Module();
    for (auto* f : functions) {
        f->module = s.modules.size();
        mod->functions[f->entry] = f;
    }
    s.modules.push_back(mod);
    *m = reinterpret_cast<CUmodule>(mod);
    log_line(fmt("{\"fn\":\"cuModuleLoadData\",\"module\":%zu,\"kernels\":%zu}", s.modules.size() - 1, functions.size()));
    return CUDA_SUCCESS;
}

CUresult fake_cuModuleUnload(CUmodule m) {
    auto* mod = reinterpret_cast<Module*>(m);
    for (auto& kv : mod->functions) delete kv.second;
    mod->functions.clear();
    log_line("{\"fn\":\"cuModuleUnload\"}");
    return CUDA_SUCCESS;
}

CUresult fake_cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
    auto* mod = reinterpret_cast<Module*>(m);
    auto it = mod->functions.find(name);
    if (it == mod->functions.end()) return refuse("cuModuleGetFunction", CUDA_ERROR_NOT_FOUND, name);
    *f = reinterpret_cast<CUfunction>(it->second);
    return CUDA_SUCCESS;
}

CUresult fake_cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction fn) {
    auto* f = reinterpret_cast<Function*>(fn);
    switch (a) {
        case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = f->reqntid ? int(f->reqntid) : 1024; break;
        case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *v = 0; break;
        case CU_FUNC_ATTRIBUTE_NUM_REGS: *v = f->registers; break;
        case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *v = f->max_dynamic_shared; break;
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

CUresult fake_cuFuncSetAttribute(CUfunction fn, CUfunction_attribute a, int v) {
    auto* f = reinterpret_cast<Function*>(fn);
    if (a != CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) return CUDA_ERROR_INVALID_VALUE;
    if (v > 227 * 1024) return refuse("cuFuncSetAttribute", CUDA_ERROR_INVALID_VALUE, "above the opt-in limit");
    f->max_dynamic_shared = v;
    log_line(fmt("{\"fn\":\"cuFuncSetAttribute\",\"entry\":\"%s\",\"attr\":%d,\"value\":%d}", f->entry.c_str(), int(a), v));
    return CUDA_SUCCESS;
}

CUresult fake_cuFuncGetParamInfo(CUfunction fn, size_t index, size_t* offset, size_t* size) {
    auto* f = reinterpret_cast<Function*>(fn);
    const State& s = state();
    if (index >= f->params.size()) return CUDA_ERROR_INVALID_VALUE;
    Param p = f->params[index];
    if (f->entry == s.override_entry && int(index) == s.override_index) p = s.override_param;
    *offset = p.offset;
    *size = p.size;
    return CUDA_SUCCESS;
}

CUresult fake_cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction fn, void** params, void** extra) {
    State& s = state();
    auto* f = reinterpret_cast<Function*>(fn);
    if (extra) return refuse("cuLaunchKernelEx", CUDA_ERROR_INVALID_VALUE, "extra is not supported");
    if (CUresult r = need_context("cuLaunchKernelEx")) return r;
    if (CUresult r = sticky_error("cuLaunchKernelEx")) return r;
    if (c->gridDimX == 0 || c->gridDimY == 0 || c->gridDimZ == 0)
        return refuse("cuLaunchKernelEx", CUDA_ERROR_INVALID_VALUE, "empty grid");
    if (f->reqntid && (c->blockDimX != f->reqntid || c->blockDimY != 1 || c->blockDimZ != 1))
        return refuse("cuLaunchKernelEx", CUDA_ERROR_INVALID_VALUE, fmt("block %u != reqntid %u", c->blockDimX, f->reqntid));
    if (int(c->sharedMemBytes) > f->max_dynamic_shared)
        return refuse("cuLaunchKernelEx", CUDA_ERROR_INVALID_VALUE, "shared memory above the function's limit");
    // Pack the parameters as the driver does: each one's bytes at its table offset.
    size_t total = 0;
    for (const Param& p : f->params) total = std::max<size_t>(total, p.offset + p.size);
    std::vector<uint8_t> packed(total, 0);
    for (size_t i = 0; i < f->params.size(); ++i) std::memcpy(packed.data() + f->params[i].offset, params[i], f->params[i].size);
    std::string attrs;
    for (unsigned i = 0; i < c->numAttrs; ++i) {
        const CUlaunchAttribute& a = c->attrs[i];
        attrs += fmt("%s[%d,%u,%u,%u]", i ? "," : "", int(a.id), a.value.clusterDim.x, a.value.clusterDim.y,
                     a.value.clusterDim.z);
    }
    auto cap = s.capturing.find(c->hStream);
    const int graph = cap == s.capturing.end() ? 0 : s.graph_ids[cap->second];
    if (cap == s.capturing.end())  // a captured launch runs when its graph is launched
        if (CUresult r = run_kernel("cuLaunchKernelEx")) return r;
    const std::string body =
        fmt("\"entry\":\"%s\",\"module\":%zu,\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shared\":%u,\"stream\":%d,\"attrs\":[%s],",
            f->entry.c_str(), f->module, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->blockDimY, c->blockDimZ,
            c->sharedMemBytes, stream_id(c->hStream), attrs.c_str()) +
        "\"params\":\"" + hex(packed.data(), packed.size()) + "\"";
    if (cap != s.capturing.end()) cap->second->nodes.push_back(Node{body});
    log_line("{\"fn\":\"cuLaunchKernelEx\"," + body + fmt(",\"capture\":%d}", graph));
    return CUDA_SUCCESS;
}

CUresult fake_cuStreamBeginCapture(CUstream st, CUstreamCaptureMode mode) {
    State& s = state();
    if (s.capturing.count(st)) return CUDA_ERROR_INVALID_VALUE;
    auto* g = new Graph();
    s.graph_ids[g] = s.next_graph++;
    s.capturing[st] = g;
    log_line(fmt("{\"fn\":\"cuStreamBeginCapture\",\"stream\":%d,\"mode\":%d,\"graph\":%d}", stream_id(st), int(mode),
                 s.graph_ids[g]));
    return CUDA_SUCCESS;
}

CUresult fake_cuStreamEndCapture(CUstream st, CUgraph* out) {
    State& s = state();
    auto it = s.capturing.find(st);
    if (it == s.capturing.end()) return CUDA_ERROR_INVALID_VALUE;
    *out = reinterpret_cast<CUgraph>(it->second);
    log_line(fmt("{\"fn\":\"cuStreamEndCapture\",\"graph\":%d,\"nodes\":%zu}", s.graph_ids[it->second],
                 it->second->nodes.size()));
    s.capturing.erase(it);
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
    State& s = state();
    if (s.allocated + s.graph_bytes > s.memory)
        return refuse("cuGraphInstantiateWithFlags", CUDA_ERROR_OUT_OF_MEMORY, fmt("%zu bytes", s.graph_bytes));
    auto* graph = reinterpret_cast<Graph*>(g);
    auto* copy = new Graph(*graph);  // an executable graph is a snapshot of the graph
    state().graph_ids[copy] = state().graph_ids[graph];
    *e = reinterpret_cast<CUgraphExec>(copy);
    state().execs[*e] = copy;
    s.allocated += s.graph_bytes;
    s.graph_memory[*e] = s.graph_bytes;
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphLaunch(CUgraphExec e, CUstream st) {
    State& s = state();
    auto it = s.execs.find(e);
    if (it == s.execs.end()) return CUDA_ERROR_INVALID_HANDLE;
    if (CUresult r = need_context("cuGraphLaunch")) return r;
    if (CUresult r = sticky_error("cuGraphLaunch")) return r;
    for (size_t i = 0; i < it->second->nodes.size(); ++i)
        if (CUresult r = run_kernel("cuGraphLaunch")) return r;
    const int id = s.graph_ids[it->second];
    log_line(fmt("{\"fn\":\"cuGraphLaunch\",\"graph\":%d,\"nodes\":%zu,\"stream\":%d}", id, it->second->nodes.size(),
                 stream_id(st)));
    for (const Node& n : it->second->nodes) log_line("{\"fn\":\"cuLaunchKernelEx\"," + n.json + fmt(",\"replay\":%d}", id));
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphExecDestroy(CUgraphExec e) {
    State& s = state();
    auto it = s.execs.find(e);
    if (it == s.execs.end()) return CUDA_ERROR_INVALID_HANDLE;
    delete it->second;
    s.execs.erase(it);
    s.allocated -= s.graph_memory[e];
    s.graph_memory.erase(e);
    return CUDA_SUCCESS;
}

CUresult fake_cuGraphDestroy(CUgraph g) {
    delete reinterpret_cast<Graph*>(g);
    return CUDA_SUCCESS;
}

struct Entry {
    const char* name;
    void* fn;
};

#define FAKE_ENTRY(field, symbol, official, signature) \
    {symbol, reinterpret_cast<void*>(static_cast<FnPtr<signature>>(&fake_##field))},
const Entry kEntries[] = {BESSEMER_CUDA_FUNCTIONS(FAKE_ENTRY)};
#undef FAKE_ENTRY

}  // namespace

extern "C" CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                       CUdriverProcAddressQueryResult* status) {
    log_line(fmt("{\"fn\":\"cuGetProcAddress_v2\",\"symbol\":\"%s\",\"version\":%d,\"flags\":%llu}", symbol, version,
                 (unsigned long long)flags));
    for (const Entry& e : kEntries) {
        if (std::strcmp(e.name, symbol) == 0) {
            *pfn = e.fn;
            if (status) *status = CU_GET_PROC_ADDRESS_SUCCESS;
            return CUDA_SUCCESS;
        }
    }
    *pfn = nullptr;
    if (status) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
}

// For tests: peak pinned host bytes so far.
extern "C" size_t fake_cuda_peak_pinned_bytes() { return state().peak_pinned; }
