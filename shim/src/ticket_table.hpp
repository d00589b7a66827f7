// Tickets issued by one client and how they ended, until a wait consumes them. Tickets are
// sequential, so an open-addressed table indexed by the ticket's low bits has no collisions in
// the common case; linear probing and backward-shift deletion cover the rest.
#pragma once

#include <cstdint>
#include <vector>

namespace tensorlane::shim {

class TicketTable {
public:
    static constexpr int32_t kPending = -1;

    explicit TicketTable(size_t capacity = 1024) { slots_.resize(roundUp(capacity * 2)); }

    /// Adds a pending ticket (never 0).
    void addPending(uint64_t t) {
        if ((size_ + 1) * 2 > slots_.size()) {
            grow();
        }
        insert(t, kPending);
        ++pending_;
    }
    /// Records how a pending ticket ended. False if it was not pending (a bogus completion).
    bool complete(uint64_t t, int32_t status) {
        Slot *s = find(t);
        if (!s || s->state != kPending) {
            return false;
        }
        s->state = status;
        --pending_;
        return true;
    }
    /// kPending, a status, or -2 when unknown.
    int32_t state(uint64_t t) const {
        const Slot *s = const_cast<TicketTable *>(this)->find(t);
        return s ? s->state : -2;
    }
    /// Forgets a ticket (after its status was returned).
    void erase(uint64_t t) {
        size_t mask = slots_.size() - 1;
        size_t i = t & mask;
        while (slots_[i].ticket != t) {
            if (slots_[i].ticket == 0) {
                return;
            }
            i = (i + 1) & mask;
        }
        if (slots_[i].state == kPending) {
            --pending_;
        }
        // Backward-shift deletion keeps every probe chain unbroken.
        size_t j = i;
        for (;;) {
            j = (j + 1) & mask;
            if (slots_[j].ticket == 0) {
                break;
            }
            size_t home = slots_[j].ticket & mask;
            bool movable = (i <= j) ? (home <= i || home > j) : (home <= i && home > j);
            if (movable) {
                slots_[i] = slots_[j];
                i = j;
            }
        }
        slots_[i] = Slot{};
        --size_;
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
    size_t size() const { return size_; }

private:
    struct Slot {
        uint64_t ticket = 0;
        int32_t state = 0;
    };
    static size_t roundUp(size_t n) {
        size_t p = 16;
        while (p < n) {
            p <<= 1;
        }
        return p;
    }
    Slot *find(uint64_t t) {
        size_t mask = slots_.size() - 1;
        for (size_t i = t & mask;; i = (i + 1) & mask) {
            if (slots_[i].ticket == t) {
                return &slots_[i];
            }
            if (slots_[i].ticket == 0) {
                return nullptr;
            }
        }
    }
    void insert(uint64_t t, int32_t state) {
        size_t mask = slots_.size() - 1;
        size_t i = t & mask;
        while (slots_[i].ticket != 0) {
            i = (i + 1) & mask;
        }
        slots_[i] = Slot{t, state};
        ++size_;
    }
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        slots_.resize(old.size() * 2);
        size_ = 0;
        for (const Slot &s : old) {
            if (s.ticket != 0) {
                insert(s.ticket, s.state);
            }
        }
    }

    std::vector<Slot> slots_;
    size_t size_ = 0;
    size_t pending_ = 0;
};

}  // namespace tensorlane::shim
