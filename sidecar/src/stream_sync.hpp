// The sidecar's side of the stream-ordered calls (docs/gpu.md): one session's stream segment
// (ipc/layout.hpp), the gated writes held until the client's GPU stream opens their gate, and
// the subscriptions of tl_stream_wait_notification. No CUDA here: the client's GPU reads and
// writes this shared memory, the sidecar only loads and stores words in it.
//
// Everything runs on the engine thread. Every word of the segment may have been changed by the
// client: values read from it are only ever compared, never used as sizes or indices.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/sidecar/status.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

class SessionStreams {
public:
    /// Creates the segment for a session with `ring_depth` (owned by uid/gid, sealed); `*fd`
    /// gets the fd to send.
    static std::unique_ptr<SessionStreams> create(uint32_t ring_depth, uid_t uid, gid_t gid,
                                                  ipc::UniqueFd *fd, std::string *error);

    uint32_t ticketSlots() const { return geometry_.ticket_slots; }
    bool validSlot(uint32_t slot) const { return slot < geometry_.ticket_slots; }

    /// A request with a slot ended: its status, then the ticket (release) for the streams in
    /// tl_stream_wait_ticket. Called before its completion is queued.
    void ended(uint32_t slot, uint64_t ticket, Code status);

    /// Holds an accepted gated write until its gate reaches `ticket`'s low 32 bits.
    void hold(WriteOp op, uint32_t slot, uint64_t ticket);
    /// Writes whose gate opened since the last call, in the order they were held.
    std::vector<WriteOp> opened();
    /// Every write still held (the session is closing); the list is emptied.
    std::vector<WriteOp> takeHeld();
    size_t held() const { return held_.size(); }

    /// Starts counting notifications for (region, imm); `*slot` names its NotifySlot. A second
    /// subscription to the same pair gets the same slot.
    Status subscribe(RegionId region, uint32_t imm, uint32_t *slot);
    /// Notifications for a subscription that reached the client before it subscribed.
    void credit(uint32_t slot, uint32_t count);
    /// A notification for (region, imm): true when a subscription takes it (then it does not
    /// go to the notification ring).
    bool divert(RegionId region, uint32_t imm);
    /// The region is gone: its subscriptions release the streams waiting on them, for as long
    /// as the session lives (a stream must never wait for a region that can no longer be
    /// written).
    void regionReleased(RegionId region);
    /// Hands over counted notifications whose flag the GPU has consumed; returns hand-overs.
    size_t pollNotify();

    /// Whether something waits on the GPU to move (a held gate, a hand-over): the engine keeps
    /// looking for a while instead of sleeping.
    bool urgent() const { return !held_.empty() || pending_handovers_ != 0; }
    /// Subscriptions that release forever (deregistered regions); looked at, never urgent.
    bool releasing() const { return releasing_ != 0; }

private:
    struct Held {
        WriteOp op;
        uint32_t slot = 0;
        uint32_t gate = 0;  ///< the ticket's low 32 bits
    };
    struct Subscription {
        RegionId region = 0;
        uint32_t imm = 0;
        bool used = false;
        bool released = false;  ///< region gone: hand over forever
        uint64_t pending = 0;   ///< counted, not yet handed over
    };

    SessionStreams() = default;
    /// Stores 1 into the slot's flag when the GPU has consumed the last one (it reads 0).
    bool handOver(uint32_t slot);

    ipc::StreamGeometry geometry_;
    ipc::Mapping mapping_;
    ipc::StreamView view_;
    std::vector<Held> held_;
    std::vector<Subscription> subs_;
    std::map<std::pair<RegionId, uint32_t>, uint32_t> sub_of_;
    std::vector<uint32_t> used_;      ///< slots in use, in the order they were taken
    uint64_t pending_handovers_ = 0;  ///< subscriptions with pending > 0 (not released)
    uint64_t releasing_ = 0;
};

}  // namespace tensorlane::sidecar
