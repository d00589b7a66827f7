#include "rings.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>

#include "control_channel.hpp"
#include "last_error.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::shim {

Code Rings::open(ipc::UniqueFd segment, uint64_t segment_bytes, ipc::UniqueFd to_sidecar) {
    uint64_t size = ipc::segmentSize(segment.get());
    if (size < segment_bytes || segment_bytes == 0) {
        setLastErrorText("session segment smaller than announced");
        return Code::kConnection;
    }
    if (int mrc = ipc::mapSegment(segment.get(), segment_bytes, &segment_)) {
        setLastErrorText(std::string("mmap of the session segment: ") + std::strerror(mrc));
        return Code::kNoMemory;
    }
    ipc::SegmentGeometry g;
    if (!ipc::validateSegment(segment_.data(), segment_.size(), &g)) {
        setLastErrorText("session segment has a bad magic, version or geometry");
        return Code::kConnection;
    }
    view_ = ipc::SegmentView::at(segment_.data(), g);
    requests_ = ipc::RingProducer<ipc::Request>(view_.request_ctl, view_.requests, g.request_depth);
    completions_ = ipc::RingConsumer<ipc::Completion>(view_.completion_ctl, view_.completions,
                                                      g.completion_depth);
    notifications_ = ipc::RingConsumer<ipc::Notification>(
        view_.notification_ctl, view_.notifications, g.notification_depth);
    to_sidecar_ = std::move(to_sidecar);
    depth_ = g.request_depth;
    tickets_ = TicketTable(depth_);
    return Code::kOk;
}

void Rings::setStreams(std::unique_ptr<ClientStreams> streams) {
    std::lock_guard lock(mu_);
    streams_ = std::move(streams);
}

tl_status Rings::submit(ipc::Request *reqs, size_t n, tl_ticket *out, size_t *submitted,
                        StreamGate *gate, TicketHook *hook) {
    size_t k = 0;
    bool corrupt = false;
    tl_status gate_failed = TL_OK;
    {
        std::lock_guard lock(mu_);
        if (control_.dead()) {
            return fail(Code::kConnection, "sidecar connection lost: " + control_.deadReason());
        }
        // At most `depth` tickets outstanding, so the sidecar's completion ring never has to
        // hold more than it can.
        if (tickets_.pending() + n > depth_) {
            drainLocked();
        }
        size_t room = depth_ > tickets_.pending() ? depth_ - tickets_.pending() : 0;
        const size_t fit = std::min<size_t>(
            {n, room, requests_.freeSlots(static_cast<uint32_t>(std::min<size_t>(n, depth_)))});
        for (; k < fit; ++k) {
            ipc::Request &r = reqs[k];
            uint16_t slot = 0;
            if (gate != nullptr) {
                // A gated write needs its slot, and its gate store queued on the stream before
                // the request is published: a failure leaves nothing behind.
                if (!streams_ || !streams_->takeSlot(next_ticket_, true, &slot)) {
                    break;
                }
                gate_failed =
                    gate->enqueue(streams_->gateAddress(slot), static_cast<uint32_t>(next_ticket_));
                if (gate_failed != TL_OK) {
                    streams_->untake(slot, next_ticket_);
                    break;
                }
                streams_->noteEnqueued();
                r.slot = slot;
            } else if (streams_ &&
                       (r.op == static_cast<uint8_t>(ipc::Op::kWrite) ||
                        r.op == static_cast<uint8_t>(ipc::Op::kWriteEx)) &&
                       streams_->takeSlot(next_ticket_, false, &slot)) {
                // Once the client has a stream segment every write gets a slot, so that
                // tl_stream_wait_ticket works on any ticket (the sidecar stores the ticket there
                // when the write ends). Without a free slot it goes without one.
                r.flags = ipc::kRequestHasSlot;
                r.slot = slot;
            }
            r.ticket = next_ticket_;
            out[k] = next_ticket_;
            (void)requests_.push(r);  // freeSlots() said there is room
            if (hook != nullptr && k == 0) {
                hooks_.emplace(next_ticket_, std::move(*hook));
            }
            tickets_.addPending(next_ticket_++);
        }
        if (k > 0) {
            requests_.publish();  // under the lock: it publishes every entry pushed so far
        }
        corrupt = requests_.corrupt();
    }
    if (submitted) {
        *submitted = k;
    }
    if (k > 0) {
        ringSidecar();
    }
    if (k < n) {
        if (gate_failed != TL_OK) {
            return gate_failed;  // its reason is in tl_last_error
        }
        if (corrupt) {
            return fail(Code::kConnection, "request ring corrupted");
        }
        return fail(Code::kAgain,
                    std::to_string(depth_) + " requests outstanding; wait on a ticket and retry");
    }
    return TL_OK;
}

void Rings::ringSidecar() {
    // SYNC POINT: seq_cst fence between publishing the slots and reading sidecar_sleeping;
    // pairs with the fence in the sidecar's armSleep() (Dekker): one of us sees the other.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (view_.header->sidecar_sleeping.value.load(std::memory_order_relaxed) != 0) {
        ipc::ring(to_sidecar_.get());
    }
}

void Rings::drainLocked(bool all) {
    uint32_t released = 0;
    uint32_t n = completions_.available();
    for (uint32_t i = 0; i < n; ++i) {
        ipc::Completion c = completions_.read(i);
        const auto status = static_cast<int32_t>(ipc::sanitizeCode(c.status));
        if (!hooks_.empty()) {
            if (auto h = hooks_.find(c.ticket);
                h != hooks_.end() && tickets_.state(c.ticket) == TicketTable::kPending) {
                TicketHook hook = std::move(h->second);
                hooks_.erase(h);
                hook(status);
            }
        }
        tickets_.complete(c.ticket, status);
        if (streams_) {
            streams_->ticketEnded(c.ticket);
        }
    }
    if (n) {
        completions_.release(n);
        released += n;
    }
    // Notifications are kept here until tl_wait_notification takes them, but only so many:
    // beyond that they stay in the ring, the ring fills, and the sidecar's bounded backlog
    // for this client takes over (past [limits] notification_backlog it drops notifications
    // and counts them in the next one delivered: tl_notification_ex.dropped). The process
    // never grows without bound because its code forgot to wait for notifications.
    n = notifications_.available();
    if (!all && notes_.size() + n > maxNotes()) {
        n = notes_.size() < maxNotes() ? static_cast<uint32_t>(maxNotes() - notes_.size()) : 0;
    }
    for (uint32_t i = 0; i < n; ++i) {
        const ipc::Notification in = notifications_.read(i);
        tl_message &out = notes_.emplace_back();
        out.ex.n.region = in.region;
        out.ex.n.imm = in.imm;
        out.ex.n.offset = in.offset;
        out.ex.n.bytes = in.bytes;
        std::memcpy(out.ex.n.peer, in.peer, sizeof(out.ex.n.peer));
        out.ex.n.peer[sizeof(out.ex.n.peer) - 1] = '\0';
        out.ex.writer_uid = in.writer_uid;
        // The sidecar's count of notifications it dropped for this client before this one.
        out.ex.dropped = in.dropped;
        out.kind = in.kind;
        out.status = static_cast<tl_status>(ipc::sanitizeCode(in.status));
        out.entries = in.entries;
        // The payload sits in the slab at the entry's ring position, written before the entry
        // was published (so the acquire of its sequence word covers it).
        out.payload_bytes = std::min<uint32_t>(in.payload_bytes, ipc::kPayloadSlotBytes);
        if (out.payload_bytes != 0) {
            const uint64_t pos = notifications_.head() + i;
            std::memcpy(out.payload, view_.payloads + (pos % depth_) * ipc::kPayloadSlotBytes,
                        out.payload_bytes);
        }
    }
    if (n) {
        notifications_.release(n);
        released += n;
    }
    if (released != 0) {
        // SYNC POINT: seq_cst fence between releasing slots and reading sidecar_sleeping; pairs
        // with the fence in the sidecar's armSleep(), which raises the flag and then looks at
        // our heads for room for a backlog it holds (Dekker). Without this ring a sidecar with
        // a backlog for us would sleep until its idle tick although we made room.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (view_.header->sidecar_sleeping.value.load(std::memory_order_relaxed) != 0) {
            ipc::ring(to_sidecar_.get());
        }
    }
}

void Rings::failPendingLocked(int32_t status) {
    for (auto &[ticket, hook] : hooks_) {
        if (tickets_.state(ticket) == TicketTable::kPending) {
            hook(status);
        }
    }
    hooks_.clear();
    tickets_.failPending(status);
}

Rings::Watch Rings::watch() const {
    Watch w;
    w.completion.pos = completions_.head();
    w.completion.word = completions_.sequenceAt(w.completion.pos);
    w.notification.pos = notifications_.head();
    w.notification.word = notifications_.sequenceAt(w.notification.pos);
    return w;
}

}  // namespace tensorlane::shim
