// Send and receive work queue entries, preallocated at QP creation so posting allocates nothing.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace tensorlane::simhca {

/// A scatter/gather element as posted (checked against the key table when it is used).
struct Segment {
    uint64_t addr = 0;
    uint32_t length = 0;
    uint32_t lkey = 0;
};

/// A send WQE and the requester's progress through it.
struct SendWqe {
    uint64_t wr_id = 0;
    ibv_wr_opcode opcode = IBV_WR_SEND;
    uint32_t imm_be = 0;  ///< immediate as the application gave it (network order)
    uint64_t remote_addr = 0;
    uint32_t rkey = 0;
    uint32_t length = 0;  ///< total bytes
    bool signaled = false;
    bool solicited = false;
    bool fence = false;
    bool is_inline = false;
    uint32_t num_sge = 0;
    Segment *sges = nullptr;         ///< max_send_sge slots
    uint8_t *inline_data = nullptr;  ///< max_inline_data bytes
    uint32_t first_psn = 0;
    uint32_t npackets = 0;   ///< PSNs the message uses (a READ: its responses)
    uint32_t read_next = 0;  ///< READ: responses received in order so far
    bool done = false;       ///< acknowledged (or READ data all in)
};

/// A receive WQE.
struct RecvWqe {
    uint64_t wr_id = 0;
    uint32_t num_sge = 0;
    Segment *sges = nullptr;
    uint64_t capacity = 0;  ///< sum of the SGE lengths
};

/// A ring of preallocated entries with their SGE storage.
template <typename Wqe>
class WqRing {
public:
    /// A ring of depth entries with max_sge SGEs each (and inline bytes for send WQEs).
    void init(uint32_t depth, uint32_t max_sge, uint32_t inline_bytes) {
        const size_t sge_slots = max_sge == 0 ? 1 : max_sge;
        entries_.assign(depth, Wqe{});
        sges_.assign(depth * sge_slots, Segment{});
        inline_.assign(size_t{depth} * inline_bytes, 0);
        for (uint32_t i = 0; i < depth; ++i) {
            entries_[i].sges = &sges_[i * sge_slots];
            if constexpr (std::is_same_v<Wqe, SendWqe>) {
                entries_[i].inline_data = inline_bytes == 0 ? nullptr : &inline_[i * inline_bytes];
            }
        }
    }
    /// Entries the ring holds.
    [[nodiscard]] uint32_t depth() const { return static_cast<uint32_t>(entries_.size()); }
    /// Entries in use.
    [[nodiscard]] uint32_t size() const { return static_cast<uint32_t>(tail_ - head_); }
    /// Whether another entry fits.
    [[nodiscard]] bool full() const { return size() == depth(); }
    /// Whether no entry is in use.
    [[nodiscard]] bool empty() const { return head_ == tail_; }
    /// The entry at absolute position pos (head() <= pos < tail()).
    [[nodiscard]] Wqe &at(uint64_t pos) { return entries_[pos % entries_.size()]; }
    /// The oldest entry's position.
    [[nodiscard]] uint64_t head() const { return head_; }
    /// One past the newest entry's position.
    [[nodiscard]] uint64_t tail() const { return tail_; }
    /// Claims the next entry (the caller checked full()).
    [[nodiscard]] Wqe &push() { return entries_[tail_++ % entries_.size()]; }
    /// Releases the oldest entry.
    void pop() { ++head_; }
    /// Empties the ring (modify to RESET).
    void clear() { head_ = tail_ = 0; }

private:
    std::vector<Wqe> entries_;
    std::vector<Segment> sges_;
    std::vector<uint8_t> inline_;
    uint64_t head_ = 0;
    uint64_t tail_ = 0;
};

}  // namespace tensorlane::simhca
