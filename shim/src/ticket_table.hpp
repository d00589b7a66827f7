// Tickets issued by one client and how they ended, until a wait consumes them.
//
// Tickets are sequential and at most `depth` are pending at once (the shim enforces it), so a
// direct-mapped window of 4 * depth slots indexed by the ticket's low bits holds every pending
// ticket without collisions: every operation is O(1). A finished ticket that nobody waited for
// is moved to an overflow map when its slot is needed again, so it is never lost.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace tensorlane::shim {

class TicketTable {
public:
    static constexpr int32_t kPending = -1;
    static constexpr int32_t kUnknown = -2;

    explicit TicketTable(size_t depth = 1024) {
        size_t w = 64;
        while (w < depth * 4) {
            w <<= 1;
        }
        slots_.resize(w);
        mask_ = w - 1;
    }

    /// Adds a pending ticket (sequential, never 0).
    void addPending(uint64_t t) {
        Slot &s = slots_[t & mask_];
        if (s.ticket != 0) {
            // An older ticket that ended and was never waited for: keep it aside.
            overflow_[s.ticket] = s.state;
        }
        s = Slot{t, kPending};
        ++pending_;
    }
    /// Records how a pending ticket ended. False if it was not pending (a bogus completion).
    bool complete(uint64_t t, int32_t status) {
        Slot &s = slots_[t & mask_];
        if (s.ticket != t || s.state != kPending) {
            return false;
        }
        s.state = status;
        --pending_;
        return true;
    }
    /// kPending, a status, or kUnknown.
    int32_t state(uint64_t t) const {
        const Slot &s = slots_[t & mask_];
        if (s.ticket == t && t != 0) {
            return s.state;
        }
        auto it = overflow_.find(t);
        return it == overflow_.end() ? kUnknown : it->second;
    }
    /// Forgets a ticket (after its status was returned).
    void erase(uint64_t t) {
        Slot &s = slots_[t & mask_];
        if (s.ticket == t && t != 0) {
            if (s.state == kPending) {
                --pending_;
            }
            s = Slot{};
            return;
        }
        overflow_.erase(t);
    }
    /// Ends every pending ticket with `status` (the sidecar is gone).
    void failPending(int32_t status) {
        for (Slot &s : slots_) {
            if (s.ticket != 0 && s.state == kPending) {
                s.state = status;
            }
        }
        pending_ = 0;
    }
    size_t pending() const { return pending_; }

private:
    struct Slot {
        uint64_t ticket = 0;
        int32_t state = 0;
    };
    std::vector<Slot> slots_;
    uint64_t mask_ = 0;
    size_t pending_ = 0;
    std::unordered_map<uint64_t, int32_t> overflow_;
};

}  // namespace tensorlane::shim
