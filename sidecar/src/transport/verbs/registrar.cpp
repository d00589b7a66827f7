#include "transport/verbs/registrar.hpp"

#include <pthread.h>
#include <cerrno>
#include <cstring>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

Status Registrar::start() {
    if (int rc = ipc::makeEventFd(&done_fd_); rc != 0) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    thread_ = std::thread([this] {
        pthread_setname_np(pthread_self(), "tl-verbs-reg");
        run();
    });
    return Status::ok();
}

Registrar::~Registrar() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
    // MRs nobody took: release them before their PDs go.
    for (Result &r : results_) {
        if (r.mr != nullptr) {
            (void)ibv_dereg_mr(r.mr);
        }
    }
}

void Registrar::submit(Job job) {
    {
        std::lock_guard lock(mu_);
        jobs_.push_back(std::move(job));
    }
    cv_.notify_one();
}

std::vector<Registrar::Result> Registrar::take() {
    std::vector<Result> out;
    {
        std::lock_guard lock(mu_);
        out.swap(results_);
        ready_.store(false, std::memory_order_relaxed);
    }
    ipc::drain(done_fd_.get());
    return out;
}

void Registrar::run() {
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
        if (stop_) {
            return;
        }
        Job job = std::move(jobs_.front());
        jobs_.pop_front();
        lock.unlock();
        Result r;
        r.id = job.id;
        r.pd = job.pd;
        errno = 0;
        if (job.dmabuf_fd >= 0 && dmabuf_ok_.load(std::memory_order_relaxed) != 0) {
            r.dmabuf = true;
            r.mr = ibv_reg_dmabuf_mr(job.pd.get(), job.dmabuf_offset, job.length, job.iova,
                                     job.dmabuf_fd, static_cast<int>(job.access));
            // Registration calls return NULL and set errno (ibv_reg_mr(3)).
            r.error = r.mr == nullptr ? (errno != 0 ? errno : EINVAL) : 0;
            if (r.mr != nullptr) {
                dmabuf_ok_.store(1, std::memory_order_relaxed);
            } else if (job.peermem_addr &&
                       (r.error == EOPNOTSUPP || r.error == EPROTONOSUPPORT || r.error == ENOSYS)) {
                // The kernel, the driver or the exporter cannot do dma-buf MRs here: every
                // later CUDA registration takes the peermem path straight away.
                dmabuf_ok_.store(0, std::memory_order_relaxed);
                r.dmabuf = false;
            } else if (job.peermem_addr && r.error == EINVAL &&
                       dmabuf_ok_.load(std::memory_order_relaxed) != 1) {
                // Older providers answer EINVAL for a verb they lack: this allocation tries
                // peermem, later ones try the dma-buf again (EINVAL may also be about this one).
                r.dmabuf = false;
            }
        }
        if (r.mr == nullptr && !r.dmabuf) {
            void *addr = job.addr;
            int err = 0;
            if (addr == nullptr && job.peermem_addr) {
                err = job.peermem_addr(&addr);
                peermem_used_.store(true, std::memory_order_relaxed);
            }
            if (err != 0 || addr == nullptr) {
                r.error = err != 0 ? err : EINVAL;
            } else {
                errno = 0;
                r.mr = ibv_reg_mr_iova2(job.pd.get(), addr, job.length, job.iova, job.access);
                r.error = r.mr == nullptr ? (errno != 0 ? errno : EINVAL) : 0;
            }
        }
        lock.lock();
        results_.push_back(std::move(r));
        // SYNC POINT: set with the result under the lock; the engine's arm() reads it.
        ready_.store(true, std::memory_order_release);
        ipc::ring(done_fd_.get());
    }
}

}  // namespace tensorlane::sidecar
