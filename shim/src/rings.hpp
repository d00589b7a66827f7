// The client's side of its session segment: the request ring it produces into, the completion
// and notification rings it consumes, the doorbell it rings when the sidecar sleeps, and the
// process-private tables the rings drain into (tickets and how they ended, notifications not
// yet taken). One lock guards all of it: a write takes a ticket-table entry and a request slot
// together, and one lock round trip per call is what the no-op round trip can afford.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "cuda_streams.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/status.hpp"
#include "tensorlane/tensorlane.h"
#include "ticket_table.hpp"

namespace tensorlane::shim {

using ipc::Code;
class ControlChannel;

/// The stream half of a gated write (tl_write_on_stream): what submit() has queued on the
/// caller's stream before the request is published.
class StreamGate {
public:
    /// Queues the store of `ticket` into the gate word at `gate_address` (a device address);
    /// anything but TL_OK (tl_last_error set) and the request is not submitted.
    virtual tl_status enqueue(uint64_t gate_address, uint32_t ticket) = 0;
    virtual ~StreamGate() = default;
};

class Rings {
public:
    /// `control` says whether the connection is dead; it outlives the rings.
    explicit Rings(ControlChannel &control) : control_(control) {}

    /// Maps the session segment (`segment_bytes` as the greeting announced) and sets up the
    /// three rings; `to_sidecar` is the sidecar's doorbell. On failure tl_last_error says why.
    Code open(ipc::UniqueFd segment, uint64_t segment_bytes, ipc::UniqueFd to_sidecar);

    /// The request ring's depth: at most this many tickets are outstanding.
    uint32_t depth() const { return depth_; }
    /// The segment's header (the two sleep flags).
    ipc::SegmentHeader &header() const { return *view_.header; }

    /// The one way requests enter the ring: gives each a ticket (into `out`), a stream slot
    /// when the client has a stream segment, publishes them and rings the sidecar; `*submitted`
    /// (may be null) says how many went in. Fewer than `n`: TL_EAGAIN when depth() are
    /// outstanding, TL_ECONN when the ring is corrupt. With a `gate`, each request is a gated
    /// write: it needs a slot, and `gate` queues the slot's gate store before it is published.
    /// `hook` (may be null): given to the first request's ticket (see TicketHook).
    using TicketHook = std::function<void(int32_t status)>;
    tl_status submit(ipc::Request *reqs, size_t n, tl_ticket *out, size_t *submitted,
                     StreamGate *gate = nullptr, TicketHook *hook = nullptr);
    /// Called once, with the mutex() held, when a hooked ticket ends (its completion drained,
    /// or failPendingLocked()); it must not take the mutex() or call into the rings.
    /// (A hook is set under the same lock that gives the ticket, so no thread can drain its
    /// completion first.)
    /// Ends every pending ticket with `status` (the sidecar is gone), hooks included
    /// (mutex() held).
    void failPendingLocked(int32_t status);

    /// The lock of everything below.
    std::mutex &mutex() { return mu_; }
    /// Moves completions and notifications from the rings into the private tables (mutex()
    /// held); rings the sidecar when it freed slots while the sidecar sleeps. `all`: every
    /// notification in the ring, past the usual bound on notes() (a subscription's count).
    void drainLocked(bool all = false);
    /// Tickets issued and how they ended (mutex() held).
    TicketTable &tickets() { return tickets_; }
    /// Notifications drained and not yet taken (mutex() held).
    std::deque<tl_message> &notes() { return notes_; }

    /// The stream segment, once the client has one (mutex() held; set once).
    ClientStreams *streams() const { return streams_.get(); }
    /// Sets the stream segment (takes mutex()).
    void setStreams(std::unique_ptr<ClientStreams> streams);
    /// Releases the stream segment (no other thread may use the rings any more).
    void resetStreams() { streams_.reset(); }

    /// The next completion and notification slots as a waiter saw them: position and sequence
    /// word.
    struct SlotWatch {
        uint64_t pos = 0;
        uint64_t word = 0;
    };
    struct Watch {
        SlotWatch completion;
        SlotWatch notification;
    };
    /// Where the consumers stand now (mutex() held).
    Watch watch() const;
    /// Whether a slot `w` watches has changed since (any thread may drain the rings
    /// meanwhile, so "changed" and not "ready" is the news). Needs no lock; inline, as the
    /// waiter's spin calls it.
    bool changedSince(const Watch &w) const {
        // Only the slots' sequence words, never the cursors: reading a word the sidecar has not
        // written since is a hit in our cache, so the spin costs the sidecar nothing.
        auto changed = [](const auto &ring, const SlotWatch &s) {
            const uint64_t now = ring.sequenceAt(s.pos);
            return now != s.word || now == s.pos + 1;
        };
        return changed(completions_, w.completion) || changed(notifications_, w.notification);
    }

private:
    /// Rings the sidecar's doorbell after publishing requests, if it sleeps.
    void ringSidecar();
    /// Notifications kept in notes_ at most (the rest wait in the ring).
    size_t maxNotes() const { return size_t{4} * depth_; }

    ControlChannel &control_;
    // The segment and the sidecar's doorbell (set once by open()).
    ipc::Mapping segment_;
    ipc::SegmentView view_;
    ipc::UniqueFd to_sidecar_;
    uint32_t depth_ = 0;

    std::mutex mu_;
    // Producer side of the request ring.
    ipc::RingProducer<ipc::Request> requests_;
    uint64_t next_ticket_ = 1;
    // Consumer side of the completion and notification rings.
    ipc::RingConsumer<ipc::Completion> completions_;
    ipc::RingConsumer<ipc::Notification> notifications_;
    TicketTable tickets_;
    std::deque<tl_message> notes_;
    /// Tickets with a hook (kWriteEx requests), until they end.
    std::unordered_map<uint64_t, TicketHook> hooks_;

    std::unique_ptr<ClientStreams> streams_;
};

}  // namespace tensorlane::shim
