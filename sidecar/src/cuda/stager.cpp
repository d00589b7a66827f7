#include "cuda/stager.hpp"

#include <pthread.h>
#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "cuda/copier.hpp"
#include "cuda/import.hpp"
#include "cuda/runtime.hpp"
#include "logging.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

CudaStager::CudaStager(uint32_t slot_bytes, uint32_t slots)
    : slot_bytes_(slot_bytes), slots_(slots) {}

CudaStager::~CudaStager() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
    if (base_ != nullptr) {
        ::munmap(base_, map_bytes_);
    }
}

Status CudaStager::start() {
    if (!CudaRuntime::get().available()) {
        return {Code::kCuda, "no GPU staging: " + CudaRuntime::get().why()};
    }
    map_bytes_ = uint64_t{slot_bytes_} * slots_;
    void *p =
        ::mmap(nullptr, map_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return {Code::kNoMemory,
                std::string("mmap of the GPU staging slots: ") + std::strerror(errno)};
    }
    base_ = static_cast<unsigned char *>(p);
    if (int rc = ipc::makeEventFd(&wake_)) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "tl-stager");
        run();
    });
    return Status::ok();
}

void CudaStager::submit(std::vector<Job> jobs) {
    std::lock_guard lock(mu_);
    for (Job &j : jobs) {
        incoming_.push_back(std::move(j));
    }
    if (idle_.load(std::memory_order_relaxed)) {
        cv_.notify_one();
    }
}

void CudaStager::take(std::vector<Result> *out) {
    if (!ready_.load(std::memory_order_acquire)) {
        return;
    }
    std::lock_guard lock(mu_);
    for (Result &r : results_) {
        out->push_back(std::move(r));
    }
    results_.clear();
    ready_.store(false, std::memory_order_relaxed);
    ipc::drain(wake_.get());
}

void CudaStager::run() {
    struct Running {
        Job job;
        uint32_t handle = 0;
    };
    CudaCopier copier;
    std::shared_ptr<void> pinned;  // the slots, page-locked (unlocked when the thread ends)
    bool pin_tried = false;
    std::deque<Running> running;
    std::vector<Job> jobs;
    std::vector<Result> finished;
    using Clock = std::chrono::steady_clock;
    // After its last copy the thread keeps looking for this long before it sleeps: chunks of a
    // transfer come every few hundred microseconds, and a wake-up would cost one each time.
    constexpr auto kSpin = std::chrono::microseconds(500);
    auto last_work = Clock::now();
    std::unique_lock lock(mu_);
    for (;;) {
        if (running.empty() && incoming_.empty() && !stop_) {
            if (Clock::now() - last_work < kSpin) {
                lock.unlock();
                std::this_thread::yield();
                lock.lock();
                continue;
            }
            idle_.store(true, std::memory_order_relaxed);
            cv_.wait(lock, [this] { return stop_ || !incoming_.empty(); });
            idle_.store(false, std::memory_order_relaxed);
        }
        if (stop_) {
            break;
        }
        jobs.swap(incoming_);
        lock.unlock();
        if (!jobs.empty()) {
            last_work = Clock::now();
        }
        if (!jobs.empty() && !pin_tried) {
            pin_tried = true;
            // Without the lock the copies still work, staged once more by the driver (slower):
            // said once in the log.
            Status st = CudaRuntime::get().pinHost(base_, map_bytes_, &pinned);
            if (!st.isOk()) {
                sidecarLogger("cuda")->warn("GPU staging slots ({} bytes) are not page-locked: {}",
                                            map_bytes_, st.message());
            }
        }
        // Jobs of one id in a row are the pieces of one packed chunk: only the last is marked
        // and answered (the lane runs them in order), with the first failure among them.
        Status run_st;
        for (size_t k = 0; k < jobs.size(); ++k) {
            Job &j = jobs[k];
            const bool last = k + 1 == jobs.size() || jobs[k + 1].id != j.id;
            uint64_t base = 0;
            Status st = run_st.isOk() ? j.import->base(&base) : run_st;
            Running r{std::move(j), 0};
            if (st.isOk()) {
                const uint64_t dev = base + r.job.device_offset;
                const auto host = reinterpret_cast<uint64_t>(r.job.host);
                // Lane 0 carries device-to-host, lane 1 host-to-device.
                st = copier.start(r.job.import->ordinal(), r.job.to_device ? 1 : 0,
                                  r.job.to_device ? dev : host, r.job.to_device ? host : dev,
                                  r.job.bytes, last ? &r.handle : nullptr);
            }
            if (!last) {
                run_st = st;
                continue;
            }
            run_st = Status::ok();
            if (!st.isOk()) {
                finished.push_back(Result{r.job.id, st});
                continue;
            }
            running.push_back(std::move(r));
        }
        jobs.clear();
        for (auto it = running.begin(); it != running.end();) {
            Status st = copier.poll(it->handle);
            if (st.code() == Code::kAgain) {
                ++it;
                continue;
            }
            finished.push_back(Result{it->job.id, st});
            it = running.erase(it);
            last_work = Clock::now();
        }
        lock.lock();
        if (!finished.empty()) {
            for (Result &r : finished) {
                results_.push_back(std::move(r));
            }
            finished.clear();
            ready_.store(true, std::memory_order_release);
            ipc::ring(wake_.get());
        }
        if (!running.empty() && incoming_.empty()) {
            // Copies on the GPU and nothing new: look again soon without holding the lock.
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
        }
    }
    lock.unlock();
    for (Running &r : running) {
        while (copier.poll(r.handle).code() == Code::kAgain) {
        }
    }
}

}  // namespace tensorlane::sidecar
