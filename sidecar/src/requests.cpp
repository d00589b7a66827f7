// The request path: drain each client's request ring, validate every entry from a private copy,
// and hand it to the queue of its target peer. No syscalls and no logging here except
// rate-limited reasons for rejected requests.
//
// Back-pressure, in two places (DESIGN.md, "Each session has a cap on requests in flight (the
// rest waits in its ring) and each peer its own queue"):
// - a session with [limits] in_flight requests accepted and not ended is not drained further:
//   the rest waits in its ring, whose fullness the shim reports as TL_EAGAIN;
// - an accepted write waits in its target peer's queue while that peer's transport is full
//   (kAgain), so a slow or full peer holds back only the writes to it, never a session's writes
//   to other peers.
#include "engine_impl.hpp"

namespace tensorlane::sidecar {
namespace {

/// Entries taken from one session per loop turn, so one busy client cannot starve the others.
constexpr uint32_t kBatch = 256;

}  // namespace

void EngineImpl::completeOrClose(Session &s, uint64_t ticket, Code status, uint64_t bytes,
                                 uint32_t slot) {
    if (slot != kNoSlot && s.streams) {
        // Before the completion: a stream in tl_stream_wait_ticket is released even when the
        // write failed; the status is in the slot and in the completion.
        s.streams->ended(slot, ticket, status);
    }
    if (!s.complete(ticket, status, bytes)) {
        closeSession(s, "client does not drain its completion ring");
    }
}

void EngineImpl::reject(Session &s, const ipc::Request &r, Code code, const char *why) {
    stats_.rejected(code);
    ++s.counters.rejected;
    ++counters_.requests_rejected;
    // Rate-limited: a hostile client must not be able to flood the log.
    uint64_t n = s.counters.rejected;
    if (n <= 10 || (n & (n - 1)) == 0) {
        log_->warn("session {} (pid {}): request ticket {} op {} rejected ({}): {}{}", s.id,
                   s.cred.pid, r.ticket, r.op, ipc::codeName(code), why,
                   n > 10 ? " [rate-limited]" : "");
    }
    const bool slotted =
        (r.flags & ipc::kRequestHasSlot) != 0 && s.streams && s.streams->validSlot(r.slot);
    completeOrClose(s, r.ticket, code, 0, slotted ? r.slot : kNoSlot);
}

void EngineImpl::handleRequest(Session &s, const ipc::Request &r) {
    // Stream slots (docs/gpu.md): only with a stream segment, a slot in it, and a gate only
    // with a slot. Anything else is a bad request.
    if ((r.flags & ~ipc::kRequestFlagMask) != 0 ||
        ((r.flags & ipc::kRequestGated) != 0 && (r.flags & ipc::kRequestHasSlot) == 0) ||
        ((r.flags & ipc::kRequestHasSlot) != 0 && (!s.streams || !s.streams->validSlot(r.slot)))) {
        reject(s, r, Code::kInvalid, "bad stream flags or slot");
        return;
    }
    const uint32_t slot = (r.flags & ipc::kRequestHasSlot) != 0 ? r.slot : kNoSlot;
    switch (static_cast<ipc::Op>(r.op)) {
        case ipc::Op::kNop:
            completeOrClose(s, r.ticket, Code::kOk, 0, slot);
            return;
        case ipc::Op::kWrite:
            break;
        default:
            reject(s, r, Code::kInvalid, "unknown op");
            return;
    }
    if (r.bytes == 0) {
        reject(s, r, Code::kInvalid, "zero-length write");
        return;
    }
    auto src = regions_.find(r.src_region);
    if (!src || src->owner != s.id) {
        reject(s, r, Code::kInvalid, "source region is not one of this client's");
        return;
    }
    if (!src->contains(r.src_offset, r.bytes)) {
        reject(s, r, Code::kInvalid, "source offset + length past the end of the region");
        return;
    }
    auto rit = s.remotes.find(r.dst_remote);
    if (rit == s.remotes.end()) {
        reject(s, r, Code::kInvalid, "unknown remote handle (not from tl_lookup)");
        return;
    }
    const RemoteRef &dst = rit->second;
    if (r.dst_offset > dst.bytes || r.bytes > dst.bytes - r.dst_offset) {
        reject(s, r, Code::kInvalid, "target offset + length past the end of the region");
        return;
    }

    WriteOp op;
    op.op_id = next_op_++;
    op.peer = dst.peer;
    op.src = std::move(src);
    op.src_offset = r.src_offset;
    op.dst_region = dst.region;
    op.dst_offset = r.dst_offset;
    op.bytes = r.bytes;
    op.imm = r.imm;
    if (dst.peer == kLocalPeer) {
        op.dst = regions_.find(dst.region);
        if (!op.dst || !op.dst->exposed.load(std::memory_order_acquire)) {
            reject(s, r, Code::kNotFound, "target region was deregistered");
            return;
        }
        // Checked on every write, not only at lookup: the owner may narrow the list since
        // (tl_expose_access again). The owner's own uid is the first, one-compare test.
        if (!op.dst->access.allows(s.cred.uid, s.groups)) {
            reject(s, r, Code::kPermission,
                   "the target's access list does not allow this uid (tl_expose_access)");
            return;
        }
        ++counters_.writes_local;
    } else {
        std::string why;
        if (!peers_ || !peers_->resolveRemote(dst.peer, dst.region, &op.remote_region, &why)) {
            reject(s, r, Code::kNotFound, "target region is not valid at the peer");
            return;
        }
        ++counters_.writes_remote;
    }
    // Accepted: from here on the request ends exactly once, through completed().
    ++op.src->users;
    if (op.dst) {
        ++op.dst->users;
    }
    // Timed only with the metrics endpoint on: one clock read (the TSC where it is a clock,
    // else the vDSO's steady clock) per batch of requests drained (drainRequests invalidates it).
    ops_.emplace(op.op_id, PendingOp{s.id, r.ticket, r.bytes, op.src, op.dst, op.peer,
                                     stats_.timing() ? stats_.now() : 0, slot, s.cred.uid});
    ++s.in_flight;
    if ((r.flags & ipc::kRequestGated) != 0) {
        // tl_write_on_stream: it waits for the client's GPU stream (pollStreams).
        s.streams->hold(std::move(op), slot, r.ticket);
        streams_moved_ = std::chrono::steady_clock::now();
        return;
    }
    PeerQueue &q = queues_[op.peer];
    if (q.ops.empty()) {
        if (postNow(op)) {
            return;
        }
    }
    q.ops.push_back(std::move(op));
    ++queued_;
}

bool EngineImpl::postNow(const WriteOp &op) {
    Status st = transports_.post(op);
    if (st.code() == Code::kAgain) {
        return false;
    }
    if (!st.isOk()) {
        // Refused at once (peer down, region revoked there): the op ends here.
        completed(op.op_id, st.code(), st.message());
    }
    return true;
}

size_t EngineImpl::pumpQueues() {
    if (queued_ == 0) {
        return 0;
    }
    size_t posted = 0;
    for (auto &[peer, q] : queues_) {
        while (!q.ops.empty() && postNow(q.ops.front())) {
            q.ops.pop_front();
            --queued_;
            ++posted;
        }
    }
    return posted;
}

uint32_t EngineImpl::drainSession(Session &s, uint64_t cap) {
    // A client cannot corrupt this ring for us: we poll its slots' sequence words and never
    // trust its tail (spsc_ring.hpp); a forged entry is validated like any other.
    uint32_t n = s.requests.available();
    if (n == 0 || s.in_flight >= cap) {
        return 0;
    }
    n = static_cast<uint32_t>(std::min<uint64_t>({n, kBatch, cap - s.in_flight}));
    uint32_t done = 0;
    for (; done < n && !s.closing; ++done) {
        // Copy out first: the client can change the slot under us (DESIGN.md, step 3).
        const ipc::Request r = s.requests.read(done);
        ++s.counters.requests;
        handleRequest(s, r);
    }
    if (!s.closing) {
        s.requests.release(done);
    }
    return done;
}

size_t EngineImpl::drainRequests() {
    if (stats_.timing()) {
        stats_.invalidateClock();  // the requests accepted below share one clock read
    }
    size_t work = 0;
    const uint64_t cap = cfg_.limits.in_flight;
    // Index loop: handlers may close sessions, but only reapSessions() edits active_.
    for (size_t i = 0; i < active_.size(); ++i) {
        Session &s = *active_[i];
        if (s.closing) {
            continue;
        }
        // Back-pressure: a client with a full completion backlog gets no more service until
        // it drains; one at its in-flight cap waits for its writes to end. Either way its
        // request ring fills and its tl_write says TL_EAGAIN.
        if (s.completion_backlog.size() >= s.completions.depth()) {
            continue;
        }
        work += drainSession(s, cap);
    }
    return work;
}

}  // namespace tensorlane::sidecar
