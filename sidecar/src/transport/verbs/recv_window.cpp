#include "transport/verbs/recv_window.hpp"

#include <cstring>

namespace tensorlane::sidecar {

bool RecvWindow::onImm(uint32_t imm, const WriteDescriptor *ring, std::string *error) {
    if (slots_.empty()) {
        *error = "an immediate before the descriptor ring exists";
        return false;
    }
    const uint32_t seq23 = WireImm::seqOf(imm);
    const uint32_t stripes = WireImm::stripesOf(imm);
    // The full sequence number: the one in [next_, next_ + slots) with these low bits (a sender
    // keeps fewer than `slots` writes unconsumed).
    const uint64_t full = next_ + ((seq23 - static_cast<uint32_t>(next_)) & WireImm::kSeqMask);
    if (full - next_ >= slots_.size()) {
        *error = "immediate for write " + std::to_string(full) + ", outside the window";
        return false;
    }
    Slot &s = slots_[full % slots_.size()];
    if (s.seq == 0) {
        s = Slot{};
        s.seq = full;
        s.stripes = stripes;
    } else if (s.seq != full || s.stripes != stripes || s.ready) {
        *error = "immediates of write " + std::to_string(full) + " disagree";
        return false;
    }
    if (++s.count < s.stripes) {
        return true;
    }
    // Every stripe's WRITE_WITH_IMM has arrived, and each was the last WR on its QP for this
    // write: RC places a QP's requests in order, so all the data is in place, and so is the
    // descriptor, written on the first stripe's QP before that stripe.
    std::memcpy(&s.desc, &ring[full % slots_.size()], sizeof s.desc);
    if (s.desc.seq != full || s.desc.stripes != stripes ||
        s.desc.check != descriptorCheck(s.desc) || s.desc.bytes == 0) {
        *error = "write " + std::to_string(full) + " has no valid descriptor";
        return false;
    }
    s.ready = true;
    return true;
}

const RecvWindow::Slot *RecvWindow::ready() const {
    if (slots_.empty()) {
        return nullptr;
    }
    const Slot &s = slots_[next_ % slots_.size()];
    return s.seq == next_ && s.ready ? &s : nullptr;
}

bool RecvWindow::readyAt(uint64_t seq) const {
    if (slots_.empty() || seq < next_ || seq - next_ >= slots_.size()) {
        return false;
    }
    const Slot &s = slots_[seq % slots_.size()];
    return s.seq == seq && s.ready;
}

void RecvWindow::pop() {
    if (ready() == nullptr) {
        return;
    }
    slots_[next_ % slots_.size()] = Slot{};
    ++next_;
}

Verdict judge(const WriteDescriptor &d, const Region *region, bool usable) {
    if (region == nullptr || !usable) {
        return Verdict::kDrop;
    }
    // The HCA kept the data inside the region's MR; a descriptor that claims more than the
    // region holds is a lie (or a bug) of the sender's.
    return region->contains(d.offset, d.bytes) ? Verdict::kDeliver : Verdict::kRefuse;
}

}  // namespace tensorlane::sidecar
