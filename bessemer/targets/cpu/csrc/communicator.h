// Tensor-parallel communicators (the Collectives of kernels/kernel_api.h).
//
// ShmCommunicator: the ranks of one machine share a POSIX shared-memory segment:
//
//     [header 4096 B: magic, world, slot_bytes, abort flag + reason, rank 0 heartbeat]
//     [world control lines of 64 B: arrived (u64 generation counter)] padded to 4096
//     [2 x world data slots of slot_bytes]   (two sets, used by alternate generations)
//
// Every collective is one generation g: each rank writes its data into its slot of set
// g % 2, publishes arrived = g (release) and waits until every rank's arrived >= g
// (acquire); then it reads the others' slots. A slot of set g % 2 is rewritten only at
// g + 2, which no rank reaches before all have arrived at g + 1, i.e. finished reading g:
// one wait per collective. Waiting spins briefly, then yields, then sleeps, so an idle
// rank costs no CPU; a wait inside a step gives up after timeout_s with an error naming
// the late rank and raises the shared abort flag so every rank stops at once.
//
// PyCollectives: forwards to a Python object's all_reduce(x) / all_gather(x, y, full) (the
// MPI path, targets/cpu/parallel/group.py), taking the GIL for each call.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "kernel_api.h"

namespace bessemer {

namespace py = pybind11;

class ShmCommunicator : public Collectives {
   public:
    // rank 0 creates the segment (it must not exist), the others open it.
    ShmCommunicator(const std::string& name, int rank, int world, int64_t slot_bytes, double timeout_s,
                    bool create);
    ~ShmCommunicator() override;
    ShmCommunicator(const ShmCommunicator&) = delete;
    ShmCommunicator& operator=(const ShmCommunicator&) = delete;

    int rank() const override { return rank_; }
    int world() const override { return world_; }
    bool all_reduce(float* x, int rows, int width, int64_t ld) override;
    bool all_gather(const float* x, int64_t ldx, int rows, int width, float* y, int64_t ldy,
                    int full) override;
    bool failed() const override;
    std::string error() const override;

    // Step inputs from rank 0 to the others (int32 words). send: rank 0; recv: the others,
    // waiting without a timeout (an idle server) unless rank 0's heartbeat stops.
    bool bcast_send(const int32_t* data, int64_t n);
    bool bcast_recv(std::vector<int32_t>* out);
    bool barrier(double timeout_s);  // every rank arrived (start-up)
    void abort(const std::string& reason);
    void beat();  // rank 0's liveness, called periodically by its watchdog thread
    void unlink();  // remove the name (the mapping stays valid); rank 0 after start-up
    int64_t slot_bytes() const { return slot_bytes_; }
    double timeout_s() const { return timeout_s_; }

   private:
    struct Header;
    char* slot(uint64_t gen, int r) const;
    bool arrive_and_wait(uint64_t gen, bool idle);
    void fail(const std::string& reason);

    std::string name_;
    int rank_ = 0, world_ = 1;
    int64_t slot_bytes_ = 0;
    double timeout_s_ = 30.0;
    uint64_t gen_ = 0;
    size_t map_bytes_ = 0;
    void* map_ = nullptr;
    Header* hdr_ = nullptr;
    std::atomic<uint64_t>* arrived_ = nullptr;  // stride: 8 atomics (64 bytes) per rank
    char* data_ = nullptr;
    bool owner_ = false, unlinked_ = false;
    std::string local_error_;
};

class PyCollectives : public Collectives {
   public:
    PyCollectives(py::object impl, int rank, int world) : impl_(std::move(impl)), rank_(rank), world_(world) {}
    int rank() const override { return rank_; }
    int world() const override { return world_; }
    bool all_reduce(float* x, int rows, int width, int64_t ld) override;
    bool all_gather(const float* x, int64_t ldx, int rows, int width, float* y, int64_t ldy,
                    int full) override;
    bool failed() const override { return failed_; }
    std::string error() const override { return error_; }

   private:
    bool call(const char* method, py::args args);
    py::object impl_;
    int rank_, world_;
    bool failed_ = false;
    std::string error_;
};

}  // namespace bessemer
