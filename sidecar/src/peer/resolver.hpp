// Name resolution off the engine thread: getaddrinfo blocks (for seconds, with a dead DNS
// server), so peer addresses given as names are resolved on a helper thread and the results
// handed back through an eventfd in the peer manager's epoll set.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "net/socket.hpp"
#include "peer/address.hpp"
#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

class Resolver {
public:
    /// One answer; `rc` is 0 or the resolveAddress() error, with `error` its reason.
    struct Result {
        uint64_t tag = 0;
        int rc = 0;
        SockAddr addr;
        std::string error;
        /// Every address of the host (requestAll), for the accept-side checks.
        std::vector<HostAddress> hosts;
    };

    Resolver() = default;
    /// Joins the helper thread (a lookup in progress is waited for).
    ~Resolver();
    Resolver(const Resolver &) = delete;
    Resolver &operator=(const Resolver &) = delete;

    /// Creates the eventfd. Returns 0 or errno.
    int open();
    /// Readable when results are waiting.
    int fd() const { return event_.get(); }
    /// Queues a lookup; the helper thread starts on first use.
    void request(uint64_t tag, std::string host, uint16_t port);
    /// Queues a lookup of every address of `host` (Result::hosts).
    void requestAll(uint64_t tag, std::string host);
    /// Takes every finished answer.
    std::vector<Result> take();

private:
    struct Request {
        uint64_t tag;
        std::string host;
        uint16_t port;
        bool all = false;
    };
    void push(Request r);
    void run();

    ipc::UniqueFd event_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Request> requests_;
    std::vector<Result> results_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
