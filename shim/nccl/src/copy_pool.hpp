// The plugin's memcpy, spread over helper threads (docs/nccl.md, "Copies off the proxy
// thread"): NCCL's host buffers are private to its process, so each host send is copied into
// a shadow the sidecar can read and each host receive out of one. Those copies run on NCCL's
// proxy thread, which also drives every other request of the process; a 512 KiB step (NCCL's
// Simple protocol) costs it tens of microseconds per direction. A copy of at least
// `min_bytes` is cut into parts that the calling thread and `threads` helpers take in turn,
// so it ends in a fraction of that time; smaller ones are one memcpy on the calling thread.
//
// copy() returns once every byte is copied (the caller may use the destination at once). One
// copy runs at a time (callers are serialised by an internal lock; the plugin's own lock
// already serialises them). Helpers that find no part left go back to waiting: the caller
// never waits for a helper that has not started.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tensorlane::nccl {

class CopyPool {
public:
    /// `threads` helpers (0: every copy on the calling thread); copies of at least `min_bytes`
    /// are split into parts of at least `part_bytes`.
    CopyPool(unsigned threads, size_t min_bytes, size_t part_bytes);
    ~CopyPool();
    CopyPool(const CopyPool &) = delete;
    CopyPool &operator=(const CopyPool &) = delete;

    void copy(void *to, const void *from, size_t bytes);
    unsigned threads() const { return static_cast<unsigned>(workers_.size()); }
    /// Parts copied by helpers so far (tests: the helpers do take part).
    uint64_t helperParts() const { return helper_parts_.load(std::memory_order_relaxed); }

private:
    void run();
    /// Takes parts of the current job until none is left; returns how many it copied.
    size_t work();

    const size_t min_bytes_;
    const size_t part_bytes_;
    std::mutex call_mu_;  ///< one copy at a time
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t generation_ = 0;  ///< a new job (under mu_)
    bool stop_ = false;
    // The current job: set under mu_ before the generation moves, read by helpers after.
    unsigned char *to_ = nullptr;
    const unsigned char *from_ = nullptr;
    size_t bytes_ = 0;
    size_t parts_ = 0;
    size_t part_ = 0;
    std::atomic<size_t> next_{0};      ///< the next part to take
    std::atomic<size_t> finished_{0};  ///< parts copied
    std::atomic<uint64_t> helper_parts_{0};
    std::atomic<unsigned> active_{0};  ///< helpers inside work(): a job ends only without them
    std::vector<std::thread> workers_;
};

}  // namespace tensorlane::nccl
