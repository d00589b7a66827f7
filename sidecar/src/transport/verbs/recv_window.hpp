// What a receiving session checks of a peer's writes, apart from the HCA: which immediates came
// for which write, whether a write's descriptor is valid once every stripe's immediate did, and
// what may be done with it (docs/verbs.md, "The immediate"). No verbs objects here: the
// RecvSession feeds it the immediates it polls and the ring the peer writes descriptors into,
// the fuzz target (tests/fuzz/fuzz_verbs.cpp) feeds it arbitrary bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensorlane/sidecar/region.hpp"
#include "transport/verbs/wire.hpp"

namespace tensorlane::sidecar {

class RecvWindow {
public:
    struct Slot {
        uint64_t seq = 0;  ///< the write it counts for (0: free)
        uint32_t count = 0;
        uint32_t stripes = 0;
        bool ready = false;
        /// Copied from the ring once every stripe came (ready): the header, and a message's
        /// bytes (message_bytes of them; the rest is stale).
        WriteDescriptor desc;
    };

    /// `slots`: the descriptor ring's size (at least the largest window a sender may use).
    explicit RecvWindow(uint32_t slots = 0) : slots_(slots) {}

    /// One stripe's wire immediate. `ring` is the descriptor ring (slots() entries), read once
    /// when the write has every stripe's. False with `*error` when the immediate or the
    /// descriptor breaks the protocol (the session must end then): a torn or stale slot,
    /// unknown flags, a message of a bad length, with data, or whose bytes fail their check.
    bool onImm(uint32_t imm, const WriteDescriptor *ring, std::string *error);
    /// The next write in sequence order, once its stripes all came (nullptr: not yet).
    const Slot *ready() const;
    /// Whether write `seq` (at or after next()) has all its stripes already.
    bool readyAt(uint64_t seq) const;
    /// Consumes ready().
    void pop();
    /// The sequence number of the next write to deliver.
    uint64_t next() const { return next_; }
    size_t slots() const { return slots_.size(); }

private:
    std::vector<Slot> slots_;
    uint64_t next_ = 1;
};

/// What to do with a ready write's (valid) descriptor.
enum class Verdict {
    kDeliver,  ///< notify the region's owner
    kDrop,     ///< its region went while the write was on its way: nobody is told (counted)
    kRefuse,   ///< it claims bytes outside its region: a lie, the session ends
};
/// `region`: the region the descriptor names (nullptr: none); `usable`: it is exposed to this
/// peer and not being revoked. A message (no bytes) is judged as a write of 0 bytes at its
/// offset: inside when the offset is at most the region's size.
Verdict judge(const WriteDescriptor &d, const Region *region, bool usable);

}  // namespace tensorlane::sidecar
