// The shim's client: one connection to the sidecar behind the C ABI, made of its parts: the
// control channel (control_channel.hpp), the rings of its session segment (rings.hpp), the
// waits on them (waiter.hpp) and its regions (region_table.hpp). The client checks arguments,
// builds control messages and requests, and ties the CUDA calls in (cuda_client.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "control_channel.hpp"
#include "cuda_memory.hpp"
#include "ex_arena.hpp"
#include "last_error.hpp"
#include "region_table.hpp"
#include "rings.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/tensorlane.h"
#include "waiter.hpp"

namespace tensorlane::shim {

class Client {
public:
    Client() = default;
    ~Client();

    Code connect(const std::string &path);
    const std::string &nodeName() const { return node_name_; }

    tl_status allocHost(size_t bytes, void **ptr, tl_region *out);
    tl_status registerMemory(void *ptr, size_t bytes, tl_region *out);
    /// tl_register_dmabuf: [offset, offset + bytes) of the dma-buf `fd` (client.cpp).
    tl_status registerDmabuf(int fd, uint64_t offset, uint64_t bytes, tl_region *out);
    tl_status deregister(tl_region r);
    tl_status expose(tl_region r, const char *name);
    /// tl_expose_access; access null: tl_expose.
    tl_status exposeAccess(tl_region r, const char *name, const tl_access *access);
    tl_status lookup(const char *peer, const char *name, tl_remote *out, uint64_t *bytes);
    /// Submits n writes (one doorbell); `*submitted` (may be null) says how many went in.
    tl_status write(const tl_write_desc *w, size_t n, tl_ticket *out, size_t *submitted);
    tl_status nop(size_t n, tl_ticket *out, size_t *submitted);
    /// tl_write_msg and tl_write_group (ex_client.cpp).
    tl_status writeMsg(tl_region src, uint64_t src_off, tl_remote dst, uint64_t dst_off,
                       uint64_t bytes, const tl_send_opts *opts, tl_ticket *out);
    tl_status writeGroup(const tl_group_entry *entries, size_t n, const tl_send_opts *opts,
                         tl_ticket *out);
    tl_status waitMessage(tl_message *out, int timeout_ms) {
        return waiter_.waitMessage(out, timeout_ms);
    }
    tl_status wait(tl_ticket t, int timeout_ms) { return waiter_.wait(t, timeout_ms); }
    tl_status test(tl_ticket t, int *done) { return waiter_.test(t, done); }
    tl_status waitNotification(tl_notification *out, int timeout_ms) {
        return waiter_.waitNotification(out, timeout_ms);
    }
    tl_status waitNotificationEx(tl_notification_ex *out, int timeout_ms) {
        return waiter_.waitNotificationEx(out, timeout_ms);
    }
    /// The whole status document, read in pages (at most kMaxStatusPages of them: 64 MiB).
    tl_status sidecarStatus(std::string *json);
    static constexpr uint32_t kMaxStatusPages = 1024;

    // Stream-ordered calls (cuda_client.cpp; DESIGN.md, "Stream-ordered calls").
    tl_status writeOnStream(const tl_write_desc &w, void *stream, tl_ticket *out);
    tl_status streamWaitTicket(tl_ticket t, void *stream);
    tl_status streamWaitNotification(tl_region r, uint32_t imm, void *stream);

private:
    /// Builds a kWriteEx description in the arena and submits it (ex_client.cpp).
    tl_status submitEx(ipc::ExKind kind, const tl_group_entry *entries, size_t n, tl_remote notify,
                       uint64_t notify_off, const tl_send_opts &opts, const char *what,
                       tl_ticket *out);
    /// tl_register of device memory (cuda_client.cpp).
    tl_status registerCuda(void *ptr, size_t bytes, tl_region *out);
    /// tl_register of VMM memory: its pieces' fds, or the dma-buf of their span alone.
    /// `host`: pinned host memory made with cuMemCreate (CudaPointer::kVmmHost).
    tl_status registerVmm(void *ptr, size_t bytes, const CudaAllocation &a, tl_region *out,
                          bool host);
    /// Creates the stream segment on first use and starts the keeper. TL_OK when it exists.
    tl_status ensureStreams();
    /// The keeper thread: releases every waiting stream when the sidecar goes away.
    void keepStreams();

    // Declared in creation order, so they go in reverse: the control socket last, which is
    // what tells the sidecar to release everything of ours.
    ControlChannel control_;
    Rings rings_{control_};
    Waiter waiter_{control_, rings_};
    std::string node_name_;
    RegionTable regions_;
    /// The kWriteEx descriptions in flight (ex_arena.hpp); its buffers are regions of ours.
    ExArena ex_arena_{
        [this](size_t bytes, void **ptr, tl_region *out) { return allocHost(bytes, ptr, out); }};

    // CUDA (cuda_client.cpp).
    std::mutex cuda_mu_;        ///< serialises CUDA registrations and stream setup
    CudaExports cuda_exports_;  ///< cuda_mu_
    /// The keys of VMM and dma-buf registrations: this bit and a count (cuda_mu_), apart from
    /// the CUDA buffer ids that key allocations exported with IPC handles.
    static constexpr uint64_t kVmmKeyBit = uint64_t{1} << 63;
    uint64_t next_vmm_key_ = 1;
    std::atomic<bool> streams_ready_{false};
    ipc::UniqueFd keeper_stop_;
    std::thread keeper_;
};

}  // namespace tensorlane::shim
