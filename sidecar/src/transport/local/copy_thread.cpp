#include "transport/local/copy_thread.hpp"

#include <pthread.h>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "cuda/copier.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "transport/local/host_copy.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tensorlane::sidecar {

LocalCopyThread::LocalCopyThread() = default;

LocalCopyThread::~LocalCopyThread() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

void LocalCopyThread::setPolling(bool busy, uint32_t spin_us) {
    // Even a busy-polling sidecar's copy thread sleeps once local writes stop coming for a
    // while: it would otherwise take a whole core from the engine and the clients (on a 2-core
    // machine, three spinning threads slow a no-op round trip a hundredfold). While writes
    // come, it stays awake, so each one costs no wake-up.
    constexpr uint32_t kBusySpinUs = 500;
    spin_us_ = busy ? std::max(spin_us, kBusySpinUs) : spin_us;
}

Status LocalCopyThread::start() {
    if (int rc = ipc::makeEventFd(&wake_)) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "tl-copy");
        run();
    });
    return Status::ok();
}

void LocalCopyThread::hand(LocalJob job, SessionId sid) {
    std::lock_guard lock(mu_);
    incoming_.push_back(Incoming{std::move(job), sid});
    has_incoming_.store(true, std::memory_order_release);
    if (sleeping_) {
        cv_.notify_one();
    }
}

void LocalCopyThread::retire(RegionId r) {
    std::lock_guard lock(mu_);
    retired_.push_back(r);
    has_incoming_.store(true, std::memory_order_release);
    if (sleeping_) {
        cv_.notify_one();
    }
}

bool LocalCopyThread::arm() {
    armed_.store(true, std::memory_order_relaxed);
    // SYNC POINT: seq_cst fence between raising armed_ and reading done_ready_; the copy thread
    // stores done_ready_, fences, then reads armed_ (Dekker): either we see its work here, or it
    // sees that we may sleep and rings the eventfd.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return !done_ready_.load(std::memory_order_relaxed);
}

void LocalCopyThread::take(std::vector<LocalDone> *out) {
    armed_.store(false, std::memory_order_relaxed);
    if (rung_.load(std::memory_order_acquire) && rung_.exchange(false)) {
        ipc::drain(wake_.get());  // only when it was rung: no syscall on the busy path
    }
    if (!done_ready_.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard lock(mu_);
    for (LocalDone &d : done_) {
        out->push_back(std::move(d));
    }
    done_.clear();
    done_ready_.store(false, std::memory_order_relaxed);
}

bool LocalCopyThread::turn(std::vector<LocalDone> *done) {
    bool moved = false;
    for (auto it = jobs_.begin(); it != jobs_.end();) {
        const SessionId sid = it->first;
        std::deque<LocalJob> &q = it->second;
        // GPU copies at the front that have finished, in order.
        while (!q.empty() && q.front().gpu && q.front().issued) {
            LocalDone d;
            if (!pollGpuCopy(q.front(), *copier_, sid, &d)) {
                break;
            }
            done->push_back(std::move(d));
            q.pop_front();
            moved = true;
        }
        // The next job that has not started: GPU copies queue behind each other; a host copy
        // only once nothing of this session is on the GPU any more.
        size_t k = 0;
        while (k < q.size() && q[k].gpu && q[k].issued) {
            ++k;
        }
        if (k < q.size()) {
            LocalJob &j = q[k];
            if (j.gpu && k < kMaxGpuInFlight) {
                issueGpuCopy(j, *copier_, static_cast<uint32_t>(sid), &pins_);
                moved = true;
            } else if (!j.gpu && k == 0) {
                LocalDone d;
                if (copyHostSlice(j, sid, &d)) {
                    done->push_back(std::move(d));
                    q.pop_front();
                }
                moved = true;
            }
        }
        it = q.empty() ? jobs_.erase(it) : std::next(it);
    }
    return moved;
}

void LocalCopyThread::publish(std::vector<LocalDone> *done) {
    if (done->empty()) {
        return;
    }
    {
        std::lock_guard lock(mu_);
        for (LocalDone &d : *done) {
            done_.push_back(std::move(d));
        }
        done_ready_.store(true, std::memory_order_relaxed);
    }
    done->clear();
    // SYNC POINT: pairs with arm(): done_ready_ is stored, then armed_ read, across a seq_cst
    // fence. An engine that is awake finds the work through done_ready_ without a syscall.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (armed_.load(std::memory_order_relaxed)) {
        // Rung first, flagged second: take() drains only after seeing the flag, so a drain can
        // never run before the ring it is meant for and leave the eventfd readable.
        ipc::ring(wake_.get());
        rung_.store(true, std::memory_order_release);
    }
}

void LocalCopyThread::run() {
    using Clock = std::chrono::steady_clock;
    copier_ = std::make_unique<CudaCopier>();
    std::vector<LocalDone> done;
    std::vector<RegionId> retired;
    auto last_work = Clock::now();
    for (;;) {
        {
            std::unique_lock lock(mu_);
            if (jobs_.empty() && incoming_.empty() && retired_.empty() && !stop_) {
                const bool spin = Clock::now() - last_work < std::chrono::microseconds(spin_us_);
                if (spin) {
                    // Spin outside the lock: hand() only takes it to hand over work.
                    lock.unlock();
                    while (!has_incoming_.load(std::memory_order_acquire) &&
                           Clock::now() - last_work < std::chrono::microseconds(spin_us_)) {
#if defined(__x86_64__)
                        _mm_pause();
#endif
                    }
                    continue;
                }
                sleeping_ = true;
                cv_.wait(lock, [this] { return stop_ || !incoming_.empty() || !retired_.empty(); });
                sleeping_ = false;
            }
            if (stop_) {
                break;
            }
            for (Incoming &in : incoming_) {
                jobs_[in.session].push_back(std::move(in.job));
            }
            incoming_.clear();
            retired.swap(retired_);
            has_incoming_.store(false, std::memory_order_relaxed);
        }
        // Outside the lock: unlocking host memory may take a while, and hand() must not wait.
        for (RegionId r : retired) {
            pins_.release(r);
        }
        retired.clear();
        if (turn(&done)) {
            last_work = Clock::now();
        }
        publish(&done);
    }
    for (auto &[sid, q] : jobs_) {
        waitGpuCopies(q, *copier_);
    }
    jobs_.clear();
    pins_.clear();
    copier_.reset();
}

}  // namespace tensorlane::sidecar
