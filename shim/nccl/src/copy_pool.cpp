#include "copy_pool.hpp"

#include <algorithm>
#include <cstring>

namespace tensorlane::nccl {

CopyPool::CopyPool(unsigned threads, size_t min_bytes, size_t part_bytes)
    : min_bytes_(std::max<size_t>(min_bytes, 1)), part_bytes_(std::max<size_t>(part_bytes, 4096)) {
    workers_.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) {
        workers_.emplace_back([this] { run(); });
    }
}

CopyPool::~CopyPool() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    for (std::thread &t : workers_) {
        t.join();
    }
}

void CopyPool::copy(void *to, const void *from, size_t bytes) {
    if (bytes == 0) {
        return;  // (either pointer may be null then: memcpy may not be given one)
    }
    if (workers_.empty() || bytes < min_bytes_) {
        std::memcpy(to, from, bytes);
        return;
    }
    std::lock_guard call(call_mu_);
    // About two parts a thread, none smaller than part_bytes_, on page boundaries.
    const size_t ways = 2 * (workers_.size() + 1);
    const size_t part = std::max(part_bytes_, ((bytes + ways - 1) / ways + 4095) & ~size_t{4095});
    for (;;) {
        std::unique_lock lock(mu_);
        // A helper still inside the last job's work() reads its fields: not while they change.
        // (Helpers enter only under mu_, so none can start while we hold it.)
        if (active_.load(std::memory_order_acquire) != 0) {
            lock.unlock();
            std::this_thread::yield();
            continue;
        }
        to_ = static_cast<unsigned char *>(to);
        from_ = static_cast<const unsigned char *>(from);
        bytes_ = bytes;
        part_ = part;
        parts_ = (bytes + part - 1) / part;
        next_.store(0, std::memory_order_relaxed);
        finished_.store(0, std::memory_order_relaxed);
        ++generation_;
        break;
    }
    cv_.notify_all();
    work();
    // SYNC POINT: acquire pairs with each helper's release after its memcpy: every byte of the
    // parts counted is visible to this thread (and so to whatever it hands the buffer to).
    while (finished_.load(std::memory_order_acquire) != parts_) {
        std::this_thread::yield();
    }
}

size_t CopyPool::work() {
    size_t n = 0;
    for (;;) {
        const size_t i = next_.fetch_add(1, std::memory_order_relaxed);
        if (i >= parts_) {
            return n;
        }
        const size_t off = i * part_;
        std::memcpy(to_ + off, from_ + off, std::min(part_, bytes_ - off));
        finished_.fetch_add(1, std::memory_order_release);
        ++n;
    }
}

void CopyPool::run() {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock lock(mu_);
            cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) {
                return;
            }
            seen = generation_;
            active_.fetch_add(1, std::memory_order_relaxed);
        }
        const size_t n = work();
        helper_parts_.fetch_add(n, std::memory_order_relaxed);
        active_.fetch_sub(1, std::memory_order_release);
    }
}

}  // namespace tensorlane::nccl
