#include "transport/verbs/device.hpp"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>

#include <cerrno>
#include <cstring>

#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

Status VerbsDevice::open(const FabricSelection &sel, std::unique_ptr<VerbsDevice> *out) {
    std::unique_ptr<VerbsDevice> d(new VerbsDevice());
    d->name_ = sel.device;
    d->port_ = sel.port;
    int n = 0;
    ibv_device **list = ibv_get_device_list(&n);
    if (list == nullptr) {
        return {Code::kNotFound,
                std::string("ibv_get_device_list: ") + std::strerror(errno) +
                    " (is rdma-core's libibverbs installed, and the device's provider?)"};
    }
    ibv_device *dev = nullptr;
    for (int i = 0; i < n; ++i) {
        if (sel.device == ibv_get_device_name(list[i])) {
            dev = list[i];
        }
    }
    if (dev == nullptr) {
        ibv_free_device_list(list);
        return {Code::kNotFound, "libibverbs lists no device '" + sel.device +
                                     "' (sysfs has it: is its provider library installed?)"};
    }
    d->ctx_.reset(ibv_open_device(dev));
    ibv_free_device_list(list);
    if (!d->ctx_) {
        return {Code::kPermission, "ibv_open_device(" + sel.device + "): " + std::strerror(errno)};
    }
    ibv_device_attr dattr{};
    if (int rc = ibv_query_device(d->ctx_.get(), &dattr)) {
        return {Code::kInternal, "ibv_query_device: " + std::string(std::strerror(rc))};
    }
    d->max_qp_wr_ = static_cast<uint32_t>(dattr.max_qp_wr);
    ibv_port_attr pattr{};
    if (int rc = ibv_query_port(d->ctx_.get(), static_cast<uint8_t>(sel.port), &pattr)) {
        return {Code::kInternal, "ibv_query_port: " + std::string(std::strerror(rc))};
    }
    if (pattr.link_layer != IBV_LINK_LAYER_ETHERNET) {
        return {Code::kInvalid, sel.device + " port " + std::to_string(sel.port) +
                                    " is not an Ethernet (RoCE) port"};
    }
    d->max_msg_ = pattr.max_msg_sz != 0 ? pattr.max_msg_sz : (1u << 30);
    // The GID the fabric selection read from sysfs must be the one the device reports at that
    // index: a mismatch means the table changed under us.
    ibv_gid gid{};
    if (int rc = ibv_query_gid(d->ctx_.get(), static_cast<uint8_t>(sel.port),
                               static_cast<int>(sel.gid_index), &gid)) {
        return {Code::kInternal, "ibv_query_gid: " + std::string(std::strerror(rc))};
    }
    if (std::memcmp(gid.raw, sel.gid.raw.data(), 16) != 0) {
        return {Code::kInvalid, "GID index " + std::to_string(sel.gid_index) + " of " + sel.device +
                                    " is not " + sel.gid_text +
                                    " any more (the GID table changed); will re-read it"};
    }
    d->channel_.reset(ibv_create_comp_channel(d->ctx_.get()));
    if (!d->channel_) {
        return {Code::kInternal, std::string("ibv_create_comp_channel: ") + std::strerror(errno)};
    }
    // Non-blocking: the engine drains events after its poll says the fd is readable.
    for (int fd : {d->channel_->fd, d->ctx_->async_fd}) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
            return {Code::kInternal, std::string("fcntl O_NONBLOCK: ") + std::strerror(errno)};
        }
    }
    if (int rc = ipc::makeEventFd(&d->events_fd_); rc != 0) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    if (int rc = ipc::makeEventFd(&d->stop_fd_); rc != 0) {
        return {Code::kInternal, std::string("eventfd: ") + std::strerror(rc)};
    }
    VerbsDevice *raw = d.get();
    d->thread_ = std::thread([raw] {
        pthread_setname_np(pthread_self(), "tl-verbs-async");
        raw->run();
    });
    *out = std::move(d);
    return Status::ok();
}

VerbsDevice::~VerbsDevice() {
    if (thread_.joinable()) {
        ipc::ring(stop_fd_.get());
        thread_.join();
    }
}

ibv_port_state VerbsDevice::portState() const {
    ibv_port_attr a{};
    if (ibv_query_port(ctx_.get(), static_cast<uint8_t>(port_), &a) != 0) {
        return IBV_PORT_NOP;
    }
    return a.state;
}

size_t VerbsDevice::drainCqEvents() {
    size_t n = 0;
    ibv_cq *cq = nullptr;
    void *cq_ctx = nullptr;
    while (ibv_get_cq_event(channel_.get(), &cq, &cq_ctx) == 0) {
        // Each event must be acknowledged before its CQ can be destroyed (ibv_get_cq_event(3)).
        ibv_ack_cq_events(cq, 1);
        ++n;
    }
    return n;
}

std::vector<VerbsDevice::AsyncEvent> VerbsDevice::takeEvents() {
    std::vector<AsyncEvent> out;
    {
        std::lock_guard lock(mu_);
        out.swap(events_);
        events_pending_.store(false, std::memory_order_relaxed);
    }
    ipc::drain(events_fd_.get());
    return out;
}

void VerbsDevice::run() {
    for (;;) {
        pollfd p[2] = {{ctx_->async_fd, POLLIN, 0}, {stop_fd_.get(), POLLIN, 0}};
        if (::poll(p, 2, -1) < 0) {
            if (errno == EINTR) {
                continue;
            }
            return;
        }
        if (p[1].revents != 0) {
            return;
        }
        ibv_async_event ev{};
        while (ibv_get_async_event(ctx_.get(), &ev) == 0) {
            AsyncEvent e;
            e.type = ev.event_type;
            switch (ev.event_type) {
                case IBV_EVENT_QP_FATAL:
                case IBV_EVENT_QP_REQ_ERR:
                case IBV_EVENT_QP_ACCESS_ERR:
                case IBV_EVENT_PATH_MIG_ERR:
                case IBV_EVENT_QP_LAST_WQE_REACHED:
                case IBV_EVENT_COMM_EST:
                case IBV_EVENT_SQ_DRAINED:
                case IBV_EVENT_PATH_MIG:
                    e.qp_num = ev.element.qp != nullptr ? ev.element.qp->qp_num : 0;
                    break;
                case IBV_EVENT_PORT_ACTIVE:
                case IBV_EVENT_PORT_ERR:
                case IBV_EVENT_GID_CHANGE:
                case IBV_EVENT_LID_CHANGE:
                case IBV_EVENT_PKEY_CHANGE:
                case IBV_EVENT_SM_CHANGE:
                case IBV_EVENT_CLIENT_REREGISTER:
                    e.port = static_cast<uint32_t>(ev.element.port_num);
                    break;
                default:
                    break;
            }
            ibv_ack_async_event(&ev);
            {
                std::lock_guard lock(mu_);
                events_.push_back(e);
                // SYNC POINT: set with the entry under the lock; the engine's arm() reads it
                // (acquire) before it sleeps, and the eventfd wakes one already asleep.
                events_pending_.store(true, std::memory_order_release);
            }
            ipc::ring(events_fd_.get());
        }
    }
}

std::string VerbsDevice::describe(const AsyncEvent &e) {
    std::string s = ibv_event_type_str(e.type);
    if (e.qp_num != 0) {
        char buf[32];
        std::snprintf(buf, sizeof buf, " (QP 0x%06x)", e.qp_num);
        s += buf;
    }
    if (e.port != 0) {
        s += " (port " + std::to_string(e.port) + ")";
    }
    return s;
}

}  // namespace tensorlane::sidecar
