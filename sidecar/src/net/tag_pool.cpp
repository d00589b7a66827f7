#include "net/tag_pool.hpp"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "net/packed_chunk.hpp"

namespace tensorlane::sidecar {

unsigned TagPool::autoThreads(unsigned cpus) {
    return cpus < 4 ? 0 : std::min(4u, cpus / 4);
}

TagPool::TagPool(unsigned threads, unsigned spin_us) : spin_us_(spin_us) {
    threads = std::min(threads, kMaxThreads);
    if (threads == 0) {
        return;
    }
    const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        return;  // no eventfd, no workers: every tag stays on the engine thread
    }
    wake_.reset(fd);
    for (unsigned i = 0; i < threads; ++i) {
        workers_.emplace_back([this] { run(); });
        pthread_setname_np(workers_.back().native_handle(), "tl-tags");
    }
}

TagPool::~TagPool() {
    std::deque<std::shared_ptr<TagJob>> left;
    {
        std::lock_guard lock(mutex_);
        stop_ = true;
        stopping_.store(true, std::memory_order_relaxed);
        left.swap(queue_);
        queued_.store(0, std::memory_order_relaxed);
    }
    work_cv_.notify_all();
    for (std::thread &t : workers_) {
        t.join();
    }
    for (auto &job : left) {
        cancel(*job);
    }
}

void TagPool::cancel(TagJob &job) {
    job.good = false;
    job.cancelled = true;
    job.done.store(true, std::memory_order_release);
}

std::shared_ptr<TagJob> TagPool::takeQueued(const TagJob &job) {
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [&](const std::shared_ptr<TagJob> &j) { return j.get() == &job; });
    if (it == queue_.end()) {
        return nullptr;
    }
    std::shared_ptr<TagJob> mine = std::move(*it);
    queue_.erase(it);
    queued_.store(queue_.size(), std::memory_order_relaxed);
    return mine;
}

void TagPool::submit(std::shared_ptr<TagJob> job) {
    bool wake = false;
    {
        std::lock_guard lock(mutex_);
        queue_.push_back(std::move(job));
        queued_.store(queue_.size(), std::memory_order_release);
        // A worker still spinning takes it without a wake-up (no system call here).
        wake = sleeping_ > 0;
    }
    if (wake) {
        work_cv_.notify_one();
    }
}

void TagPool::cancelOrWait(TagJob &job) {
    std::unique_lock lock(mutex_);
    if (takeQueued(job)) {
        cancel(job);
        return;
    }
    done_cv_.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
}

void TagPool::finishNow(TagJob &job) {
    {
        std::unique_lock lock(mutex_);
        if (!takeQueued(job)) {
            done_cv_.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
            return;
        }
    }
    // Ours now (the caller holds it): computed here, outside the lock.
    FrameMac mac;
    compute(mac, job);
    job.done.store(true, std::memory_order_release);
    // Its owner hears of it as of any other: a result nobody is woken for would wait forever.
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
}

void TagPool::compute(FrameMac &mac, TagJob &job) {
    gatherInto(job.gather_to, job.gather);
    mac.init(job.otk, job.head_len + job.len);
    mac.update(job.head.data(), job.head_len);
    mac.update(job.data, job.len);
    if (job.verify) {
        job.good = mac.verify(job.tag.data());
        if (job.good && job.copy_to != nullptr) {
            if (job.pieces != 0) {
                job.landed =
                    landPacked(job.copy_to, job.region_bytes, job.data, job.len, job.pieces);
            } else {
                std::memcpy(job.copy_to, job.data, job.len);
            }
        }
    } else {
        mac.final(job.tag.data());
    }
    sodium_memzero(job.otk.data(), job.otk.size());
}

void TagPool::clearWake() {
    uint64_t v;
    [[maybe_unused]] ssize_t n = ::read(wake_.get(), &v, sizeof v);
}

void TagPool::run() {
    FrameMac mac;
    for (;;) {
        std::shared_ptr<TagJob> job;
        if (spin_us_ > 0) {
            // Jobs come in streams (a chunk every few tens of microseconds per direction): look
            // for the next one a while before sleeping, so neither side pays for a wake-up.
            const auto until =
                std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
            while (queued_.load(std::memory_order_acquire) == 0 &&
                   !stopping_.load(std::memory_order_relaxed) &&
                   std::chrono::steady_clock::now() < until) {
#if defined(__x86_64__)
                __builtin_ia32_pause();
#endif
            }
        }
        {
            std::unique_lock lock(mutex_);
            // Counted while waiting, under the lock submit() takes: a job queued after the
            // predicate's last look finds sleeping_ > 0 and wakes one.
            ++sleeping_;
            work_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
            --sleeping_;
            if (queue_.empty()) {
                return;  // stopping
            }
            job = std::move(queue_.front());
            queue_.pop_front();
            queued_.store(queue_.size(), std::memory_order_relaxed);
        }
        compute(mac, *job);
        {
            // Under the lock, so cancelOrWait() cannot miss the notification.
            std::lock_guard lock(mutex_);
            job->done.store(true, std::memory_order_release);
        }
        done_cv_.notify_all();
        jobs_done_.fetch_add(1, std::memory_order_relaxed);
        const uint64_t one = 1;
        [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
    }
}

}  // namespace tensorlane::sidecar
