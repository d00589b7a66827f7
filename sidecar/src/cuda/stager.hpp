// The tcp transport's copy thread for GPU regions: copies between page-locked staging slots and
// device memory (the sidecar's IPC import of it), device-to-host for chunks a GPU region sends
// and host-to-device for chunks that land for one, each on a stream of its own direction so the
// two overlap. The engine thread submits jobs and takes results (a queue and an eventfd); this
// thread does every CUDA call, so an import (milliseconds) or a busy copy engine never holds
// the engine.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/import.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class CudaStager {
public:
    struct Job {
        uint64_t id = 0;
        std::shared_ptr<CudaImport> import;  ///< kept alive until the copy has finished
        uint64_t device_offset = 0;          ///< from the allocation's first byte
        unsigned char *host = nullptr;       ///< in a staging slot
        uint32_t bytes = 0;
        bool to_device = false;
    };
    struct Result {
        uint64_t id = 0;
        Status status;
    };

    /// `slot_bytes` x `slots` of staging memory, page-locked by the thread before its first
    /// copy.
    CudaStager(uint32_t slot_bytes, uint32_t slots);
    ~CudaStager();
    CudaStager(const CudaStager &) = delete;
    CudaStager &operator=(const CudaStager &) = delete;

    /// Maps the slots, makes the eventfd and starts the thread.
    Status start();
    /// Readable when results wait (the owner polls it).
    int wakeFd() const { return wake_.get(); }
    unsigned char *slot(uint32_t i) const { return base_ + uint64_t{i} * slot_bytes_; }
    uint32_t slots() const { return slots_; }
    uint32_t slotBytes() const { return slot_bytes_; }

    /// Queues copies (engine thread), one wake-up for all of them. Jobs of one id next to each
    /// other are one copy in pieces: one result, once the last has run.
    void submit(std::vector<Job> jobs);
    /// Appends the finished copies (engine thread); drains the eventfd.
    void take(std::vector<Result> *out);
    /// Results waiting.
    bool ready() const { return ready_.load(std::memory_order_acquire); }

private:
    void run();

    const uint32_t slot_bytes_;
    const uint32_t slots_;
    unsigned char *base_ = nullptr;
    size_t map_bytes_ = 0;
    ipc::UniqueFd wake_;

    std::mutex mu_;
    std::condition_variable cv_;
    bool stop_ = false;
    std::vector<Job> incoming_;
    std::vector<Result> results_;
    std::atomic<bool> ready_{false};
    std::atomic<bool> idle_{false};  ///< the thread waits on cv_ (submit() notifies only then)
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
