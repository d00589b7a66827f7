// One connected client: its socket, its shared-memory segment with the three rings, its
// doorbells, and what it has looked up. Owned by the engine; only the engine thread touches it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/vmm_piece.hpp"
#include "stream_sync.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/socket.hpp"
#include "tensorlane/sidecar/region.hpp"
#include "tensorlane/sidecar/transport.hpp"

namespace tensorlane::sidecar {

/// A region of a peer (or of this node) that a client looked up; tl_remote indexes these.
struct RemoteRef {
    PeerId peer = kLocalPeer;
    RegionId region = 0;
    uint64_t bytes = 0;
    /// The peer's probe region (kProbeRegionName, what `tensorlane diag` writes): its writes
    /// are counted as probes_sent, not as the node's writes and traffic.
    bool probe = false;
};

struct SessionCounters {
    uint64_t requests = 0;
    uint64_t completions = 0;
    uint64_t notifications = 0;
    uint64_t notifications_dropped = 0;  ///< past notification_bound ([limits])
    uint64_t rejected = 0;
    uint64_t bytes_written = 0;
};

struct Session {
    SessionId id = 0;
    ipc::PeerCred cred;
    /// Its primary gid and supplementary groups as the kernel recorded them at connect()
    /// (SO_PEERGROUPS): what exposed regions' gid lists and reserved names are checked against.
    std::vector<uint32_t> groups;
    ipc::UniqueFd sock;
    ipc::UniqueFd to_sidecar;  ///< the client rings it after publishing requests
    ipc::UniqueFd to_client;   ///< we ring it after publishing completions/notifications
    ipc::SharedSegment segment;
    ipc::SegmentView view;
    ipc::RingConsumer<ipc::Request> requests;
    ipc::RingProducer<ipc::Completion> completions;
    ipc::RingProducer<ipc::Notification> notifications;
    /// Entries that did not fit in the client's rings (a slow client); bounded.
    std::deque<ipc::Completion> completion_backlog;
    /// A notification waiting for room in the ring, with its payload (most have none).
    struct QueuedNotification {
        ipc::Notification n;
        std::vector<uint8_t> payload;
    };
    std::deque<QueuedNotification> notification_backlog;
    /// Most entries of notification_backlog ([limits] notification_backlog). Other clients'
    /// writes fill it, so past it notifications are dropped and counted, never the session
    /// closed: a writer must not be able to disconnect the target.
    size_t notification_bound = kMaxBacklog;
    /// Dropped since the last one that entered the ring: the next one to enter carries it.
    uint64_t dropped_pending = 0;
    /// The status document being read page by page (ipc::StatusMsg); empty between reads.
    std::string status_snapshot;
    std::unordered_map<uint64_t, RemoteRef> remotes;
    /// The handle already given out for a (peer, region): a lookup repeated in a loop reuses
    /// it instead of growing `remotes`.
    std::map<std::pair<PeerId, RegionId>, uint64_t> remote_of;
    uint64_t next_remote = 1;
    /// A handle for `ref` (reused when it exists). 0 when the session holds `max` already.
    uint64_t remoteHandle(const RemoteRef &ref, size_t max) {
        const auto key = std::make_pair(ref.peer, ref.region);
        if (auto it = remote_of.find(key); it != remote_of.end()) {
            remotes[it->second] = ref;  // the size may have changed
            return it->second;
        }
        if (remotes.size() >= max) {
            return 0;
        }
        const uint64_t h = next_remote++;
        remotes[h] = ref;
        remote_of[key] = h;
        return h;
    }
    uint64_t in_flight = 0;            ///< accepted requests not yet completed
    uint64_t ex_parts = 0;             ///< parts of its kWriteEx requests in flight
    uint64_t host_bytes = 0;           ///< bytes of its tl_alloc_host buffers ([limits])
    uint64_t mappings = 0;             ///< segments of its the sidecar maps (session included)
    bool published = false;            ///< rings advanced since the last doorbell check
    bool completions_dirty = false;    ///< the completion ring has unpublished entries
    bool notifications_dirty = false;  ///< the notification ring has unpublished entries
    bool closing = false;
    uint32_t publishes = 0;  ///< counts publish() calls, to pace the head checks
    std::string close_reason;
    SessionCounters counters;
    /// Stream-ordered calls (created by the client's first one; docs/gpu.md).
    std::unique_ptr<SessionStreams> streams;
    /// The CUDA allocations this client exported, by its key (the allocation's CUDA buffer id):
    /// a second region in one of them reuses the import. Weak: the regions own it.
    std::unordered_map<uint64_t, std::weak_ptr<CudaImport>> cuda_allocs;
    /// VMM pieces (with their fds) staged by kVmmPieces for the registration that follows, by
    /// its key; that registration takes them, whether it succeeds or not.
    std::unordered_map<uint64_t, std::vector<VmmPieceFd>> vmm_staged;
    size_t vmm_staged_pieces = 0;  ///< over every key (at most ipc::kMaxVmmPieces)

    /// Writes a completion (or backlogs it). False when the backlog bound is exceeded.
    bool complete(uint64_t ticket, Code status, uint64_t bytes);
    /// Writes a notification (or backlogs it). False when the backlog is full: it was dropped
    /// and counted, and the next one to reach the ring says how many were.
    bool notify(const ipc::Notification &n, std::span<const uint8_t> payload = {});
    /// Moves backlog into the rings as space allows; publishes; returns entries moved.
    size_t flushBacklog();
    /// Publishes rings and rings the client's doorbell if it sleeps.
    void publish();

    /// Most completions kept for a client that does not drain its ring (its own requests'),
    /// and the most notification_bound may be.
    static constexpr size_t kMaxBacklog = 1u << 20;
    /// Every this many publishes (and on the first) the client-owned heads are validated even
    /// when the rings have room; in between, a head is read only when a ring looks full.
    static constexpr uint32_t kHeadCheckEvery = 64;

private:
    /// Pushes `n` into the ring with the pending drop count, its payload into the slab slot of
    /// its ring position first; false when the ring is full.
    bool pushNotification(ipc::Notification n, std::span<const uint8_t> payload);
};

}  // namespace tensorlane::sidecar
