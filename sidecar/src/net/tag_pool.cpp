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

#include "net/env_knob.hpp"
#include "net/packed_chunk.hpp"
#include "tensorlane/sidecar/trace.hpp"

namespace tensorlane::sidecar {

size_t TagPool::readFrom() {
    static const size_t from = [] {
        const uint64_t n = envNumber("TENSORLANE_TAG_READ_FROM").value_or(0);
        return n >= 4096 ? static_cast<size_t>(n) : kReadFrom;
    }();
    return from;
}

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
    if (tracing()) {
        job->queued_at = std::chrono::steady_clock::now();
    }
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
            waitDone(lock, job);
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
    waitDone(lock, job);
    return true;
}

void TagPool::waitDone(std::unique_lock<std::mutex> &lock, const TagJob &job) {
    TurnTimer wait("tag wait", 0);  // traced: the owner's thread waits here
    done_cv_.wait(lock, [&] { return job.done.load(std::memory_order_acquire); });
}

bool TagPool::reserveSocket() {
    const auto workers = static_cast<unsigned>(workers_.size());
    const unsigned limit = workers > 1 ? workers - 1 : workers;
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
            waitDone(lock, job);
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
/// where it failed (0: it stayed blocked, or `others_waiting`: jobs are queued for a worker,
/// and this one would only sit in the wait while they do).
bool tryAgain(int fd, short events, std::chrono::steady_clock::time_point until,
              bool others_waiting, int *error) {
    if (errno == EINTR) {
        return true;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
        *error = errno;
        return false;
    }
    if (others_waiting) {
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

void TagPool::readRest(TagJob &job, FrameMac &mac) {
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
        iov[n++] = {job.tag.data() + job.tag_have, kChunkTrailerBytes - job.tag_have};
        const ssize_t r = ::readv(job.read_fd, iov, n);
        if (r > 0) {
            size_t got = static_cast<size_t>(r);
            job.read_bytes += got;
            const size_t data = std::min(got, job.len - job.have);
            job.have += data;
            job.tag_have += got - data;
            // Tagged while the bytes are still in cache, and while the sender sends the rest.
            mac.update(job.data + job.tagged, job.have - job.tagged);
            job.tagged = job.have;
            continue;
        }
        if (r == 0) {
            job.read_error = ECONNRESET;
            return;
        }
        // Drained: the sender is still at it, or stopped. Wait a little for more, then hand the
        // rest back to the engine, whose epoll waits for it without holding a worker.
        if (!tryAgain(job.read_fd, POLLIN, until, othersWaiting(), &job.read_error)) {
            return;
        }
    }
}

bool TagPool::sendUpTo(TagJob &job, size_t limit, bool wait) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSocketRunUs);
    while (job.sent < limit) {
        iovec iov[3];
        int n = 0;
        size_t skip = job.sent;
        size_t left = limit - job.sent;
        const std::pair<const uint8_t *, size_t> parts[3] = {{job.head.data(), job.head_len},
                                                             {job.data, job.len},
                                                             {job.tag.data(), kChunkTrailerBytes}};
        for (const auto &[p, len] : parts) {
            if (skip >= len) {
                skip -= len;
                continue;
            }
            const size_t take = std::min(len - skip, left);
            iov[n++] = {const_cast<uint8_t *>(p + skip), take};
            left -= take;
            skip = 0;
            if (left == 0) {
                break;
            }
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
        if (!wait) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                job.write_error = errno;
            }
            return false;
        }
        if (!tryAgain(job.write_fd, POLLOUT, until, othersWaiting(), &job.write_error)) {
            job.write_stalled = job.write_error == 0;
            return false;
        }
    }
    return true;
}

void TagPool::writeRest(TagJob &job) {
    job.write_error = 0;
    job.write_stalled = false;
    if (sendUpTo(job, job.frameBytes(), /*wait=*/true)) {
        sends_done_.fetch_add(1, std::memory_order_relaxed);
    }
}

void TagPool::signAndSend(FrameMac &mac, TagJob &job) {
    // Each piece goes out as soon as it is tagged (the tag is the frame's trailer), so the
    // receiver reads, and tags, the first bytes while this one tags the rest, and the send
    // copies every piece from cache. The socket is not waited for here: what does not fit yet
    // goes after the tag, in writeRest().
    const size_t piece = std::max(kSendPiece, ((job.len + 3) / 4 + 4095) & ~size_t{4095});
    job.write_error = 0;
    job.write_stalled = false;
    mac.init(job.otk, job.head_len + job.len);
    mac.update(job.head.data(), job.head_len);
    bool room = true;
    for (size_t done = 0; done < job.len;) {
        const size_t n = std::min(piece, job.len - done);
        mac.update(job.data + done, n);
        done += n;
        if (room && job.write_error == 0) {
            room = sendUpTo(job, job.head_len + done, /*wait=*/false);
        }
    }
    finishSign(mac, job);
    if (job.write_error == 0) {
        writeRest(job);
    }
}

void TagPool::compute(FrameMac &mac, TagJob &job) {
    if (job.write_fd >= 0 && job.tag_ready) {
        writeRest(job);
        return;
    }
    if (job.read_fd >= 0) {
        readAndCheck(mac, job);
        return;
    }
    gatherInto(job.gather_to, job.gather);
    if (!job.verify && job.write_fd >= 0) {
        signAndSend(mac, job);
        return;
    }
    mac.init(job.otk, job.head_len + job.len);
    mac.update(job.head.data(), job.head_len);
    mac.update(job.data, job.len);
    if (job.verify) {
        checkAndLand(mac, job);
        return;
    }
    finishSign(mac, job);
}

void TagPool::finishSign(FrameMac &mac, TagJob &job) {
    mac.final(job.tag.data());
    FrameAuth::headerTag(job.head_otk, job.head.data(), job.head_len,
                         job.tag.data() + kFrameTagBytes);
    job.tag_ready = true;
    wipeKeys(job);
}

void TagPool::wipeKeys(TagJob &job) {
    sodium_memzero(job.otk.data(), job.otk.size());
    sodium_memzero(job.head_otk.data(), job.head_otk.size());
}

void TagPool::checkAndLand(FrameMac &mac, TagJob &job) {
    job.good = mac.verify(job.tag.data());
    // The header tag only where the frame's failed: did the data alone change?
    job.header_good =
        job.good || FrameAuth::headerTagMatches(job.head_otk, job.head.data(), job.head_len,
                                                job.tag.data() + kFrameTagBytes);
    if (job.good && job.copy_to != nullptr) {
        if (job.pieces != 0) {
            job.landed = landPacked(job.copy_to, job.region_bytes, job.data, job.len, job.pieces);
        } else {
            std::memcpy(job.copy_to, job.data, job.len);
        }
    }
    wipeKeys(job);
}

void TagPool::readAndCheck(FrameMac &mac, TagJob &job) {
    // The frame's tag state: a run before this one's, or this worker's.
    FrameMac &m = job.mac ? *job.mac : mac;
    if (!job.mac_started) {
        m.init(job.otk, job.head_len + job.len);
        m.update(job.head.data(), job.head_len);
        job.mac_started = true;
        job.tagged = 0;
    }
    // What the owner moved into the buffer before it handed the socket over.
    m.update(job.data + job.tagged, job.have - job.tagged);
    job.tagged = job.have;
    readRest(job, m);
    if (job.read_error != 0 || !job.readComplete()) {
        job.good = false;  // not checked yet: the next run goes on from here
        if (!job.mac) {
            job.mac = std::make_unique<FrameMac>(std::move(mac));
            mac = FrameMac();
        }
        return;
    }
    reads_done_.fetch_add(1, std::memory_order_relaxed);
    // The socket is the owner's again; the check and the landing copy go on here meanwhile.
    job.read_done.store(true, std::memory_order_release);
    signalDone();
    checkAndLand(m, job);
    job.mac.reset();
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
        // Traced: how long the job waited for a worker and ran (TENSORLANE_TRACE_FILE). Its
        // kind, size and wait are taken before the run: once a reading job's bytes are in, its
        // owner may change it. A job whose tag is there only sends ("send").
        const bool traced = tracing();
        const auto began =
            traced ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
        const char *kind = job->verify ? "verify" : job->tag_ready ? "send" : "sign";
        const char *io = job->read_fd >= 0 ? " read" : job->write_fd >= 0 ? " write" : "";
        const size_t len = job->len;
        const auto waited = began - job->queued_at;
        compute(mac, *job);
        if (traced) {
            const auto us = [](auto d) {
                return static_cast<long long>(
                    std::chrono::duration_cast<std::chrono::microseconds>(d).count());
            };
            traceStep("tag %s len %zu waited %lld ran %lld%s", kind, len, us(waited),
                      us(std::chrono::steady_clock::now() - began), io);
        }
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
