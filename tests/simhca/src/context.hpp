// One open device context (ibv_open_device): the verbs_context applications call through, its
// async event queue and its command fd.
#pragma once

#include "async_event_queue.hpp"
#include "handles.hpp"

namespace tensorlane::simhca {

/// An open context.
class SimContext {
public:
    /// Opens a context on dev; the engine must be running (Simulator::openContext()).
    explicit SimContext(SimDevice *dev);
    ~SimContext();
    SimContext(const SimContext &) = delete;
    SimContext &operator=(const SimContext &) = delete;

    /// What the application holds.
    [[nodiscard]] ibv_context *ibv() { return &handle_.vctx.context; }
    /// The context behind an ibv_context this library handed out.
    [[nodiscard]] static SimContext *from(ibv_context *c) {
        auto *vctx = reinterpret_cast<verbs_context *>(reinterpret_cast<char *>(c) -
                                                       offsetof(verbs_context, context));
        return handleOf<ContextHandle>(vctx)->self;
    }
    /// The device this context is open on.
    [[nodiscard]] SimDevice &device() { return *device_; }
    /// The async event queue (async_fd).
    [[nodiscard]] AsyncEventQueue &events() { return events_; }

private:
    SimDevice *device_;
    AsyncEventQueue events_;
    int cmd_fd_;
    ContextHandle handle_{};
};

}  // namespace tensorlane::simhca
