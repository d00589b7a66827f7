#include "stream_sync.hpp"

#include <atomic>

namespace tensorlane::sidecar {

std::unique_ptr<SessionStreams> SessionStreams::create(uint32_t ring_depth, uid_t uid, gid_t gid,
                                                       ipc::UniqueFd *fd, std::string *error) {
    auto s = std::unique_ptr<SessionStreams>(new SessionStreams());
    s->geometry_ = ipc::StreamGeometry::forDepth(ring_depth);
    ipc::SharedSegment seg;
    if (int rc = ipc::createSegment(s->geometry_.total_bytes, uid, gid, &seg, error); rc != 0) {
        return nullptr;
    }
    ipc::initStreamSegment(seg.mapping.data(), s->geometry_);
    s->view_ = ipc::StreamView::at(seg.mapping.data(), s->geometry_);
    s->mapping_ = std::move(seg.mapping);
    s->subs_.resize(s->geometry_.notify_slots);
    *fd = std::move(seg.fd);
    return s;
}

void SessionStreams::ended(uint32_t slot, uint64_t ticket, Code status) {
    if (!validSlot(slot)) {
        return;
    }
    ipc::TicketSlot &t = view_.tickets[slot];
    std::atomic_ref<int32_t>(t.status).store(static_cast<int32_t>(status),
                                             std::memory_order_relaxed);
    // SYNC POINT: release: a client (or a stream's wait, through the driver's own ordering)
    // that sees the ticket in `done` sees the status too. Pairs with the client's acquire load.
    t.done.store(static_cast<uint32_t>(ticket), std::memory_order_release);
}

void SessionStreams::hold(WriteOp op, uint32_t slot, uint64_t ticket) {
    held_.push_back(Held{std::move(op), slot, static_cast<uint32_t>(ticket)});
}

std::vector<WriteOp> SessionStreams::opened() {
    std::vector<WriteOp> out;
    for (auto it = held_.begin(); it != held_.end();) {
        // SYNC POINT: acquire pairs with the GPU's cuStreamWriteValue32, which fences the work
        // queued before it (__threadfence_system semantics) before storing: what the kernels
        // wrote is visible to our copies once we see the gate. Cyclic comparison, as
        // CU_STREAM_WAIT_VALUE_GEQ compares: a stale smaller value never opens it.
        const uint32_t v = view_.tickets[it->slot].gate.load(std::memory_order_acquire);
        if (static_cast<int32_t>(v - it->gate) >= 0) {
            out.push_back(std::move(it->op));
            it = held_.erase(it);
        } else {
            ++it;
        }
    }
    return out;
}

std::vector<WriteOp> SessionStreams::takeHeld() {
    std::vector<WriteOp> out;
    for (Held &h : held_) {
        out.push_back(std::move(h.op));
    }
    held_.clear();
    return out;
}

Status SessionStreams::subscribe(RegionId region, uint32_t imm, uint32_t *slot) {
    const auto key = std::make_pair(region, imm);
    if (auto it = sub_of_.find(key); it != sub_of_.end()) {
        *slot = it->second;
        return Status::ok();
    }
    for (uint32_t i = 0; i < subs_.size(); ++i) {
        if (!subs_[i].used) {
            // A slot is used once per session: a flag a stream may still wait on is never
            // given to another pair.
            subs_[i] = Subscription{region, imm, true, false, 0};
            sub_of_[key] = i;
            used_.push_back(i);
            *slot = i;
            return Status::ok();
        }
    }
    return {Code::kNoMemory, "this client holds " + std::to_string(subs_.size()) +
                                 " stream notification subscriptions, the most there are"};
}

bool SessionStreams::handOver(uint32_t slot) {
    std::atomic<uint32_t> &flag = view_.notify[slot].flag;
    // SYNC POINT: acquire pairs with the GPU's store of 0 after its wait (it consumed the last
    // hand-over); release makes the data placed before this notification visible before the
    // flag, which the stream's cuStreamWaitValue32 polls.
    if (flag.load(std::memory_order_acquire) != 0) {
        return false;
    }
    flag.store(1, std::memory_order_release);
    return true;
}

void SessionStreams::credit(uint32_t slot, uint32_t count) {
    if (slot >= subs_.size() || !subs_[slot].used || subs_[slot].released || count == 0) {
        return;
    }
    Subscription &s = subs_[slot];
    const bool was = s.pending != 0;
    s.pending += count;
    if (handOver(slot)) {
        --s.pending;
    }
    pending_handovers_ += (s.pending != 0) - was;
}

bool SessionStreams::divert(RegionId region, uint32_t imm) {
    auto it = sub_of_.find({region, imm});
    if (it == sub_of_.end()) {
        return false;
    }
    Subscription &s = subs_[it->second];
    if (s.released) {
        return false;
    }
    if (s.pending == 0 && handOver(it->second)) {
        return true;
    }
    if (s.pending++ == 0) {
        ++pending_handovers_;
    }
    return true;
}

void SessionStreams::regionReleased(RegionId region) {
    for (auto it = sub_of_.begin(); it != sub_of_.end();) {
        if (it->first.first != region) {
            ++it;
            continue;
        }
        Subscription &s = subs_[it->second];
        if (s.pending != 0) {
            --pending_handovers_;
        }
        s.pending = 0;
        s.released = true;
        ++releasing_;
        (void)handOver(it->second);
        it = sub_of_.erase(it);  // the slot stays used (and released) until the session ends
    }
}

size_t SessionStreams::pollNotify() {
    if (pending_handovers_ == 0 && releasing_ == 0) {
        return 0;
    }
    size_t n = 0;
    for (uint32_t i : used_) {
        Subscription &s = subs_[i];
        if (s.pending == 0 && !s.released) {
            continue;
        }
        if (handOver(i)) {
            if (!s.released && --s.pending == 0) {
                --pending_handovers_;
            }
            ++n;
        }
    }
    return n;
}

}  // namespace tensorlane::sidecar
