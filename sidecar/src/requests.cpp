// The request path: drain each client's request ring, validate every entry from a private copy,
// and post it to the transport of its target. No allocation per request beyond the ops table,
// no syscalls, no logging except rate-limited reasons for rejected requests.
#include "engine_impl.hpp"

namespace tensorlane::sidecar {
namespace {

/// Entries taken from one session per loop turn, so one busy client cannot starve the others.
constexpr uint32_t kBatch = 256;

}  // namespace

void EngineImpl::completeOrClose(Session &s, uint64_t ticket, Code status, uint64_t bytes) {
    if (!s.complete(ticket, status, bytes)) {
        closeSession(s, "client does not drain its completion ring");
    }
}

void EngineImpl::reject(Session &s, const ipc::Request &r, Code code, const char *why) {
    ++s.counters.rejected;
    ++counters_.requests_rejected;
    // Rate-limited: a hostile client must not be able to flood the log.
    uint64_t n = s.counters.rejected;
    if (n <= 10 || (n & (n - 1)) == 0) {
        log_->warn("session {} (pid {}): request ticket {} op {} rejected ({}): {}{}", s.id,
                   s.cred.pid, r.ticket, r.op, ipc::codeName(code), why,
                   n > 10 ? " [rate-limited]" : "");
    }
    completeOrClose(s, r.ticket, code, 0);
}

bool EngineImpl::handleRequest(Session &s, const ipc::Request &r) {
    switch (static_cast<ipc::Op>(r.op)) {
        case ipc::Op::kNop:
            completeOrClose(s, r.ticket, Code::kOk, 0);
            return true;
        case ipc::Op::kWrite:
            break;
        default:
            reject(s, r, Code::kInvalid, "unknown op");
            return true;
    }
    if (r.bytes == 0) {
        reject(s, r, Code::kInvalid, "zero-length write");
        return true;
    }
    auto src = regions_.find(r.src_region);
    if (!src || src->owner != s.id) {
        reject(s, r, Code::kInvalid, "source region is not one of this client's");
        return true;
    }
    if (!src->contains(r.src_offset, r.bytes)) {
        reject(s, r, Code::kInvalid, "source offset + length past the end of the region");
        return true;
    }
    auto rit = s.remotes.find(r.dst_remote);
    if (rit == s.remotes.end()) {
        reject(s, r, Code::kInvalid, "unknown remote handle (not from tl_lookup)");
        return true;
    }
    const RemoteRef &dst = rit->second;
    if (r.dst_offset > dst.bytes || r.bytes > dst.bytes - r.dst_offset) {
        reject(s, r, Code::kInvalid, "target offset + length past the end of the region");
        return true;
    }

    WriteOp op;
    op.op_id = next_op_;
    op.peer = dst.peer;
    op.src = std::move(src);
    op.src_offset = r.src_offset;
    op.dst_region = dst.region;
    op.dst_offset = r.dst_offset;
    op.bytes = r.bytes;
    op.imm = r.imm;

    Transport *t = nullptr;
    if (dst.peer == kLocalPeer) {
        auto target = regions_.find(dst.region);
        if (!target || !target->exposed.load(std::memory_order_acquire)) {
            reject(s, r, Code::kNotFound, "target region was deregistered");
            return true;
        }
        t = local_.get();
        ++counters_.writes_local;
    } else {
        if (!peers_ || !peers_->remoteValid(dst.peer, dst.region)) {
            reject(s, r, Code::kNotFound, "target region was revoked by its owner");
            return true;
        }
        t = &peers_->transport();
        ++counters_.writes_remote;
    }
    Status st = t->post(std::move(op));
    if (st.code() == Code::kAgain) {
        return false;
    }
    if (!st.isOk()) {
        completeOrClose(s, r.ticket, st.code(), 0);
        return true;
    }
    ops_.emplace(next_op_++, PendingOp{s.id, r.ticket, r.bytes});
    ++s.in_flight;
    return true;
}

size_t EngineImpl::drainRequests() {
    size_t work = 0;
    // Index loop: handlers may close sessions, but only reapSessions() edits active_.
    for (size_t i = 0; i < active_.size(); ++i) {
        Session &s = *active_[i];
        if (s.closing) {
            continue;
        }
        // Back-pressure: a client with a full completion backlog gets no more service until
        // it drains; its request ring fills and its tl_write says TL_EAGAIN.
        if (s.completion_backlog.size() >= s.completions.depth()) {
            continue;
        }
        // A client cannot corrupt this ring for us: we poll its slots' sequence words and never
        // trust its tail (spsc_ring.hpp); a forged entry is validated like any other.
        uint32_t n = s.requests.available();
        if (n == 0) {
            continue;
        }
        n = std::min(n, kBatch);
        uint32_t done = 0;
        for (; done < n && !s.closing; ++done) {
            // Copy out first: the client can change the slot under us (DESIGN.md, step 3).
            const ipc::Request r = s.requests.read(done);
            ++s.counters.requests;
            if (!handleRequest(s, r)) {
                --s.counters.requests;  // retried next turn
                break;
            }
        }
        if (!s.closing) {
            s.requests.release(done);
        }
        work += done;
    }
    return work;
}

}  // namespace tensorlane::sidecar
