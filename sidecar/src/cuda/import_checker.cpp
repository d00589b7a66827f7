#include "cuda/import_checker.hpp"

#include <pthread.h>
#include <cstring>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

std::unique_ptr<CudaImportChecker> CudaImportChecker::create(Status *st) {
    std::unique_ptr<CudaImportChecker> c(new CudaImportChecker());
    if (int rc = ipc::makeEventFd(&c->event_)) {
        *st = {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
        return nullptr;
    }
    c->thread_ = std::thread([p = c.get()] {
        pthread_setname_np(pthread_self(), "tl-cuda-import");
        p->loop();
    });
    return c;
}

CudaImportChecker::~CudaImportChecker() {
    std::deque<Job> left;
    {
        std::lock_guard lock(mu_);
        stop_ = true;
        left.swap(jobs_);
    }
    cv_.notify_one();
    if (thread_.joinable()) {
        thread_.join();
    }
}

void CudaImportChecker::submit(Job job) {
    {
        std::lock_guard lock(mu_);
        jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
}

std::vector<CudaImportChecker::Result> CudaImportChecker::take() {
    ipc::drain(event_.get());
    std::lock_guard lock(mu_);
    std::vector<Result> out;
    out.swap(results_);
    return out;
}

void CudaImportChecker::loop() {
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) {
            return;
        }
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        Status st = job.import->verify();
        lock.lock();
        results_.push_back(Result{std::move(job), std::move(st)});
        ipc::ring(event_.get());
    }
}

}  // namespace tensorlane::sidecar
