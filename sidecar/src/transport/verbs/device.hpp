// The RDMA device the verbs transport uses: its context opened by name (from the fabric
// selection), the port's limits, one completion channel for every CQ (the fd the engine sleeps
// on), and a thread that reads the device's asynchronous events (port down/up, GID change, QP
// fatal, CQ error) and hands them to the engine thread through a queue and an eventfd.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "transport/verbs/objects.hpp"

namespace tensorlane::sidecar {

class VerbsDevice {
public:
    /// One asynchronous event, as the engine thread sees it.
    struct AsyncEvent {
        ibv_event_type type = IBV_EVENT_DEVICE_FATAL;
        uint32_t qp_num = 0;  ///< for QP events
        uint32_t port = 0;    ///< for port events
    };

    /// Opens `sel.device` and checks its port; starts the event thread.
    static Status open(const FabricSelection &sel, std::unique_ptr<VerbsDevice> *out);
    ~VerbsDevice();
    VerbsDevice(const VerbsDevice &) = delete;
    VerbsDevice &operator=(const VerbsDevice &) = delete;

    ibv_context *context() const { return ctx_.get(); }
    ibv_comp_channel *channel() const { return channel_.get(); }
    const std::string &name() const { return name_; }
    uint32_t port() const { return port_; }
    /// The port's largest message (ibv_port_attr.max_msg_sz).
    uint32_t maxMessage() const { return max_msg_; }
    /// The device's largest queue depth.
    uint32_t maxQpWr() const { return max_qp_wr_; }
    /// The port's state now (ibv_query_port).
    ibv_port_state portState() const;
    /// Fds the engine polls: the completion channel and the event queue's eventfd.
    std::vector<int> fds() const { return {channel_->fd, events_fd_.get()}; }
    /// Acknowledges the CQ events that are ready (non-blocking); returns how many.
    size_t drainCqEvents();
    /// The events the thread queued since the last call.
    std::vector<AsyncEvent> takeEvents();
    bool eventsPending() const { return events_pending_.load(std::memory_order_acquire); }
    /// Human text for an event.
    static std::string describe(const AsyncEvent &e);

private:
    VerbsDevice() = default;
    void run();

    std::string name_;
    uint32_t port_ = 1;
    uint32_t max_msg_ = 1u << 30;
    uint32_t max_qp_wr_ = 1024;
    verbs_detail::ContextPtr ctx_;
    verbs_detail::CompChannelPtr channel_;
    ipc::UniqueFd events_fd_;
    ipc::UniqueFd stop_fd_;
    std::mutex mu_;
    std::vector<AsyncEvent> events_;
    std::atomic<bool> events_pending_{false};
    std::thread thread_;
};

}  // namespace tensorlane::sidecar
