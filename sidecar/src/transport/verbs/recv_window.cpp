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
        // Field by field: the descriptor's copy (a message's bytes too) is overwritten below.
        s.seq = full;
        s.count = 0;
        s.stripes = stripes;
        s.ready = false;
    } else if (s.seq != full || s.stripes != stripes || s.ready) {
        *error = "immediates of write " + std::to_string(full) + " disagree";
        return false;
    }
    if (++s.count < s.stripes) {
        return true;
    }
    // Every stripe's WRITE_WITH_IMM has arrived, and each was the last WR on its QP for this
    // write: RC places a QP's requests in order, so all the data is in place, and so is the
    // descriptor, written on the first stripe's QP before that stripe (a message's descriptor
    // is its one WRITE_WITH_IMM). The slot is the peer's memory: copied once, then only the
    // copy is looked at, and no length in it is used before it is checked.
    const WriteDescriptor &slot = ring[full % slots_.size()];
    std::memcpy(static_cast<void *>(&s.desc), &slot, kDescHeaderBytes);  // the header alone
    if (s.desc.seq != full || s.desc.stripes != stripes ||
        s.desc.check != descriptorCheck(s.desc)) {
        *error = "write " + std::to_string(full) + " has no valid descriptor";
        return false;
    }
    if (!validDescriptorFields(s.desc, error)) {
        return false;
    }
    if ((s.desc.flags & kDescMessage) != 0) {
        std::memcpy(s.desc.message, slot.message, s.desc.message_bytes);  // <= 512: checked
        if (messageCheck(full, s.desc.message, s.desc.message_bytes) != s.desc.message_check) {
            *error = "message " + std::to_string(full) + " fails its check (a torn slot)";
            return false;
        }
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
    Slot &s = slots_[next_ % slots_.size()];
    s.seq = 0;  // free (the descriptor's copy stays until the slot is used again)
    s.count = 0;
    s.stripes = 0;
    s.ready = false;
    ++next_;
}

Verdict judge(const WriteDescriptor &d, const Region *region, bool usable) {
    if (region == nullptr || !usable) {
        return Verdict::kDrop;
    }
    // The HCA kept the data inside the region's MR; a descriptor that claims more than the
    // region holds is a lie (or a bug) of the sender's. A message is checked as a write of 0
    // bytes at its offset: at most the region's end.
    if ((d.flags & kDescMessage) != 0) {
        return d.offset <= region->bytes ? Verdict::kDeliver : Verdict::kRefuse;
    }
    return region->contains(d.offset, d.bytes) ? Verdict::kDeliver : Verdict::kRefuse;
}

}  // namespace tensorlane::sidecar
