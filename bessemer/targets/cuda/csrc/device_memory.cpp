#include "device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace bessemer {
namespace cuda {

namespace {
std::string gib(size_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f GiB", double(bytes) / double(1ull << 30));
    return buf;
}
}  // namespace

DeviceAllocation::DeviceAllocation(std::shared_ptr<Device> device, size_t bytes, const std::string& what)
    : device_(std::move(device)), bytes_(bytes) {
    if (bytes == 0) return;
    device_->make_current();
    const cu::CUresult r = device_->api().cuMemAlloc(&ptr_, bytes);
    if (r == cu::CUDA_ERROR_OUT_OF_MEMORY) {
        size_t free_bytes = 0, total = 0;
        device_->api().cuMemGetInfo(&free_bytes, &total);
        throw CudaError(r, "out of GPU memory allocating " + what + " (" + gib(bytes) + "; " + gib(free_bytes) +
                               " free of " + gib(total) + "); lower --kv-cache-gib / --gpu-memory-utilization "
                               "or rebuild with a smaller --max-num-tokens");
    }
    device_->check(r, "cuMemAlloc(" + what + ", " + std::to_string(bytes) + " bytes)");
}

DeviceAllocation::~DeviceAllocation() { release(); }

void DeviceAllocation::release() {
    if (ptr_) {
        device_->make_current();
        device_->api().cuMemFree(ptr_);
    }
    ptr_ = 0;
    bytes_ = 0;
}

DeviceAllocation::DeviceAllocation(DeviceAllocation&& o) noexcept
    : device_(std::move(o.device_)), ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = 0;
    o.bytes_ = 0;
}

DeviceAllocation& DeviceAllocation::operator=(DeviceAllocation&& o) noexcept {
    if (this != &o) {
        release();
        device_ = std::move(o.device_);
        ptr_ = o.ptr_;
        bytes_ = o.bytes_;
        o.ptr_ = 0;
        o.bytes_ = 0;
    }
    return *this;
}

PinnedBuffer::PinnedBuffer(std::shared_ptr<Device> device, size_t bytes) : device_(std::move(device)), bytes_(bytes) {
    device_->make_current();
    device_->check(device_->api().cuMemHostAlloc(&ptr_, std::max<size_t>(bytes, 1), cu::kMemHostAllocPortable),
                   "cuMemHostAlloc(" + std::to_string(bytes) + " bytes)");
}

PinnedBuffer::~PinnedBuffer() {
    if (ptr_) {
        device_->make_current();
        device_->api().cuMemFreeHost(ptr_);
    }
}

Stream::Stream(std::shared_ptr<Device> device) : device_(std::move(device)) {
    device_->make_current();
    device_->check(device_->api().cuStreamCreate(&stream_, cu::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

Stream::~Stream() {
    if (stream_) {
        device_->make_current();
        device_->api().cuStreamDestroy(stream_);
    }
}

void Stream::synchronize(const char* what) const {
    device_->check(device_->api().cuStreamSynchronize(stream_), std::string("cuStreamSynchronize (") + what + ")");
}

void upload(const std::shared_ptr<Device>& device, const Stream& stream, cu::CUdeviceptr dst, const uint8_t* src,
            size_t bytes, size_t chunk_bytes, bool drop_source_pages, const Progress& progress) {
    if (bytes == 0) return;
    chunk_bytes = std::min(chunk_bytes, bytes);
    PinnedBuffer staging[2] = {PinnedBuffer(device, chunk_bytes), PinnedBuffer(device, chunk_bytes)};
    const auto& api = device->api();
    const size_t page = size_t(sysconf(_SC_PAGESIZE));
    size_t done = 0;
    for (size_t offset = 0, i = 0; offset < bytes; offset += chunk_bytes, ++i) {
        const size_t n = std::min(chunk_bytes, bytes - offset);
        PinnedBuffer& buf = staging[i % 2];
        // buf's previous copy (chunk i - 2) finished at the synchronize after chunk i - 1
        std::memcpy(buf.data(), src + offset, n);
        if (drop_source_pages) {
            // whole pages inside [src + offset, src + offset + n): never a page shared with
            // bytes not yet copied
            const uintptr_t lo = (uintptr_t(src + offset) + page - 1) / page * page;
            const uintptr_t hi = uintptr_t(src + offset + n) / page * page;
            if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
        }
        if (i > 0) stream.synchronize("weight upload");  // chunk i - 1 done: its buffer is free next
        device->check(api.cuMemcpyHtoDAsync(dst + offset, buf.data(), n, stream.get()), "cuMemcpyHtoDAsync (weights)");
        done += n;
        if (progress) progress(done, bytes);
    }
    stream.synchronize("weight upload");
}

}  // namespace cuda
}  // namespace bessemer
