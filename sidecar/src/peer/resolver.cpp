#include "peer/resolver.hpp"

#include "tensorlane/ipc/doorbell.hpp"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace tensorlane::sidecar {

Resolver::~Resolver() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
        thread_.join();
    }
}

int Resolver::open() {
    int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    event_.reset(fd);
    return 0;
}

void Resolver::request(uint64_t tag, std::string host, uint16_t port) {
    push(Request{tag, std::move(host), port, false});
}

void Resolver::requestAll(uint64_t tag, std::string host) {
    push(Request{tag, std::move(host), 0, true});
}

void Resolver::push(Request r) {
    {
        std::lock_guard lock(mu_);
        requests_.push_back(std::move(r));
        if (!thread_.joinable()) {
            thread_ = std::thread([this] {
                pthread_setname_np(pthread_self(), "tl-resolver");
                run();
            });
        }
    }
    cv_.notify_one();
}

std::vector<Resolver::Result> Resolver::take() {
    // Drains the eventfd counter; EAGAIN when nothing was signalled is fine.
    ipc::drain(event_.get());
    std::lock_guard lock(mu_);
    return std::exchange(results_, {});
}

void Resolver::run() {
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stop_ || !requests_.empty(); });
        if (stop_) {
            return;
        }
        Request req = std::move(requests_.front());
        requests_.pop_front();
        lock.unlock();
        Result res;
        res.tag = req.tag;
        res.rc = req.all ? resolveAllHosts(req.host, &res.hosts, &res.error)
                         : resolveAddress(req.host, req.port, false, &res.addr, &res.error);
        lock.lock();
        results_.push_back(std::move(res));
        ipc::ring(event_.get());
    }
}

}  // namespace tensorlane::sidecar
