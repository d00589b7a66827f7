// The shim's client: one connection to the sidecar, its mapped session segment, and the
// process-private bookkeeping (tickets, notifications, regions) behind the C ABI.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda_memory.hpp"
#include "cuda_streams.hpp"
#include "tensorlane/ipc/control.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/status.hpp"
#include "tensorlane/tensorlane.h"
#include "ticket_table.hpp"

namespace tensorlane::shim {

using ipc::Code;

/// Sets this thread's tl_last_error and returns the code as a tl_status.
tl_status fail(Code code, std::string message);
/// This thread's tl_last_error text, and setting it back (around calls whose failure is not
/// the caller's).
std::string lastErrorText();
void setLastErrorText(std::string text);
inline tl_status toStatus(Code c) {
    return static_cast<tl_status>(c);
}

class Client {
public:
    Client() = default;
    ~Client();

    Code connect(const std::string &path);
    const std::string &nodeName() const { return node_name_; }

    tl_status allocHost(size_t bytes, void **ptr, tl_region *out);
    tl_status registerMemory(void *ptr, size_t bytes, tl_region *out);
    tl_status deregister(tl_region r);
    tl_status expose(tl_region r, const char *name);
    /// tl_expose_access; access null: tl_expose.
    tl_status exposeAccess(tl_region r, const char *name, const tl_access *access);
    tl_status lookup(const char *peer, const char *name, tl_remote *out, uint64_t *bytes);
    /// Submits n writes (one doorbell); `*submitted` (may be null) says how many went in.
    tl_status write(const tl_write_desc *w, size_t n, tl_ticket *out, size_t *submitted);
    tl_status nop(size_t n, tl_ticket *out, size_t *submitted);
    tl_status wait(tl_ticket t, int timeout_ms);
    tl_status test(tl_ticket t, int *done);
    tl_status waitNotification(tl_notification *out, int timeout_ms);
    tl_status waitNotificationEx(tl_notification_ex *out, int timeout_ms);
    tl_status sidecarStatus(std::string *json);

    // Stream-ordered calls (cuda_client.cpp; DESIGN.md, "Stream-ordered calls").
    tl_status writeOnStream(const tl_write_desc &w, void *stream, tl_ticket *out);
    tl_status streamWaitTicket(tl_ticket t, void *stream);
    tl_status streamWaitNotification(tl_region r, uint32_t imm, void *stream);

private:
    struct LocalRegion {
        unsigned char *base = nullptr;
        uint64_t bytes = 0;
        tl_region parent = 0;  ///< 0: a tl_alloc_host buffer itself (or CUDA memory)
        bool cuda = false;
        uint64_t cuda_key = 0;  ///< its allocation's CUDA buffer id
    };
    struct HostBuffer {
        tl_region region = 0;
        std::unique_ptr<ipc::Mapping> mapping;
        bool pinned = false;  ///< registered with CUDA (cuMemHostRegister)
    };

    /// One control call: send `msg` (with `send_fd` if >= 0), wait for the reply with the same
    /// sequence number.
    Code call(void *msg, size_t bytes, ipc::ReplyMsg *reply, ipc::UniqueFd *fd_out,
              std::string *text_out = nullptr, int send_fd = -1);
    /// tl_register of device memory (cuda_client.cpp).
    tl_status registerCuda(void *ptr, size_t bytes, tl_region *out);
    /// Creates the stream segment on first use and starts the keeper. TL_OK when it exists.
    tl_status ensureStreams();
    /// The keeper thread: releases every waiting stream when the sidecar goes away.
    void keepStreams();
    /// Rings the sidecar's doorbell after publishing requests, if it sleeps.
    void ringSidecar();
    tl_status submit(ipc::Request *reqs, size_t n, tl_ticket *out, size_t *submitted);
    bool validWrite(const tl_write_desc &w, std::string *why) const;
    /// Moves completions and notifications from the rings into private tables (comp_mu_ held);
    /// rings the sidecar when it freed slots while the sidecar sleeps. `all`: every
    /// notification in the ring, past the usual bound on notes_ (a subscription's count).
    void drainLocked(bool all = false);
    /// Notifications kept in notes_ at most (the rest wait in the ring).
    size_t maxNotes() const { return size_t{4} * depth_; }
    /// Blocks until the rings may have news, the sidecar goes away, or `deadline` passes.
    /// Returns true when the sidecar hung up.
    bool waitForActivity(std::chrono::steady_clock::time_point deadline);
    /// dead_, or a hang-up seen on the socket; the syscall runs at most once a millisecond so
    /// a polling tl_test loop stays cheap (comp_mu_ held).
    bool sidecarGone();
    /// One turn of waiting (comp_mu_ held via `lock`): the first waiter sleeps on the doorbell,
    /// the others on comp_cv_ until it has drained what arrived.
    void waitTurn(std::unique_lock<std::mutex> &lock,
                  std::chrono::steady_clock::time_point deadline);
    /// Grows or resets the adaptive spin window after a sleep (the polling thread only).
    void adaptSpin(std::chrono::steady_clock::duration slept, bool woke_with_news);
    void markDead(const std::string &why);
    bool sidecarHungUp();
    /// Whether a slot the polling thread watches has changed since waitTurn() looked (any
    /// thread may drain the rings meanwhile, so "changed" and not "ready" is the news).
    bool ringsChanged() const;

    // The connection and the segment (set once by connect()).
    ipc::UniqueFd sock_;
    ipc::UniqueFd to_sidecar_;
    ipc::UniqueFd to_client_;
    ipc::Mapping segment_;
    ipc::SegmentView view_;
    std::string node_name_;
    uint32_t poll_mode_ = 1;
    uint32_t spin_us_ = 50;
    uint32_t spin_window_us_ = 50;  ///< adaptive mode's current spin (only the poller uses it)
    uint32_t depth_ = 0;

    // One lock for both sides: a write takes a ticket-table entry and a request slot together,
    // and one lock round trip per call is what the no-op round trip can afford.
    std::mutex comp_mu_;

    // Producer side of the request ring (comp_mu_ held).
    ipc::RingProducer<ipc::Request> requests_;
    uint64_t next_ticket_ = 1;

    // Consumer side of the completion and notification rings.
    std::condition_variable comp_cv_;
    bool polling_ = false;  ///< one thread sleeps on the doorbell, the others on comp_cv_
    std::chrono::steady_clock::time_point last_hangup_check_{};
    ipc::RingConsumer<ipc::Completion> completions_;
    ipc::RingConsumer<ipc::Notification> notifications_;
    /// The next completion and notification slots as waitTurn() saw them: position and
    /// sequence word (polling_ thread only).
    struct SlotWatch {
        uint64_t pos = 0;
        uint64_t word = 0;
    };
    tl_status waitNotificationEx(tl_notification_ex *out, int timeout_ms, const char *what);

    SlotWatch comp_watch_;
    SlotWatch notif_watch_;
    TicketTable tickets_;
    std::deque<tl_notification_ex> notes_;
    std::atomic<bool> dead_{false};
    std::string dead_reason_;

    // Control calls.
    std::mutex ctl_mu_;
    uint64_t ctl_seq_ = 1;

    // Regions and remotes, for validating requests before they reach the ring.
    mutable std::shared_mutex reg_mu_;
    std::unordered_map<tl_region, LocalRegion> regions_;
    std::map<uintptr_t, HostBuffer> buffers_;          ///< by base address
    std::unordered_map<tl_remote, uint64_t> remotes_;  ///< handle → bytes

    // CUDA (cuda_client.cpp).
    std::mutex cuda_mu_;                      ///< serialises CUDA registrations and stream setup
    CudaExports cuda_exports_;                ///< cuda_mu_
    std::unique_ptr<ClientStreams> streams_;  ///< comp_mu_ (set once)
    std::atomic<bool> streams_ready_{false};
    ipc::UniqueFd keeper_stop_;
    std::thread keeper_;
};

}  // namespace tensorlane::shim
