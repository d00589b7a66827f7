// Tickets issued by one client and how they ended, until a wait consumes them.
//
// Tickets are sequential and at most `depth` are pending at once (the shim enforces it), so a
// direct-mapped window of 4 * depth slots indexed by the ticket's low bits holds nearly every
// ticket: the common operations are O(1) array accesses. A slot can still be needed again while
// its ticket lives on: a finished ticket nobody waited for, or a long write that short writes
// overtook by more than the window (one 512 MiB write and 70 no-ops at depth 16). Such a ticket
// moves to the overflow map, pending or not, and every operation looks there too, so a ticket is
// never lost and a pending one is never evicted: its completion, or the failure of everything
// pending when the sidecar goes, still finds it.
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
            // An older ticket still lives in this slot (finished and not waited for, or still
            // pending): keep it aside, exactly as it is.
            overflow_[s.ticket] = s.state;
        }
        s = Slot{t, kPending};
        ++pending_;
    }
    /// Records how a pending ticket ended. False if it was not pending (a bogus completion).
    bool complete(uint64_t t, int32_t status) {
        int32_t *state = find(t);
        if (state == nullptr || *state != kPending) {
            return false;
        }
        *state = status;
        --pending_;
        return true;
    }
    /// kPending, a status, or kUnknown.
    int32_t state(uint64_t t) const {
        const Slot &s = slots_[t & mask_];
        if (s.ticket == t && t != 0) {
            return s.state;
        }
        if (overflow_.empty()) {
            return kUnknown;
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
        auto it = overflow_.find(t);
        if (it != overflow_.end()) {
            if (it->second == kPending) {
                --pending_;
            }
            overflow_.erase(it);
        }
    }
    /// Ends every pending ticket with `status` (the sidecar is gone).
    void failPending(int32_t status) {
        for (Slot &s : slots_) {
            if (s.ticket != 0 && s.state == kPending) {
                s.state = status;
            }
        }
        for (auto &[ticket, state] : overflow_) {
            if (state == kPending) {
                state = status;
            }
        }
        pending_ = 0;
    }
    size_t pending() const { return pending_; }
    /// Tickets kept aside (tests and diagnostics).
    size_t overflowed() const { return overflow_.size(); }

private:
    struct Slot {
        uint64_t ticket = 0;
        int32_t state = 0;
    };
    int32_t *find(uint64_t t) {
        Slot &s = slots_[t & mask_];
        if (s.ticket == t && t != 0) {
            return &s.state;
        }
        if (overflow_.empty()) {
            return nullptr;
        }
        auto it = overflow_.find(t);
        return it == overflow_.end() ? nullptr : &it->second;
    }

    std::vector<Slot> slots_;
    uint64_t mask_ = 0;
    size_t pending_ = 0;
    std::unordered_map<uint64_t, int32_t> overflow_;
};

}  // namespace tensorlane::shim
