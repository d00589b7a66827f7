// kWriteEx requests (tl_write_msg, tl_write_group): the writer's side (the description copied
// out and checked, its parts posted in order, the ticket ended once every part ended or at the
// deadline) and the target's (the records of ex_message.hpp turned into notifications, the
// groups it watches ended at their deadline or when their writer's session closes).
//
// The parts of one request, in the order they are posted to the one peer all of its entries go
// to (transports deliver a peer's writes and messages in that order, transport.hpp):
//
//   tl_write_msg, no deadline:   [the data, silent]  kPayload
//   a group, or a deadline:      kGroupBegin  entries (silent)...  | kGroupEnd once every entry
//                                                                    ended here (or the deadline)
//
// So the target notifies once, after the data: a write's payload record arrives after its data
// landed; a group's end record is posted only when every entry's completion says it is in
// place, and carries the status the writer saw. A group whose writer dies or falls silent is
// ended by the target itself (its session closed, or its deadline plus kGroupGraceMs passed).
#include <algorithm>
#include <cstring>
#include <string>

#include "region_lifecycle.hpp"
#include "request_pipeline.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

namespace {

int64_t steadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

/// Entries (and records) of kWriteEx requests one session may have accepted and not ended:
/// past it the session's ring waits (its writer sees TL_EAGAIN), so no client can make the
/// sidecar hold more than this many queued ops for it.
constexpr uint64_t kMaxExPartsPerSession = 4 * uint64_t{ipc::kMaxGroupEntries};

}  // namespace

// ---- the writer's side

void RequestPipeline::handleEx(Session &s, const ipc::Request &r, uint32_t slot) {
    if ((r.flags & ipc::kRequestGated) != 0) {
        reject(s, r, Code::kInvalid, "a payload or grouped write cannot be stream-ordered");
        return;
    }
    if (r.dst_remote != 0 || r.dst_offset != 0) {
        reject(s, r, Code::kInvalid, "kWriteEx request with fields it does not use");
        return;
    }
    // The description: in a host region of this client's, copied out before anything is read
    // (the client can change it under us).
    auto desc = regions_.find(r.src_region);
    if (!desc || desc->owner != s.id || desc->kind != MemoryKind::kHost || desc->base == nullptr ||
        !desc->contains(r.src_offset, r.bytes) || r.bytes < sizeof(ipc::ExHeader) ||
        r.bytes > ipc::exDescriptionBytes(ipc::kMaxGroupEntries, ipc::kMaxPayload)) {
        reject(s, r, Code::kInvalid, "the description is not inside a host region of this client");
        return;
    }
    std::vector<unsigned char> copy(r.bytes);
    std::memcpy(copy.data(), desc->base + r.src_offset, r.bytes);
    ipc::ExHeader h;
    std::memcpy(&h, copy.data(), sizeof h);
    const auto kind = static_cast<ipc::ExKind>(h.kind);
    if (h.magic != ipc::kExMagic || (kind != ipc::ExKind::kWrite && kind != ipc::ExKind::kGroup) ||
        h.entries > ipc::kMaxGroupEntries || h.payload_bytes > ipc::kMaxPayload || h.flags != 0 ||
        h.timeout_ms < 0 || h.reserved[0] != 0 || h.reserved[1] != 0 ||
        r.bytes != ipc::exDescriptionBytes(h.entries, h.payload_bytes) ||
        (kind == ipc::ExKind::kWrite && h.entries > 1) ||
        (kind == ipc::ExKind::kGroup && h.entries == 0)) {
        reject(s, r, Code::kInvalid, "malformed kWriteEx description");
        return;
    }
    // Where the notification goes: a region of the one peer every entry writes to.
    auto nit = s.remotes.find(h.notify);
    if (nit == s.remotes.end()) {
        reject(s, r, Code::kInvalid, "unknown remote handle (not from tl_lookup)");
        return;
    }
    const RemoteRef notify = nit->second;
    if (h.notify_offset > notify.bytes) {
        reject(s, r, Code::kInvalid, "notification offset past the end of the region");
        return;
    }
    const uint64_t entries_offset = ipc::exEntriesOffset(h.payload_bytes);
    std::vector<WriteOp> parts(h.entries);
    // An entry whose target is gone (revoked, or no longer allowed to this uid) fails alone,
    // with its own status; one wrong on its face fails the request.
    std::vector<Code> refused(h.entries, Code::kOk);
    uint64_t total = 0;
    for (uint32_t i = 0; i < h.entries; ++i) {
        ipc::ExEntry e;
        std::memcpy(&e, copy.data() + entries_offset + i * sizeof(ipc::ExEntry), sizeof e);
        const char *why = "";
        Code code = buildWrite(s, e.src_region, e.src_offset, e.dst_remote, e.dst_offset, e.bytes,
                               0, &parts[i], &why);
        if ((code == Code::kOk || code == Code::kNotFound || code == Code::kPermission) &&
            s.remotes.at(e.dst_remote).peer != notify.peer) {
            code = Code::kInvalid;
            why = "the entries of one request write to one peer (that of the notification)";
        }
        if (code == Code::kNotFound || code == Code::kPermission) {
            refused[i] = code;
            continue;
        }
        if (code != Code::kOk) {
            reject(s, r, code, why);
            return;
        }
        parts[i].silent = true;
        total += e.bytes;
    }
    // The records ride on a message op to the notification's region (checked like a write
    // there, of 0 bytes); their source is the description's region, so the local transport
    // keeps them in this session's order.
    WriteOp carrier;
    carrier.src = desc;
    carrier.dst_offset = h.notify_offset;
    const char *why = "";
    if (Code code = resolveTarget(s, notify, &carrier, &why); code != Code::kOk) {
        reject(s, r, code, why);
        return;
    }

    // Accepted: from here on the request ends exactly once, through endExTicket().
    const uint64_t id = next_ex_++;
    ExOp &x = ex_ops_[id];
    x.session = s.id;
    x.writer_uid = s.cred.uid;
    x.ticket = r.ticket;
    x.slot = slot;
    x.peer = notify.peer;
    x.desc_region = desc->id;
    x.entries_offset = r.src_offset + entries_offset;
    x.entries = h.entries;
    x.status.assign(h.entries, kPendingPart);
    x.grouped = kind == ipc::ExKind::kGroup || h.timeout_ms > 0;
    x.bytes = total;
    if (h.timeout_ms > 0) {
        x.deadline_ms = steadyMs() + h.timeout_ms;
        noteDeadline(x.deadline_ms);
    }
    ExMessage &rec = x.record;
    rec.notify = kind == ipc::ExKind::kGroup ? ipc::NotifyKind::kGroup
                 : h.entries == 0            ? ipc::NotifyKind::kMessage
                                             : ipc::NotifyKind::kWrite;
    rec.group = id;
    rec.entries = h.entries;
    rec.offset = kind == ipc::ExKind::kGroup ? 0 : h.notify_offset;
    rec.bytes = total;
    rec.payload.assign(copy.data() + sizeof h, copy.data() + sizeof h + h.payload_bytes);
    carrier.imm = r.imm;  // the request's immediate: the notification's
    x.carrier = carrier;
    ++s.in_flight;
    s.ex_parts += h.entries + 2;
    if (notify.peer == kLocalPeer) {
        counters_.writes_local += std::max<uint32_t>(h.entries, 1);
    } else {
        counters_.writes_remote += std::max<uint32_t>(h.entries, 1);
    }
    const uint32_t uid = s.cred.uid;
    if (x.grouped) {
        ExMessage begin = rec;
        begin.record = ExRecord::kGroupBegin;
        begin.timeout_ms = static_cast<uint32_t>(h.timeout_ms);
        begin.payload.clear();
        WriteOp op = carrier;
        op.message = encodeExMessage(begin);
        op.more = true;  // its entries follow in this call (WriteOp::more)
        postPart(id, x, std::move(op), kExRecordPart, uid);
    }
    // A transport that takes scatter lists gets one op per (source, target) pair of host
    // regions, its entries as extents: a thousand entries cost about what their bytes do.
    Transport *t =
        notify.peer == kLocalPeer ? transports_.local() : transports_.boundTo(notify.peer);
    const bool scatter = t != nullptr && t->caps().scatter && h.entries > 1;
    std::map<std::pair<RegionId, RegionId>, uint32_t> merged_of;  // region pair -> merged op
    std::vector<WriteOp> merged_ops;
    std::vector<std::vector<Extent>> merged_extents;
    for (uint32_t i = 0; i < h.entries; ++i) {
        parts[i].group_bytes = total;
        if (refused[i] != Code::kOk) {
            x.status[i] = static_cast<int32_t>(refused[i]);
            if (x.first == Code::kOk) {
                x.first = refused[i];
            }
            continue;
        }
        WriteOp &p = parts[i];
        // Local: host at both ends; remote: from host memory, or from GPU memory where the
        // transport stages it (the target lands each extent where it says, in whatever memory
        // its region is).
        const bool from = scatter && (p.src->kind == MemoryKind::kHost ||
                                      (p.peer != kLocalPeer && t->caps().scatter_from_gpu &&
                                       p.src->kind == MemoryKind::kCuda && !p.src->dmabufOnly()));
        if (from && (p.dst ? p.dst->kind == MemoryKind::kHost : p.peer != kLocalPeer)) {
            const auto key = std::make_pair(p.src->id, p.dst ? p.dst->id : p.remote_region);
            auto [it, fresh] = merged_of.emplace(key, static_cast<uint32_t>(merged_ops.size()));
            if (fresh) {
                merged_ops.push_back(p);
                merged_ops.back().bytes = 0;
                merged_extents.emplace_back();
                x.merged.emplace_back();
            }
            merged_ops[it->second].bytes += p.bytes;
            std::vector<Extent> &ext = merged_extents[it->second];
            if (!ext.empty() && ext.back().src_offset + ext.back().bytes == p.src_offset &&
                ext.back().dst_offset + ext.back().bytes == p.dst_offset) {
                ext.back().bytes += p.bytes;  // contiguous at both ends: one range
            } else {
                ext.push_back(Extent{p.src_offset, p.dst_offset, p.bytes});
            }
            x.merged[it->second].push_back(i);
            continue;
        }
        p.more = true;  // more entries, or the payload record, follow in this call
        postPart(id, x, std::move(p), i, uid);
    }
    for (size_t k = 0; k < merged_ops.size(); ++k) {
        WriteOp &op = merged_ops[k];
        op.extents = std::make_shared<const std::vector<Extent>>(std::move(merged_extents[k]));
        op.more = true;
        postPart(id, x, std::move(op), x.entries + static_cast<uint32_t>(k), uid);
    }
    if (!x.grouped) {
        ExMessage payload = rec;
        payload.record = ExRecord::kPayload;
        WriteOp op = carrier;
        op.message = encodeExMessage(payload);
        postPart(id, x, std::move(op), kExRecordPart, uid);
        x.end_posted = true;  // the payload record is its last part
    }
    x.posting = false;
    if (x.outstanding == 0) {
        // Every part ended while we posted (a peer that is down refuses at once).
        if (x.grouped && !x.end_posted) {
            postEnd(id, x, x.first);
        }
        if (x.outstanding == 0) {
            endExTicket(x, x.first);
            settle(id);
        }
    }
}

void RequestPipeline::postPart(uint64_t ex_id, ExOp &x, WriteOp op, uint32_t part,
                               uint32_t writer_uid) {
    op.op_id = next_op_++;
    ++op.src->users;
    if (op.dst) {
        ++op.dst->users;
    }
    PendingOp p{
        x.session, 0,         op.bytes, op.src, op.dst, op.peer, stats_.timing() ? stats_.now() : 0,
        kNoSlot,   writer_uid};
    p.ex = ex_id;
    p.ex_part = part;
    ops_.emplace(op.op_id, std::move(p));
    ++x.outstanding;
    enqueue(std::move(op));  // may end at once (completed() → partEnded())
}

void RequestPipeline::partEnded(const PendingOp &op, Code status) {
    auto it = ex_ops_.find(op.ex);
    if (it == ex_ops_.end()) {
        return;
    }
    ExOp &x = it->second;
    if (op.ex_part != kExRecordPart && op.ex_part < x.entries &&
        x.status[op.ex_part] == kPendingPart) {
        x.status[op.ex_part] = static_cast<int32_t>(status);
    } else if (op.ex_part != kExRecordPart && op.ex_part - x.entries < x.merged.size()) {
        for (uint32_t i : x.merged[op.ex_part - x.entries]) {  // a scattered op's entries
            if (x.status[i] == kPendingPart) {
                x.status[i] = static_cast<int32_t>(status);
            }
        }
    }
    if (status != Code::kOk && x.first == Code::kOk) {
        x.first = status;
    }
    --x.outstanding;
    if (x.posting || x.outstanding != 0) {
        return;
    }
    if (x.grouped && !x.end_posted) {
        // Every entry ended here, each acknowledged by the target: the end record says how.
        postEnd(op.ex, x, x.first);
        if (x.outstanding != 0) {
            return;
        }
    }
    endExTicket(x, x.first);
    settle(op.ex);
}

void RequestPipeline::postEnd(uint64_t ex_id, ExOp &x, Code status) {
    ExMessage end = x.record;
    end.record = ExRecord::kGroupEnd;
    end.status = static_cast<int32_t>(status);
    WriteOp op = x.carrier;
    op.message = encodeExMessage(end);
    x.end_posted = true;
    const bool was_posting = x.posting;
    x.posting = true;  // its failure at once must not end x under us
    postPart(ex_id, x, std::move(op), kExRecordPart, x.writer_uid);
    x.posting = was_posting;
}

void RequestPipeline::endExTicket(ExOp &x, Code status) {
    if (x.ticket_ended) {
        return;
    }
    x.ticket_ended = true;
    Session *s = sessions_.find(x.session);
    if (s == nullptr) {
        return;  // the writer is gone; nothing to tell
    }
    --s->in_flight;
    if (s->closing) {
        return;
    }
    // The entries' statuses, into the description (where it is still this client's memory),
    // before the completion that tells the client to read them.
    auto desc = regions_.find(x.desc_region);
    if (desc && desc->owner == x.session && desc->base != nullptr && x.entries != 0 &&
        desc->contains(x.entries_offset, uint64_t{x.entries} * sizeof(ipc::ExEntry))) {
        for (uint32_t i = 0; i < x.entries; ++i) {
            const int32_t st =
                x.status[i] == kPendingPart ? static_cast<int32_t>(status) : x.status[i];
            std::memcpy(desc->base + x.entries_offset + i * sizeof(ipc::ExEntry) +
                            offsetof(ipc::ExEntry, status),
                        &st, sizeof st);
        }
    }
    if (status == Code::kOk) {
        s->counters.bytes_written += x.bytes;
    }
    completeOrClose(*s, x.ticket, status, status == Code::kOk ? x.bytes : 0, x.slot);
}

void RequestPipeline::settle(uint64_t ex_id) {
    auto it = ex_ops_.find(ex_id);
    if (it == ex_ops_.end() || !it->second.ticket_ended || it->second.outstanding != 0) {
        return;
    }
    if (Session *s = sessions_.find(it->second.session); s != nullptr) {
        const uint64_t parts = it->second.entries + 2;
        s->ex_parts -= std::min(s->ex_parts, parts);
    }
    ex_ops_.erase(it);
}

bool RequestPipeline::exBackPressure(const Session &s) const {
    return s.ex_parts >= kMaxExPartsPerSession;
}

// ---- deadlines

void RequestPipeline::noteDeadline(int64_t at_ms) {
    if (next_deadline_ms_ == 0 || at_ms < next_deadline_ms_) {
        next_deadline_ms_ = at_ms;
    }
}

int RequestPipeline::msToNextDeadline(int cap) const {
    if (next_deadline_ms_ == 0) {
        return cap;
    }
    const int64_t left = next_deadline_ms_ - steadyMs();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, cap));
}

size_t RequestPipeline::pollDeadlines() {
    if (next_deadline_ms_ == 0) {
        return 0;
    }
    const int64_t now = steadyMs();
    if (now < next_deadline_ms_) {
        return 0;
    }
    next_deadline_ms_ = 0;
    size_t ended = 0;
    // The writer's side: the ticket ends kDeadline, the parts still queued here are dropped,
    // and the target hears of it (the end record, behind what is already on the wire).
    std::vector<uint64_t> due;
    for (auto &[id, x] : ex_ops_) {
        if (x.deadline_ms == 0 || x.ticket_ended) {
            continue;
        }
        if (x.deadline_ms <= now) {
            due.push_back(id);
        } else {
            noteDeadline(x.deadline_ms);
        }
    }
    for (uint64_t id : due) {
        auto it = ex_ops_.find(id);
        if (it == ex_ops_.end()) {
            continue;
        }
        ExOp &x = it->second;
        x.posting = true;
        if (auto q = queues_.find(x.peer); q != queues_.end()) {
            std::vector<uint64_t> dropped;
            for (auto qi = q->second.ops.begin(); qi != q->second.ops.end();) {
                auto op = ops_.find(qi->op_id);
                if (op != ops_.end() && op->second.ex == id) {
                    dropped.push_back(qi->op_id);
                    qi = q->second.ops.erase(qi);
                    --queued_;
                } else {
                    ++qi;
                }
            }
            for (uint64_t op_id : dropped) {
                completed(op_id, Code::kDeadline, "the deadline passed");
            }
        }
        x.first = Code::kDeadline;
        endExTicket(x, Code::kDeadline);
        if (!x.end_posted) {
            postEnd(id, x, Code::kDeadline);
        }
        x.posting = false;
        ++ended;
        settle(id);
    }
    // The target's side: a group whose writer never ended it.
    for (auto &[key, g] : in_groups_) {
        if (g.deadline_ms == 0 || g.ended) {
            continue;
        }
        if (g.deadline_ms <= now) {
            failInGroup(g, Code::kDeadline, key.first);
            ++ended;
        } else {
            noteDeadline(g.deadline_ms);
        }
    }
    return ended;
}

// ---- the target's side

void RequestPipeline::messageArrived(RegionId region, uint32_t imm, uint64_t offset,
                                     std::span<const uint8_t> message, std::string_view peer_name) {
    (void)offset;  // the record carries the notification's own
    if (in_local_progress_) {
        // A local record: its completed() follows at once and names the writer.
        releaseHeldArrival(ipc::kWriterUidUnknown);
        HeldArrival a;
        a.region = region;
        a.imm = imm;
        a.peer = peer_name;
        a.message.assign(message.begin(), message.end());
        held_arrival_ = std::move(a);
        return;
    }
    deliverRecord(region, imm, message, peer_name, ipc::kWriterUidPeer);
}

void RequestPipeline::deliverRecord(RegionId region, uint32_t imm, std::span<const uint8_t> message,
                                    std::string_view peer_name, uint32_t writer_uid) {
    ExMessage m;
    std::string why;
    if (!decodeExMessage(message, &m, &why)) {
        ++records_refused_;
        if (records_refused_ <= 10 || (records_refused_ & (records_refused_ - 1)) == 0) {
            log_->warn("a record from '{}' refused: {}{}", peer_name, why,
                       records_refused_ > 10 ? " [rate-limited]" : "");
        }
        return;
    }
    ipc::Notification n{};
    n.region = region;
    n.imm = imm;
    n.writer_uid = writer_uid;
    ipc::copyName(n.peer, sizeof n.peer, std::string(peer_name).c_str());
    n.kind = static_cast<uint8_t>(m.notify);
    n.offset = m.offset;
    n.bytes = m.bytes;
    n.entries = m.entries;
    const auto key = std::make_pair(std::string(peer_name), m.group);
    switch (m.record) {
        case ExRecord::kPayload:
            notifyOwner(region, n, m.payload);
            return;
        case ExRecord::kGroupBegin: {
            // Watched until its end record; bounded: a peer that only begins groups gets its
            // later ones delivered when they end, unwatched.
            if (in_groups_.size() >= kMaxExPartsPerSession) {
                ++records_refused_;
                return;
            }
            InGroup g;
            g.region = region;
            g.imm = imm;
            g.writer_uid = writer_uid;
            g.notify = m.notify;
            g.entries = m.entries;
            g.offset = m.offset;
            if (m.timeout_ms != 0) {
                g.deadline_ms = steadyMs() + m.timeout_ms + kGroupGraceMs;
                noteDeadline(g.deadline_ms);
            }
            in_groups_[key] = g;
            return;
        }
        case ExRecord::kGroupEnd: {
            auto it = in_groups_.find(key);
            if (it != in_groups_.end()) {
                const bool ended = it->second.ended;
                in_groups_.erase(it);
                if (ended) {
                    return;  // the target ended it already (its deadline)
                }
            }
            n.status = m.status;
            notifyOwner(region, n, m.payload);
            return;
        }
    }
}

void RequestPipeline::failInGroup(InGroup &g, Code status, std::string_view peer_name) {
    g.ended = true;
    ipc::Notification n{};
    n.region = g.region;
    n.imm = g.imm;
    n.writer_uid = g.writer_uid;
    ipc::copyName(n.peer, sizeof n.peer, std::string(peer_name).c_str());
    n.kind = static_cast<uint8_t>(g.notify);
    n.offset = g.offset;
    n.entries = g.entries;
    n.status = static_cast<int32_t>(status);
    log_->info("a group of {} entries from '{}' ended here: {}", g.entries, peer_name,
               ipc::codeName(status));
    notifyOwner(g.region, n, {});
}

void RequestPipeline::inboundClosed(std::string_view peer_name) {
    const std::string name(peer_name);
    auto it = in_groups_.lower_bound(std::make_pair(name, uint64_t{0}));
    while (it != in_groups_.end() && it->first.first == name) {
        if (!it->second.ended) {
            failInGroup(it->second, Code::kPeer, name);
        }
        it = in_groups_.erase(it);
    }
}

void RequestPipeline::notifyOwner(RegionId region, const ipc::Notification &n,
                                  std::span<const uint8_t> payload) {
    stats_.received(std::string_view(n.peer), n.bytes);
    auto r = regions_.find(region);
    Session *s = r ? sessions_.find(r->owner) : nullptr;
    if (!s || s->closing) {
        ++counters_.notifications_dropped;
        return;
    }
    if (s->notify(n, payload)) {
        ++counters_.notifications;
    } else {
        ++counters_.notifications_dropped;
    }
}

}  // namespace tensorlane::sidecar
