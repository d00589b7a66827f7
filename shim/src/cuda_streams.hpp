// The client's side of the stream-ordered calls (docs/gpu.md): its stream segment, mapped and
// registered with the CUDA driver so GPU streams can store into it and wait on it, the slot of
// each pending write, and the subscriptions of tl_stream_wait_notification.
//
// Not thread-safe: the Client calls it with its completion lock held.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/ipc/layout.hpp"
#include "tensorlane/ipc/shm.hpp"
#include "tensorlane/ipc/status.hpp"

namespace tensorlane::shim {

class ClientStreams {
public:
    /// Maps the segment behind `fd` and registers it with CUDA (portable, device-mapped).
    static ipc::Code open(ipc::UniqueFd fd, uint32_t ring_depth,
                          std::unique_ptr<ClientStreams> *out, std::string *why);
    /// Releases every waiting stream; if a stream operation ever referred to the segment, the
    /// mapping stays for the life of the process (a stream may still reach such an operation
    /// later, and must then read released flags, never unmapped memory).
    ~ClientStreams();
    ClientStreams(const ClientStreams &) = delete;
    ClientStreams &operator=(const ClientStreams &) = delete;

    /// A slot for a new ticket (reset to ticket - 1, so no stale value satisfies it). False when
    /// none is free.
    bool takeSlot(uint64_t ticket, bool gated, uint16_t *slot);
    /// Gives back a slot taken for a request that was not submitted after all.
    void untake(uint16_t slot, uint64_t ticket);
    /// The ticket ended (its completion was read): its slot is free again, or, for a gated
    /// write whose stream has not reached the gate yet, once it has.
    void ticketEnded(uint64_t ticket);
    /// The slot of a pending ticket.
    bool slotOf(uint64_t ticket, uint16_t *slot) const;

    /// Device addresses of a slot's words, for cuStreamWriteValue32 / cuStreamWaitValue32.
    uint64_t gateAddress(uint16_t slot) const;
    uint64_t doneAddress(uint16_t slot) const;
    uint64_t notifyAddress(uint32_t slot) const;

    bool subscription(uint64_t region, uint32_t imm, uint32_t *slot) const;
    void addSubscription(uint64_t region, uint32_t imm, uint32_t slot);
    /// The region was deregistered (the sidecar releases its waits).
    void dropRegion(uint64_t region);

    /// The sidecar is gone or the client disconnects: every stream waiting on a pending ticket
    /// or a subscription goes on (the data it waited for is not there; tl_wait says why).
    void releaseAll();
    /// After releaseAll: hands the notification flags back out as streams consume them, so
    /// later waits on them pass too.
    void rearm();
    /// A stream operation refers to the segment now.
    void noteEnqueued() { used_ = true; }

private:
    ClientStreams() = default;
    uint64_t deviceAddress(const void *host) const;

    ipc::Mapping mapping_;
    ipc::StreamGeometry geometry_;
    ipc::StreamView view_;
    uint64_t device_base_ = 0;
    bool registered_ = false;
    bool used_ = false;
    std::vector<uint16_t> free_;
    struct Quarantined {
        uint16_t slot;
        uint32_t gate;
    };
    std::vector<Quarantined> quarantine_;
    struct Pending {
        uint16_t slot;
        bool gated;
    };
    std::unordered_map<uint64_t, Pending> pending_;  ///< by ticket
    std::map<std::pair<uint64_t, uint32_t>, uint32_t> subs_;
    std::vector<uint32_t> sub_slots_;  ///< every subscription slot ever used
};

}  // namespace tensorlane::shim
