// The local transport's first path: small host-to-host writes copied by memcpy on the engine
// thread itself, in post(), when the writing session has nothing on the other two paths (the
// router decides: local_transport.hpp). Two hand-overs between threads cost more than such a
// copy (on the GPU machine about 3.5 us of a 4 KiB write's 14; on a host with fewer cores than
// spinning threads a scheduler slice each). The writes end at once; the next progress()
// reports them.
#pragma once

#include <cstdint>
#include <vector>

#include "transport/local/local_job.hpp"

namespace tensorlane::sidecar {

class InlineHostCopies {
public:
    /// Host writes up to this size may be copied here.
    static constexpr uint64_t kMaxBytes = 4096;

    /// Whether `job` is one for this path (host to host, kMaxBytes or less).
    static bool fits(const LocalJob &job) { return !job.gpu && job.op.bytes <= kMaxBytes; }

    /// Copies `job` of session `sid` now; its verdict waits for take().
    void copy(LocalJob job, SessionId sid);
    /// Whether writes copied here wait to be reported.
    bool pending() const { return !done_.empty(); }
    /// Appends the writes copied since the last call, in posting order.
    void take(std::vector<LocalDone> *out);
    /// Host writes copied here so far (status, tests).
    uint64_t count() const { return count_; }

private:
    std::vector<LocalDone> done_;
    uint64_t count_ = 0;
};

}  // namespace tensorlane::sidecar
