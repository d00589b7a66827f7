#include "net/tag_pool.hpp"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "net/packed_chunk.hpp"

namespace tensorlane::sidecar {

unsigned TagPool::autoThreads(unsigned cpus) {
    return cpus < 4 ? 0 : std::min(4u, cpus / 4);
}

TagPool::TagPool(unsigned threads, unsigned spin_us, bool socket_io)
    : spin_us_(spin_us), socket_io_(socket_io) {
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

std::deque<std::shared_ptr<TagJob>>::iterator TagPool::findQueued(const TagJob &job) {
    return std::find_if(queue_.begin(), queue_.end(),
                        [&](const std::shared_ptr<TagJob> &j) { return j.get() == &job; });
}

std::shared_ptr<TagJob> TagPool::takeQueued(const TagJob &job) {
    auto it = findQueued(job);
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
    {
        std::unique_lock lock(mutex_);
        if (!takeQueued(job)) {
            done_cv_.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
            return;
        }
        cancel(job);
    }
    // Its owner may be waiting for it to end (a reading job whose socket is not polled meanwhile).
    signalDone();
}

bool TagPool::waitIfRunning(TagJob &job) {
    std::unique_lock lock(mutex_);
    if (findQueued(job) != queue_.end()) {
        return false;
    }
    done_cv_.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
    return true;
}

bool TagPool::reserveSocket() {
    const auto limit = static_cast<unsigned>(workers_.size());
    unsigned n = sockets_.load(std::memory_order_relaxed);
    do {
        if (!socketIo() || n >= limit) {
            return false;
        }
    } while (!sockets_.compare_exchange_weak(n, n + 1, std::memory_order_relaxed));
    return true;
}

void TagPool::releaseSocket() {
    sockets_.fetch_sub(1, std::memory_order_relaxed);
}

void TagPool::signalDone() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof one);
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
    signalDone();
}

namespace {

/// Waits until `fd` has `events` or `until` passes, at most TagPool::kSocketWaitUs at a time:
/// 1 when ready, 0 when not, -errno on failure.
int waitFor(int fd, short events, std::chrono::steady_clock::time_point until) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) {
        return 0;
    }
    const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(until - now);
    const long wait_ns = std::min<long>(left.count(), long{TagPool::kSocketWaitUs} * 1000);
    const timespec ts{0, wait_ns};
    pollfd p{fd, events, 0};
    const int ready = ::ppoll(&p, 1, &ts, nullptr);
    if (ready < 0) {
        return errno == EINTR ? 1 : -errno;
    }
    return ready;
}

/// After a read or write of `fd` that moved nothing (errno set): whether to try again, having
/// waited (briefly) for `events` where the socket would block. False: stop, with `*error` set
/// where it failed (0: it stayed blocked).
bool tryAgain(int fd, short events, std::chrono::steady_clock::time_point until, int *error) {
    if (errno == EINTR) {
        return true;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        *error = errno;
        return false;
    }
    const int ready = waitFor(fd, events, until);
    if (ready < 0) {
        *error = -ready;
        return false;
    }
    return ready > 0;
}

}  // namespace

void TagPool::readRest(TagJob &job) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSocketRunUs);
    job.read_bytes = 0;
    job.read_error = 0;
    while (!job.readComplete()) {
        // The data's rest, then the tag's, and never a byte of the next frame.
        iovec iov[2];
        int n = 0;
        if (job.have < job.len) {
            iov[n++] = {job.read_to + job.have, job.len - job.have};
        }
        iov[n++] = {job.tag.data() + job.tag_have, kFrameTagBytes - job.tag_have};
        const ssize_t r = ::readv(job.read_fd, iov, n);
        if (r > 0) {
            size_t got = static_cast<size_t>(r);
            job.read_bytes += got;
            const size_t data = std::min(got, job.len - job.have);
            job.have += data;
            job.tag_have += got - data;
            continue;
        }
        if (r == 0) {
            job.read_error = ECONNRESET;
            return;
        }
        // Drained: the sender is still at it, or stopped. Wait a little for more, then hand the
        // rest back to the engine, whose epoll waits for it without holding a worker.
        if (!tryAgain(job.read_fd, POLLIN, until, &job.read_error)) {
            return;
        }
    }
}

void TagPool::writeRest(TagJob &job) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSocketRunUs);
    job.write_error = 0;
    job.write_stalled = false;
    const size_t total = job.frameBytes();
    while (job.sent < total) {
        iovec iov[3];
        int n = 0;
        size_t skip = job.sent;
        const std::pair<const uint8_t *, size_t> parts[3] = {
            {job.head.data(), job.head_len}, {job.data, job.len}, {job.tag.data(), kFrameTagBytes}};
        for (const auto &[p, len] : parts) {
            if (skip >= len) {
                skip -= len;
                continue;
            }
            iov[n++] = {const_cast<uint8_t *>(p + skip), len - skip};
            skip = 0;
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(n);
        // MSG_NOSIGNAL: a peer that reset the connection gives EPIPE, not a SIGPIPE.
        const ssize_t w = ::sendmsg(job.write_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            job.sent += static_cast<size_t>(w);
            bytes_sent_.fetch_add(static_cast<uint64_t>(w), std::memory_order_relaxed);
            continue;
        }
        if (w == 0) {
            errno = EAGAIN;
        }
        if (!tryAgain(job.write_fd, POLLOUT, until, &job.write_error)) {
            job.write_stalled = job.write_error == 0;
            return;
        }
    }
    sends_done_.fetch_add(1, std::memory_order_relaxed);
}

void TagPool::compute(FrameMac &mac, TagJob &job) {
    if (job.write_fd >= 0 && job.tag_ready) {
        writeRest(job);
        return;
    }
    if (job.read_fd >= 0) {
        readRest(job);
        if (job.read_error != 0 || !job.readComplete()) {
            job.good = false;  // not checked yet: the key stays for the next run
            return;
        }
        reads_done_.fetch_add(1, std::memory_order_relaxed);
    }
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
        job.tag_ready = true;
    }
    sodium_memzero(job.otk.data(), job.otk.size());
    if (job.write_fd >= 0) {
        writeRest(job);
    }
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
        signalDone();
    }
}

}  // namespace tensorlane::sidecar
