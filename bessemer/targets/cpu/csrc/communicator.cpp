#include "communicator.h"

#include <fcntl.h>
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace bessemer {

namespace {
constexpr uint64_t kMagic = 0x4D4D4F4353534542ULL;  // "BESSCOMM"
constexpr size_t kPage = 4096;
constexpr int kCtlStride = 8;  // atomics per rank: one 64-byte line each
constexpr int kSpins = 2000;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void nap(double waited_s, bool idle) {
    // yield for the first millisecond (a peer a few microseconds late), then sleep: an idle
    // rank must not hold a core another process on this machine could use
    if (waited_s < 1e-3) {
        sched_yield();
        return;
    }
    timespec ts{0, long(idle && waited_s > 0.05 ? 500000 : 20000)};
    nanosleep(&ts, nullptr);
}
}  // namespace

struct ShmCommunicator::Header {
    uint64_t magic;
    int32_t world;
    int32_t pad0;
    int64_t slot_bytes;
    alignas(64) std::atomic<int32_t> abort_state;  // 0 ok, 1 reason being written, 2 aborted
    char reason[512];
    alignas(64) std::atomic<uint64_t> heartbeat;
};

ShmCommunicator::ShmCommunicator(const std::string& name, int rank, int world, int64_t slot_bytes,
                                 double timeout_s, bool create)
    : name_(name), rank_(rank), world_(world), slot_bytes_((slot_bytes + 63) / 64 * 64),
      timeout_s_(timeout_s), owner_(create) {
    static_assert(sizeof(Header) <= kPage, "header must fit its page");
    if (world < 1 || rank < 0 || rank >= world) throw std::invalid_argument("communicator: rank must be in [0, world)");
    if (slot_bytes < 64) throw std::invalid_argument("communicator: slot_bytes must be >= 64");
    if (timeout_s <= 0) throw std::invalid_argument("communicator: timeout must be > 0");
    const size_t ctl = (size_t(world) * 64 + kPage - 1) / kPage * kPage;
    map_bytes_ = kPage + ctl + size_t(2) * world * slot_bytes_;
    const int fd = create ? shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600)
                          : shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0)
        throw std::runtime_error("communicator: cannot " + std::string(create ? "create" : "open") +
                                 " shared memory " + name + ": " + std::strerror(errno));
    if (create && ftruncate(fd, off_t(map_bytes_)) != 0) {
        const int err = errno;
        close(fd);
        shm_unlink(name.c_str());
        throw std::runtime_error("communicator: cannot size shared memory " + name + " (" + std::strerror(err) +
                                 "); is /dev/shm full?");
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || size_t(st.st_size) < map_bytes_) {
        close(fd);
        throw std::runtime_error("communicator: shared memory " + name + " is smaller than this group needs");
    }
    map_ = mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map_ == MAP_FAILED) {
        map_ = nullptr;
        if (create) shm_unlink(name.c_str());
        throw std::runtime_error("communicator: cannot map shared memory " + name + ": " + std::strerror(errno));
    }
    hdr_ = static_cast<Header*>(map_);
    arrived_ = reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(map_) + kPage);
    data_ = static_cast<char*>(map_) + kPage + ctl;
    if (create) {
        hdr_->world = world;
        hdr_->slot_bytes = slot_bytes_;
        std::atomic_thread_fence(std::memory_order_release);
        hdr_->magic = kMagic;
    } else if (hdr_->magic != kMagic || hdr_->world != world || hdr_->slot_bytes != slot_bytes_) {
        munmap(map_, map_bytes_);
        map_ = nullptr;
        throw std::runtime_error("communicator: shared memory " + name + " belongs to another group");
    }
}

ShmCommunicator::~ShmCommunicator() {
    if (map_) munmap(map_, map_bytes_);
    if (owner_ && !unlinked_) shm_unlink(name_.c_str());
}

void ShmCommunicator::unlink() {
    if (owner_ && !unlinked_) shm_unlink(name_.c_str());
    unlinked_ = true;
}

char* ShmCommunicator::slot(uint64_t gen, int r) const {
    return data_ + (size_t(gen & 1) * world_ + r) * size_t(slot_bytes_);
}

bool ShmCommunicator::failed() const {
    return !local_error_.empty() || hdr_->abort_state.load(std::memory_order_acquire) != 0;
}

std::string ShmCommunicator::error() const {
    if (!local_error_.empty()) return local_error_;
    const auto t = Clock::now();
    while (hdr_->abort_state.load(std::memory_order_acquire) == 1 && since(t) < 0.01) sched_yield();
    if (hdr_->abort_state.load(std::memory_order_acquire) == 0) return "";
    return std::string(hdr_->reason, strnlen(hdr_->reason, sizeof(hdr_->reason)));
}

void ShmCommunicator::abort(const std::string& reason) {
    int32_t expect = 0;
    if (hdr_->abort_state.compare_exchange_strong(expect, 1)) {
        const size_t n = std::min(reason.size(), sizeof(hdr_->reason) - 1);
        std::memcpy(hdr_->reason, reason.data(), n);
        hdr_->reason[n] = 0;
        hdr_->abort_state.store(2, std::memory_order_release);
    }
}

void ShmCommunicator::fail(const std::string& reason) {
    abort(reason);
    local_error_ = error();
}

void ShmCommunicator::beat() { hdr_->heartbeat.fetch_add(1, std::memory_order_relaxed); }

bool ShmCommunicator::arrive_and_wait(uint64_t gen, bool idle) {
    if (failed()) return false;
    arrived_[rank_ * kCtlStride].store(gen, std::memory_order_release);
    const auto start = Clock::now();
    uint64_t beat = hdr_->heartbeat.load(std::memory_order_relaxed);
    auto beat_seen = start;
    for (int r = 0; r < world_; ++r) {
        int spins = 0;
        while (arrived_[r * kCtlStride].load(std::memory_order_acquire) < gen) {
            if (++spins < kSpins) {
                _mm_pause();
                continue;
            }
            if (hdr_->abort_state.load(std::memory_order_acquire) != 0) {
                local_error_ = error();
                return false;
            }
            const double waited = since(start);
            if (!idle && waited > timeout_s_) {
                fail("tensor-parallel rank " + std::to_string(r) + " did not reach the collective within " +
                     std::to_string(int(timeout_s_)) + " s (it died or hangs); rank " + std::to_string(rank_) +
                     " gave up");
                return false;
            }
            if (idle && rank_ != 0) {  // waiting for rank 0's next step: is it still alive?
                const uint64_t b = hdr_->heartbeat.load(std::memory_order_relaxed);
                if (b != beat) {
                    beat = b;
                    beat_seen = Clock::now();
                } else if (since(beat_seen) > timeout_s_) {
                    fail("tensor-parallel rank 0 stopped responding (no heartbeat for " +
                         std::to_string(int(timeout_s_)) + " s)");
                    return false;
                }
            }
            nap(waited, idle);
        }
    }
    gen_ = gen;
    return true;
}

bool ShmCommunicator::barrier(double timeout_s) {
    const double saved = timeout_s_;
    timeout_s_ = timeout_s;
    const bool ok = arrive_and_wait(gen_ + 1, false);
    timeout_s_ = saved;
    return ok;
}

bool ShmCommunicator::all_reduce(float* x, int rows, int width, int64_t ld) {
    if (world_ == 1 || rows == 0) return !failed();
    const int chunk = std::max<int>(1, int(slot_bytes_ / (int64_t(width) * 4)));
    if (int64_t(width) * 4 > slot_bytes_) {
        fail("all_reduce: a row of " + std::to_string(width) + " floats exceeds the communicator slot");
        return false;
    }
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int n = std::min(chunk, rows - r0);
        const uint64_t gen = gen_ + 1;
        float* mine = reinterpret_cast<float*>(slot(gen, rank_));
        for (int r = 0; r < n; ++r) std::memcpy(mine + int64_t(r) * width, x + (r0 + r) * ld, sizeof(float) * width);
        if (!arrive_and_wait(gen, false)) return false;
        // every rank sums the slots in rank order: bit-identical results on all ranks
        const float* s0 = reinterpret_cast<const float*>(slot(gen, 0));
        for (int r = 0; r < n; ++r) {
            float* out = x + (r0 + r) * ld;
            const float* a = s0 + int64_t(r) * width;
            for (int c = 0; c < width; ++c) out[c] = a[c];
            for (int k = 1; k < world_; ++k) {
                const float* b = reinterpret_cast<const float*>(slot(gen, k)) + int64_t(r) * width;
                for (int c = 0; c < width; ++c) out[c] += b[c];
            }
        }
    }
    return true;
}

bool ShmCommunicator::all_gather(const float* x, int64_t ldx, int rows, int width, float* y, int64_t ldy,
                                 int full) {
    int start, stop;
    shard_range(full, world_, rank_, &start, &stop);
    if (stop - start != width) {
        fail("all_gather: shard width " + std::to_string(width) + " does not match rank " + std::to_string(rank_));
        return false;
    }
    const int64_t widest = (full + world_ - 1) / world_;
    if (widest * 4 > slot_bytes_) {
        fail("all_gather: a shard row exceeds the communicator slot");
        return false;
    }
    const int chunk = std::max<int>(1, int(slot_bytes_ / (widest * 4)));
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        const int n = std::min(chunk, rows - r0);
        const uint64_t gen = gen_ + 1;
        float* mine = reinterpret_cast<float*>(slot(gen, rank_));
        for (int r = 0; r < n; ++r) std::memcpy(mine + int64_t(r) * width, x + (r0 + r) * ldx, sizeof(float) * width);
        if (!arrive_and_wait(gen, false)) return false;
        for (int k = 0; k < world_; ++k) {
            int s, e;
            shard_range(full, world_, k, &s, &e);
            const float* src = reinterpret_cast<const float*>(slot(gen, k));
            for (int r = 0; r < n; ++r)
                std::memcpy(y + (r0 + r) * ldy + s, src + int64_t(r) * (e - s), sizeof(float) * (e - s));
        }
    }
    return true;
}

bool ShmCommunicator::bcast_send(const int32_t* data, int64_t n) {
    if (rank_ != 0) throw std::invalid_argument("bcast_send: only rank 0 sends");
    if (n * 4 + 8 > slot_bytes_)
        throw std::invalid_argument("bcast_send: " + std::to_string(n) + " words exceed the communicator slot");
    const uint64_t gen = gen_ + 1;
    char* mine = slot(gen, 0);
    std::memcpy(mine, &n, 8);
    std::memcpy(mine + 8, data, size_t(n) * 4);
    return arrive_and_wait(gen, false);
}

bool ShmCommunicator::bcast_recv(std::vector<int32_t>* out) {
    if (rank_ == 0) throw std::invalid_argument("bcast_recv: rank 0 sends, it does not receive");
    const uint64_t gen = gen_ + 1;
    if (!arrive_and_wait(gen, true)) return false;
    const char* src = slot(gen, 0);
    int64_t n;
    std::memcpy(&n, src, 8);
    if (n < 0 || n * 4 + 8 > slot_bytes_) {
        fail("bcast_recv: corrupt message length");
        return false;
    }
    out->resize(size_t(n));
    std::memcpy(out->data(), src + 8, size_t(n) * 4);
    return true;
}

// ---------------------------------------------------------------- PyCollectives

bool PyCollectives::call(const char* method, py::args args) {
    if (failed_) return false;
    py::gil_scoped_acquire gil;
    try {
        impl_.attr(method)(*args);
        return true;
    } catch (py::error_already_set& e) {
        failed_ = true;
        error_ = std::string(method) + " failed: " + e.what();
        return false;
    }
}

bool PyCollectives::all_reduce(float* x, int rows, int width, int64_t ld) {
    py::gil_scoped_acquire gil;
    // a view of the executor's buffer (no copy); the capsule owns nothing
    py::array_t<float> a({int64_t(rows), int64_t(width)}, {ld * 4, int64_t(4)}, x, py::capsule(x, [](void*) {}));
    return call("all_reduce", py::make_tuple(a));
}

bool PyCollectives::all_gather(const float* x, int64_t ldx, int rows, int width, float* y, int64_t ldy,
                               int full) {
    py::gil_scoped_acquire gil;
    float* xm = const_cast<float*>(x);
    py::array_t<float> a({int64_t(rows), int64_t(width)}, {ldx * 4, int64_t(4)}, xm, py::capsule(xm, [](void*) {}));
    py::array_t<float> b({int64_t(rows), int64_t(full)}, {ldy * 4, int64_t(4)}, y, py::capsule(y, [](void*) {}));
    return call("all_gather", py::make_tuple(a, b));
}

}  // namespace bessemer
