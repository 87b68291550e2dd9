// Owning handles for device memory, pinned host memory and streams, and the one-time
// upload of a host region (the engine's mmapped weights) through bounded pinned staging.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "driver.h"

namespace bessemer {
namespace cuda {

class DeviceAllocation {
   public:
    DeviceAllocation() = default;
    DeviceAllocation(std::shared_ptr<Device> device, size_t bytes, const std::string& what);
    ~DeviceAllocation();
    DeviceAllocation(DeviceAllocation&& o) noexcept;
    DeviceAllocation& operator=(DeviceAllocation&& o) noexcept;
    DeviceAllocation(const DeviceAllocation&) = delete;
    DeviceAllocation& operator=(const DeviceAllocation&) = delete;

    cu::CUdeviceptr ptr() const { return ptr_; }
    size_t bytes() const { return bytes_; }

   private:
    void release();
    std::shared_ptr<Device> device_;
    cu::CUdeviceptr ptr_ = 0;
    size_t bytes_ = 0;
};

class PinnedBuffer {
   public:
    PinnedBuffer() = default;
    PinnedBuffer(std::shared_ptr<Device> device, size_t bytes);
    ~PinnedBuffer();
    PinnedBuffer(const PinnedBuffer&) = delete;
    PinnedBuffer& operator=(const PinnedBuffer&) = delete;

    uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }
    size_t bytes() const { return bytes_; }

   private:
    std::shared_ptr<Device> device_;
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

class Stream {
   public:
    explicit Stream(std::shared_ptr<Device> device);
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    cu::CUstream get() const { return stream_; }
    void synchronize(const char* what) const;

   private:
    std::shared_ptr<Device> device_;
    cu::CUstream stream_ = nullptr;
};

// Called with (bytes done, bytes total) after each staged chunk.
using Progress = std::function<void(size_t, size_t)>;

// Copies host [src, src + bytes) to device dst through two pinned buffers of chunk_bytes
// each: while one chunk's copy runs, the next is read from src into the other. Host memory
// used: 2 x chunk_bytes pinned; when `drop_source_pages`, the source range (a read-only
// file mapping) is also released from this process's resident set after each chunk, so
// that uploading a large engine never holds the whole file in memory.
void upload(const std::shared_ptr<Device>& device, const Stream& stream, cu::CUdeviceptr dst, const uint8_t* src,
            size_t bytes, size_t chunk_bytes, bool drop_source_pages, const Progress& progress);

}  // namespace cuda
}  // namespace bessemer
