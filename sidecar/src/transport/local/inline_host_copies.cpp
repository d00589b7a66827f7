#include "transport/local/inline_host_copies.hpp"

#include <utility>

#include "transport/local/host_copy.hpp"

namespace tensorlane::sidecar {

static_assert(InlineHostCopies::kMaxBytes <= kHostSliceBytes, "an inline copy is one slice");

void InlineHostCopies::copy(LocalJob job, SessionId sid) {
    LocalDone d;
    (void)copyHostSlice(job, sid, &d);  // finishes: kMaxBytes is less than one slice
    done_.push_back(std::move(d));
    ++count_;
}

void InlineHostCopies::take(std::vector<LocalDone> *out) {
    for (LocalDone &d : done_) {
        out->push_back(std::move(d));
    }
    done_.clear();
}

}  // namespace tensorlane::sidecar
