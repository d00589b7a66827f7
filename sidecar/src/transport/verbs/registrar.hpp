// Memory registration off the engine thread. ibv_reg_mr pins and maps every page of a region:
// milliseconds for gigabytes, which the engine loop (serving every client) must not wait for.
// The transport asks here; a thread registers; the result comes back through a queue and an
// eventfd the engine polls (DESIGN.md, "each transport registers it ... off the engine thread
// where that is slow").
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

class Registrar {
public:
    struct Job {
        uint64_t id = 0;  ///< the caller's, echoed in the result
        std::shared_ptr<ibv_pd> pd;
        void *addr = nullptr;
        size_t length = 0;
        uint64_t iova = 0;
        unsigned access = 0;
        int dmabuf_fd = -1;  ///< >= 0: ibv_reg_dmabuf_mr(offset, length, iova, fd)
        uint64_t dmabuf_offset = 0;
        /// CUDA memory: the sidecar's own mapping of the allocation for ibv_reg_mr
        /// (nvidia-peermem), made on this thread (an IPC import may take milliseconds). Used
        /// when there is no dma-buf fd, or when this host cannot register dma-bufs (the first
        /// refusal is remembered: the probe happens once). Returns 0 or an errno.
        std::function<int(void **addr)> peermem_addr;
        std::shared_ptr<void> keepalive;  ///< the memory (or the fd) stays until done
    };
    struct Result {
        uint64_t id = 0;
        std::shared_ptr<ibv_pd> pd;
        ibv_mr *mr = nullptr;  ///< the caller owns it (ibv_dereg_mr)
        int error = 0;
        bool dmabuf = false;
    };

    Status start();
    ~Registrar();

    void submit(Job job);
    std::vector<Result> take();
    int fd() const { return done_fd_.get(); }
    bool pending() const { return ready_.load(std::memory_order_acquire); }
    /// What the dma-buf probe found: -1 not tried yet, 0 this host refuses dma-buf MRs (the
    /// peermem path is used), 1 it registers them.
    int dmabufSupported() const { return dmabuf_ok_.load(std::memory_order_relaxed); }
    /// Whether a CUDA allocation has been registered through the peermem path (no fd from its
    /// owner, or a host that refuses dma-buf MRs).
    bool peermemUsed() const { return peermem_used_.load(std::memory_order_relaxed); }

private:
    void run();

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Job> jobs_;
    std::vector<Result> results_;
    bool stop_ = false;
    std::atomic<bool> ready_{false};
    std::atomic<int> dmabuf_ok_{-1};
    std::atomic<bool> peermem_used_{false};
    ipc::UniqueFd done_fd_;
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
