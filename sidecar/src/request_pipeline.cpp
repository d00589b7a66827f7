#include "request_pipeline.hpp"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>

#include "logging.hpp"
#include "region_lifecycle.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {
namespace {

/// Entries taken from one session per loop turn, so one busy client cannot starve the others.
constexpr uint32_t kBatch = 256;

}  // namespace

namespace {
/// A random start for the engine's kWriteEx ids, so a restarted writer's groups never take the
/// ids its earlier run had in flight at a target.
uint64_t randomStart() {
    std::random_device rd;
    return (((uint64_t{rd()} << 32) ^ rd()) & ((uint64_t{1} << 62) - 1)) | 1;
}
}  // namespace

RequestPipeline::RequestPipeline(uint64_t in_flight_cap, SessionTable &sessions,
                                 RegionTable &regions, RegionLifecycle &lifecycle,
                                 TransportSet &transports, PeerManager *peers, EngineStats &stats,
                                 EngineCounters &counters)
    : cap_(in_flight_cap),
      sessions_(sessions),
      regions_(regions),
      lifecycle_(lifecycle),
      transports_(transports),
      peers_(peers),
      stats_(stats),
      counters_(counters),
      log_(sidecarLogger()),
      next_ex_(randomStart()) {}

// ---- taking requests

size_t RequestPipeline::drainRequests() {
    if (stats_.timing()) {
        stats_.invalidateClock();  // the requests accepted below share one clock read
    }
    size_t work = 0;
    // Index loop: handlers may close sessions, but only the control server's teardown (between
    // two turns) removes them from active().
    const std::vector<Session *> &active = sessions_.active();
    for (size_t i = 0; i < active.size(); ++i) {
        Session &s = *active[i];
        if (s.closing) {
            continue;
        }
        // Back-pressure: a client with a full completion backlog gets no more service until
        // it drains; one at its in-flight cap waits for its writes to end. Either way its
        // request ring fills and its tl_write says TL_EAGAIN.
        if (s.completion_backlog.size() >= s.completions.depth()) {
            continue;
        }
        work += drainSession(s, cap_);
    }
    return work;
}

uint32_t RequestPipeline::drainSession(Session &s, uint64_t cap) {
    // A client cannot corrupt this ring for us: we poll its slots' sequence words and never
    // trust its tail (spsc_ring.hpp); a forged entry is validated like any other.
    uint32_t n = s.requests.available();
    if (n == 0 || s.in_flight >= cap) {
        return 0;
    }
    n = static_cast<uint32_t>(std::min<uint64_t>({n, kBatch, cap - s.in_flight}));
    uint32_t done = 0;
    for (; done < n && !s.closing && !exBackPressure(s); ++done) {
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

void RequestPipeline::handleRequest(Session &s, const ipc::Request &r) {
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
        case ipc::Op::kWriteEx:
            handleEx(s, r, slot);
            return;
        default:
            reject(s, r, Code::kInvalid, "unknown op");
            return;
    }
    WriteOp op;
    const char *why = "";
    bool probe = false;
    if (Code code = buildWrite(s, r.src_region, r.src_offset, r.dst_remote, r.dst_offset, r.bytes,
                               r.imm, &op, &why, &probe);
        code != Code::kOk) {
        reject(s, r, code, why);
        return;
    }
    op.op_id = next_op_++;
    if (probe) {
        ++counters_.probes_sent;  // `tensorlane diag`: not the node's traffic
    } else if (op.peer == kLocalPeer) {
        ++counters_.writes_local;
    } else {
        ++counters_.writes_remote;
    }
    // Accepted: from here on the request ends exactly once, through completed().
    ++op.src->users;
    if (op.dst) {
        ++op.dst->users;
    }
    // Timed only with the metrics endpoint on: one clock read (the TSC where it is a clock,
    // else the vDSO's steady clock) per batch of requests drained (drainRequests invalidates it).
    const int64_t accepted_ns = stats_.timing() ? stats_.now() : 0;
    PendingOp pending{s.id,    r.ticket,    r.bytes, op.src,    op.dst,
                      op.peer, accepted_ns, slot,    s.cred.uid};
    pending.probe = probe;
    ops_.emplace(op.op_id, std::move(pending));
    ++s.in_flight;
    if ((r.flags & ipc::kRequestGated) != 0) {
        // tl_write_on_stream: it waits for the client's GPU stream (pollStreams).
        s.streams->hold(std::move(op), slot, r.ticket);
        streams_moved_ = std::chrono::steady_clock::now();
        return;
    }
    enqueue(std::move(op));
}

Code RequestPipeline::buildWrite(Session &s, uint64_t src_region, uint64_t src_offset,
                                 uint64_t dst_remote, uint64_t dst_offset, uint64_t bytes,
                                 uint32_t imm, WriteOp *op, const char **why, bool *probe) {
    if (bytes == 0) {
        *why = "zero-length write";
        return Code::kInvalid;
    }
    auto src = regions_.find(src_region);
    if (!src || src->owner != s.id) {
        *why = "source region is not one of this client's";
        return Code::kInvalid;
    }
    if (!src->contains(src_offset, bytes)) {
        *why = "source offset + length past the end of the region";
        return Code::kInvalid;
    }
    auto rit = s.remotes.find(dst_remote);
    if (rit == s.remotes.end()) {
        *why = "unknown remote handle (not from tl_lookup)";
        return Code::kInvalid;
    }
    const RemoteRef &dst = rit->second;
    if (probe != nullptr) {
        *probe = dst.probe;
    }
    if (dst_offset > dst.bytes || bytes > dst.bytes - dst_offset) {
        *why = "target offset + length past the end of the region";
        return Code::kInvalid;
    }
    op->src = std::move(src);
    op->src_offset = src_offset;
    op->dst_offset = dst_offset;
    op->bytes = bytes;
    op->imm = imm;
    return resolveTarget(s, dst, op, why);
}

Code RequestPipeline::resolveTarget(Session &s, const RemoteRef &dst, WriteOp *op,
                                    const char **why) {
    op->peer = dst.peer;
    op->dst_region = dst.region;
    if (dst.peer == kLocalPeer) {
        op->dst = regions_.find(dst.region);
        if (!op->dst || !op->dst->exposed.load(std::memory_order_acquire)) {
            *why = "target region was deregistered";
            return Code::kNotFound;
        }
        // Checked on every write, not only at lookup: the owner may narrow the list since
        // (tl_expose_access again). The owner's own uid is the first, one-compare test.
        if (!op->dst->access.allows(s.cred.uid, s.groups)) {
            *why = "the target's access list does not allow this uid (tl_expose_access)";
            return Code::kPermission;
        }
    } else {
        std::string reason;
        if (!peers_ || !peers_->resolveRemote(dst.peer, dst.region, &op->remote_region, &reason)) {
            *why = "target region is not valid at the peer";
            return Code::kNotFound;
        }
    }
    return Code::kOk;
}

void RequestPipeline::reject(Session &s, const ipc::Request &r, Code code, const char *why) {
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

// ---- posting

void RequestPipeline::enqueue(WriteOp op) {
    PeerQueue &q = queues_[op.peer];
    if (q.ops.empty() && postNow(op)) {
        return;
    }
    q.ops.push_back(std::move(op));
    ++queued_;
}

bool RequestPipeline::postNow(const WriteOp &op) {
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

size_t RequestPipeline::pumpQueues() {
    if (queued_ == 0) {
        return 0;
    }
    size_t posted = 0;
    for (auto &[peer, q] : queues_) {
        while (!q.ops.empty()) {
            // Posted one by one from here, with nothing behind them in this turn's request
            // handling: no op waits for a follower (WriteOp::more).
            q.ops.front().more = false;
            if (!postNow(q.ops.front())) {
                break;
            }
            q.ops.pop_front();
            --queued_;
            ++posted;
        }
    }
    return posted;
}

// ---- stream-ordered writes (docs/gpu.md, "Stream-ordered writes")

size_t RequestPipeline::pollStreams() {
    if (stream_sessions_.empty()) {
        return 0;
    }
    size_t work = 0;
    for (size_t i = 0; i < stream_sessions_.size();) {
        Session *s = sessions_.find(stream_sessions_[i]);
        if (s == nullptr) {
            stream_sessions_.erase(stream_sessions_.begin() + static_cast<ptrdiff_t>(i));
            continue;
        }
        ++i;
        if (s->closing || !s->streams) {
            continue;
        }
        if (s->streams->held() != 0) {
            for (WriteOp &op : s->streams->opened()) {
                // Its stream has reached it: from here it is an ordinary accepted write.
                ++work;
                enqueue(std::move(op));
            }
        }
        work += s->streams->pollNotify();
    }
    if (work != 0) {
        streams_moved_ = std::chrono::steady_clock::now();
    }
    return work;
}

bool RequestPipeline::anyStreamUrgent() const {
    for (SessionId id : stream_sessions_) {
        const Session *s = sessions_.find(id);
        if (s != nullptr && s->streams && s->streams->urgent()) {
            return true;
        }
    }
    return false;
}

bool RequestPipeline::watchingStreams() const {
    // A GPU stream that is about to open a gate or take a hand-over is watched closely for a
    // while (the GPU cannot ring our doorbell); after that in 1 ms naps (the engine's run()).
    constexpr auto kStreamWatch = std::chrono::milliseconds(2);
    return streamsUrgent() && std::chrono::steady_clock::now() - streams_moved_ < kStreamWatch;
}

// ---- ending requests

void RequestPipeline::completeOrClose(Session &s, uint64_t ticket, Code status, uint64_t bytes,
                                      uint32_t slot) {
    if (slot != kNoSlot && s.streams) {
        // Before the completion: a stream in tl_stream_wait_ticket is released even when the
        // write failed; the status is in the slot and in the completion.
        s.streams->ended(slot, ticket, status);
    }
    if (!s.complete(ticket, status, bytes)) {
        sessions_.close(s, "client does not drain its completion ring");
    }
}

void RequestPipeline::completed(uint64_t op_id, Code status, std::string_view reason) {
    if (held_arrival_) {
        // The owner's notification first, as the transport reported it (DESIGN.md, data path).
        // Looked up apart: delivering it may close the owner's session.
        auto w = ops_.find(op_id);
        releaseHeldArrival(w != ops_.end() ? w->second.writer_uid : ipc::kWriterUidUnknown);
    }
    auto it = ops_.find(op_id);
    if (it == ops_.end()) {
        return;
    }
    PendingOp op = std::move(it->second);
    ops_.erase(it);
    // Counted whether or not the writer is still there: the peer saw the write either way.
    // Timed to the end of this turn, after its completions are published (run()).
    if (!op.probe) {
        stats_.writeEndedSince(op.peer, status, op.bytes, op.accepted_ns);
    }
    lifecycle_.dropUser(op.src);
    lifecycle_.dropUser(op.dst);
    if (op.ex != 0) {
        partEnded(op, status);  // a part of a kWriteEx request: its ExOp ends the ticket
        return;
    }
    Session *s = sessions_.find(op.session);
    if (!s) {
        return;  // the writer is gone; nothing to tell
    }
    --s->in_flight;
    if (s->closing) {
        return;
    }
    if (status == Code::kOk) {
        s->counters.bytes_written += op.bytes;
    } else {
        log_->debug("session {} ticket {} failed: {} ({})", s->id, op.ticket, ipc::codeName(status),
                    reason);
    }
    completeOrClose(*s, op.ticket, status, op.bytes, op.slot);
}

size_t RequestPipeline::dropSession(Session &s) {
    // Its writes still waiting for a transport are not sent for a client that is gone: they
    // end here (their completions find no session to tell) and let go of the memory at once.
    size_t dropped = 0;
    if (queued_ != 0) {
        std::vector<uint64_t> ended;
        for (auto &[peer, q] : queues_) {
            for (auto qi = q.ops.begin(); qi != q.ops.end();) {
                auto op = ops_.find(qi->op_id);
                if (op != ops_.end() && op->second.session == s.id) {
                    ended.push_back(qi->op_id);
                    qi = q.ops.erase(qi);
                    --queued_;
                } else {
                    ++qi;
                }
            }
        }
        for (uint64_t op_id : ended) {
            completed(op_id, Code::kConnection, "the client is gone");
        }
        dropped = ended.size();
    }
    if (s.streams) {
        // Gated writes whose stream never reached them: they end like queued ones.
        for (WriteOp &op : s.streams->takeHeld()) {
            completed(op.op_id, Code::kConnection, "the client is gone");
            ++dropped;
        }
    }
    return dropped;
}

// ---- notifications

void RequestPipeline::endProgress() {
    in_local_progress_ = false;
    releaseHeldArrival(ipc::kWriterUidUnknown);  // none is left unless that order changed
}

void RequestPipeline::arrived(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                              std::string_view peer_name) {
    if (in_local_progress_) {
        // A local write: its completed() follows at once and names the writer.
        releaseHeldArrival(ipc::kWriterUidUnknown);
        held_arrival_ = HeldArrival{region, imm, offset, bytes, peer_name};
        return;
    }
    notifyArrival(region, imm, offset, bytes, peer_name, ipc::kWriterUidPeer);
}

void RequestPipeline::releaseHeldArrival(uint32_t writer_uid) {
    if (!held_arrival_) {
        return;
    }
    HeldArrival a = std::move(*held_arrival_);
    held_arrival_.reset();
    if (!a.message.empty()) {
        deliverRecord(a.region, a.imm, a.message, a.peer, writer_uid);
        return;
    }
    notifyArrival(a.region, a.imm, a.offset, a.bytes, a.peer, writer_uid);
}

void RequestPipeline::notifyArrival(RegionId region, uint32_t imm, uint64_t offset, uint64_t bytes,
                                    std::string_view peer_name, uint32_t writer_uid) {
    if (const RegionId probe = lifecycle_.probeRegion(); region == probe && probe != 0) {
        ++counters_.probes_received;
        return;
    }
    stats_.received(peer_name, bytes);
    auto r = regions_.find(region);
    Session *s = r ? sessions_.find(r->owner) : nullptr;
    if (!s || s->closing) {
        ++counters_.notifications_dropped;
        return;
    }
    if (s->streams && s->streams->divert(region, imm)) {
        ++counters_.notifications;  // counted for tl_stream_wait_notification's flag
        return;
    }
    ipc::Notification n{};
    n.region = region;
    n.offset = offset;
    n.bytes = bytes;
    n.imm = imm;
    n.writer_uid = writer_uid;
    std::string name(peer_name.substr(0, ipc::kPeerNameBytes - 1));
    std::memcpy(n.peer, name.data(), name.size());
    if (s->notify(n)) {
        ++counters_.notifications;
    } else {
        // Its backlog is full ([limits] notification_backlog): dropped and counted; the
        // writer's ticket still ends TL_OK (the data is in place).
        ++counters_.notifications_dropped;
    }
}

// ---- publishing

size_t RequestPipeline::publishAll() {
    size_t moved = 0;
    for (Session *s : sessions_.active()) {
        if (s->completions.corrupt() || s->notifications.corrupt()) {
            if (!s->closing) {
                log_->warn("session {} (pid {}): completion ring cursors corrupted; closing it",
                           s->id, s->cred.pid);
                sessions_.close(*s, "completion rings corrupted by the client");
            }
            continue;
        }
        if (!s->completion_backlog.empty() || !s->notification_backlog.empty()) {
            moved += s->flushBacklog();
        }
        s->publish();
    }
    return moved;
}

}  // namespace tensorlane::sidecar
