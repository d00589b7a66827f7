// The sending side of a verbs session: our writes to one peer.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "net/socket.hpp"
#include "transport/verbs/verbs_transport.hpp"
#include "transport/verbs/wc_status.hpp"

namespace tensorlane::sidecar {

namespace {

/// Writes below this go over one QP (chosen in turn); larger ones are striped over all of them.
constexpr uint64_t kStripeMinBytes = 256 * 1024;
/// A signalled work request at least every this many, so unsignalled ones cannot fill a send
/// queue with nothing that would ever report room.
constexpr uint32_t kSignalEvery = 16;
/// How long a write may wait for the key of a region the peer described (the KEY_ADD follows
/// the REGION_ADD on the same connection; this only bounds a peer that never sends it).
constexpr int64_t kKeyWaitMs = 5000;

// wr_id: the write's sequence number, the stripe, and what the completion means.
constexpr uint64_t kWrFinal = 1;       // the last WR of a stripe (a WRITE_WITH_IMM)
constexpr uint64_t kWrSignalled = 2;   // a signalled WR in the middle (frees queue room)
constexpr uint64_t kWrDescriptor = 4;  // the descriptor write
uint64_t wrId(uint64_t seq, uint32_t stripe, uint64_t flags) {
    return seq << 16 | uint64_t{stripe} << 3 | flags;
}
uint64_t seqOfWr(uint64_t id) {
    return id >> 16;
}

}  // namespace

SendSession::SendSession(VerbsTransport &t, PeerId peer, std::shared_ptr<ibv_pd> pd)
    : t_(t), peer_(peer), pd_(pd), mrs_(pd, t.registrar(), MrCache::Scope::kAllocation) {}

SendSession::~SendSession() {
    // QPs before the CQ, MRs before the PD (the members' order does the rest).
    qps_.clear();
    cq_.reset();
    staging_mr_.reset();
}

Status SendSession::create(uint32_t nqps) {
    const FabricSelection &sel = t_.selection();
    params_ =
        t_.qpParams(t_.config().trafficClass(), t_.config().fabric.pfc_priority, sel.path_mtu);
    params_.max_recv_wr = 1;  // nothing is ever received on a sending QP
    ibv_cq *cq =
        ibv_create_cq(t_.device().context(), static_cast<int>(nqps * params_.max_send_wr + 16),
                      this, t_.device().channel(), 0);
    if (cq == nullptr) {
        return {Code::kInternal, std::string("ibv_create_cq: ") + std::strerror(errno)};
    }
    cq_.reset(cq);
    for (uint32_t i = 0; i < nqps; ++i) {
        QpState q;
        if (Status s = createRcQp(pd_.get(), cq_.get(), cq_.get(), params_, &q.qp); !s.isOk()) {
            return s;
        }
        // No remote access at all: nothing may write into or read from the sending side.
        if (Status s = qpToInit(q.qp.get(), params_, 0); !s.isOk()) {
            return s;
        }
        q.local = QpEndpoint{q.qp->qp_num, randomPsn()};
        qps_.push_back(std::move(q));
    }
    chains_.resize(nqps);
    for (Chain &c : chains_) {
        c.wrs.reserve(64);
        c.sges.reserve(64);
    }
    return Status::ok();
}

VerbsBlob SendSession::blob() const {
    VerbsBlob b;
    b.gid = t_.selection().gid.raw;
    b.mtu_bytes = mtuBytes(params_.path_mtu);
    b.traffic_class = params_.traffic_class;
    b.sl = params_.sl;
    for (const QpState &q : qps_) {
        b.qps.push_back(q.local);
    }
    return b;
}

Status SendSession::connect(const VerbsBlob &remote) {
    if (remote.qps.size() != qps_.size()) {
        return {Code::kInvalid, "the receiver has " + std::to_string(remote.qps.size()) +
                                    " queue pairs for our " + std::to_string(qps_.size())};
    }
    if (remote.ring_slots == 0 || remote.ring_slots > 65536 || remote.ring_rkey == 0) {
        return {Code::kInvalid, "the receiver announced no usable descriptor ring"};
    }
    // Path MTU: the lower of ours and the receiver's (which already took its own port's).
    params_.path_mtu = mtuEnum(std::min(mtuBytes(params_.path_mtu), remote.mtu_bytes));
    for (size_t i = 0; i < qps_.size(); ++i) {
        if (Status s = qpToRtr(qps_[i].qp.get(), params_, remote.qps[i], remote.gid); !s.isOk()) {
            return s;
        }
        if (Status s = qpToRts(qps_[i].qp.get(), params_, qps_[i].local.psn); !s.isOk()) {
            return s;
        }
    }
    remote_ = remote;
    staging_.assign(remote.ring_slots, WriteDescriptor{});
    ibv_mr *mr =
        ibv_reg_mr(pd_.get(), staging_.data(), staging_.size() * sizeof(WriteDescriptor), 0);
    if (mr == nullptr) {
        return {Code::kInternal, std::string("ibv_reg_mr (descriptors): ") + std::strerror(errno)};
    }
    staging_mr_.reset(mr);
    connected_ = true;
    return Status::ok();
}

SendSession::Write *SendSession::find(uint64_t seq) {
    if (writes_.empty() || seq < writes_.front().seq) {
        return nullptr;
    }
    const uint64_t i = seq - writes_.front().seq;
    return i < writes_.size() ? &writes_[i] : nullptr;
}

Status SendSession::post(const WriteOp &op) {
    if (!connected_) {
        return {Code::kPeer, "the verbs session is not connected yet"};
    }
    const size_t window = std::min<size_t>(t_.config().tcp.window, remote_.ring_slots);
    if (writes_.size() >= window) {
        return {Code::kAgain, "window full"};
    }
    // A descriptor slot is free again only once the receiver consumed the write that used it.
    if (next_seq_ - 1 - credited_ >= remote_.ring_slots) {
        return {Code::kAgain, "waiting for descriptor credits"};
    }
    if (keys_revoked_.count(op.remote_region) != 0 ||
        std::find(keys_revoking_.begin(), keys_revoking_.end(), op.remote_region) !=
            keys_revoking_.end()) {
        return {Code::kNotFound, "the peer revoked the region"};
    }
    auto key = keys_.find(op.remote_region);
    if (key == keys_.end()) {
        // The KEY_ADD comes on the verbs channel, the REGION_ADD on the peer layer's control
        // connection: either may be first. A peer that never sends the key must not hold the
        // write (and its ticket) forever.
        const int64_t now = monotonicMs();
        auto [w, first] = key_waits_.try_emplace(op.remote_region, now);
        if (!first && now - w->second > kKeyWaitMs) {
            return {Code::kNotFound,
                    "the peer never made the region writable for us (no key "
                    "within " +
                        std::to_string(kKeyWaitMs) + " ms)"};
        }
        return {Code::kAgain, "waiting for the region's key"};
    }
    key_waits_.erase(op.remote_region);
    if (!withinKey(key->second, op.dst_offset, op.bytes)) {
        return {Code::kInvalid, "the write is out of the remote region's bounds"};
    }
    // A message reads no memory of ours (its bytes travel in the descriptor): no source MR.
    MrView src;
    if (op.message.empty()) {
        std::string error;
        src = mrs_.get(*op.src, 0, &error);
        if (src.mr == nullptr) {
            if (!error.empty()) {
                return {Code::kInternal, error};
            }
            return {Code::kAgain, "registering the source"};
        }
    }
    Write w;
    w.seq = next_seq_++;
    w.op = op;
    w.key = key->second;
    w.src = src;
    w.message = !op.message.empty();
    const uint32_t n = static_cast<uint32_t>(qps_.size());
    if (w.message) {
        // One stripe of no data: the descriptor itself is the message's WRITE_WITH_IMM.
        w.stripes.push_back(Stripe{static_cast<uint32_t>(next_qp_++ % n), 0, 0, 0});
        ++messages_sent_;
    } else if (op.bytes < kStripeMinBytes || n == 1) {
        w.stripes.push_back(Stripe{static_cast<uint32_t>(next_qp_++ % n), 0, op.bytes, 0});
    } else {
        const uint64_t per = ((op.bytes + n - 1) / n + 4095) & ~uint64_t{4095};
        for (uint32_t i = 0; i < n && uint64_t{i} * per < op.bytes; ++i) {
            const uint64_t b = uint64_t{i} * per;
            w.stripes.push_back(Stripe{i, b, std::min(op.bytes, b + per), b});
        }
    }
    ++key_users_[op.remote_region];
    writes_.push_back(std::move(w));
    std::string post_error;
    if (!postWrite(writes_.back(), &post_error)) {
        // The QP refused the work request (it is in the error state): the session fails and
        // every write in it, this one included, ends with TL_EPEER.
        t_.link().failSession(peer_, SessionSide::kOut, post_error);
    }
    return Status::ok();
}

bool SendSession::postWrite(Write &w, std::string *error) {
    const uint32_t max_wr = std::min<uint32_t>(t_.device().maxMessage(), 1u << 30);
    // Work requests per QP, chained, posted with one ibv_post_send each. The chains are the
    // session's, cleared here: no allocation on the data path once they have grown.
    std::vector<Chain> &chains = chains_;
    for (Chain &c : chains) {
        c.wrs.clear();
        c.sges.clear();
    }
    // Small writes of host memory go inline: the HCA copies them at post time instead of
    // reading them by DMA afterwards (not CUDA memory: the CPU cannot read it).
    const bool host_src = w.op.src && w.op.src->kind == MemoryKind::kHost;
    auto room = [&](uint32_t qp) {
        const QpState &q = qps_[qp];
        return params_.max_send_wr - q.outstanding - static_cast<uint32_t>(chains[qp].wrs.size());
    };
    auto add = [&](uint32_t qp, ibv_send_wr wr, ibv_sge sge, bool final) {
        QpState &q = qps_[qp];
        ++q.since_signal;
        const bool signal = final || q.since_signal >= kSignalEvery || room(qp) <= 1;
        if (signal) {
            wr.send_flags |= IBV_SEND_SIGNALED;
            if (!final) {
                wr.wr_id |= kWrSignalled;
            }
            q.signalled.emplace_back(wr.wr_id, q.since_signal);
            q.since_signal = 0;
        }
        chains[qp].sges.push_back(sge);
        chains[qp].wrs.push_back(wr);
    };
    const uint32_t imm = WireImm::encode(w.seq, static_cast<uint32_t>(w.stripes.size()));
    if (!w.descriptor_posted) {
        const uint32_t qp = w.stripes.front().qp;
        if (room(qp) < (w.message ? 1u : 2u)) {
            return true;  // later, when the queue has room
        }
        const uint32_t slot = static_cast<uint32_t>(w.seq % remote_.ring_slots);
        WriteDescriptor &d = staging_[slot];
        d.seq = w.seq;
        d.region = w.op.remote_region;
        d.offset = w.op.dst_offset;
        d.bytes = w.op.bytes;
        d.imm = w.op.imm;
        d.stripes = static_cast<uint32_t>(w.stripes.size());
        d.flags = (w.op.silent ? kDescSilent : 0u) | (w.message ? kDescMessage : 0u);
        d.message_bytes = static_cast<uint32_t>(w.op.message.size());  // <= 512: post() checked
        if (w.message) {
            std::memcpy(d.message, w.op.message.data(), d.message_bytes);
        }
        d.message_check = w.message ? messageCheck(d.seq, d.message, d.message_bytes) : 0;
        d.check = descriptorCheck(d);
        // A write sends the header alone; a message, the header and its bytes.
        const uint32_t len = static_cast<uint32_t>(kDescHeaderBytes) + d.message_bytes;
        ibv_sge sge{reinterpret_cast<uint64_t>(&d), len, staging_mr_->lkey};
        ibv_send_wr wr{};
        wr.wr_id = wrId(w.seq, 0, kWrDescriptor | (w.message ? kWrFinal : 0));
        wr.opcode = w.message ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        wr.num_sge = 1;
        // Inline where it fits (the header does: max_inline is 64): the HCA copies it at post
        // time. A message that does not fit is read from the staging slot by DMA, at any time
        // until its acknowledgement (retransmissions read it again): the slot is written again
        // only for write seq + ring_slots, which the window (at most ring_slots writes from the
        // oldest not ended) holds back until this one ended.
        wr.send_flags = params_.max_inline >= len ? IBV_SEND_INLINE : 0;
        wr.imm_data = htonl(imm);  // used by a message's WRITE_WITH_IMM only
        wr.wr.rdma.remote_addr = remote_.ring_addr + uint64_t{slot} * sizeof(WriteDescriptor);
        wr.wr.rdma.rkey = remote_.ring_rkey;
        add(qp, wr, sge, w.message);
        w.descriptor_posted = true;
    }
    bool all = true;
    for (uint32_t si = 0; si < w.stripes.size(); ++si) {
        Stripe &st = w.stripes[si];
        while (st.next < st.end && room(st.qp) >= 1) {
            const uint64_t len = std::min<uint64_t>(st.end - st.next, max_wr);
            const bool final = st.next + len == st.end;
            ibv_sge sge{w.src.addr + w.op.src_offset + st.next, static_cast<uint32_t>(len),
                        w.src.mr->lkey};
            ibv_send_wr wr{};
            wr.wr_id = wrId(w.seq, si, final ? kWrFinal : 0);
            wr.opcode = final ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
            wr.num_sge = 1;
            wr.send_flags = host_src && len <= params_.max_inline ? IBV_SEND_INLINE : 0;
            wr.imm_data = htonl(imm);  // network order (ibv_post_send(3))
            wr.wr.rdma.remote_addr = w.key.addr + w.op.dst_offset + st.next;
            wr.wr.rdma.rkey = w.key.rkey;
            add(st.qp, wr, sge, final);
            st.next += len;
        }
        all = all && st.next == st.end;
    }
    w.posted_all = all;
    for (size_t qp = 0; qp < chains.size(); ++qp) {
        Chain &c = chains[qp];
        if (c.wrs.empty()) {
            continue;
        }
        for (size_t i = 0; i < c.wrs.size(); ++i) {
            c.wrs[i].sg_list = &c.sges[i];
            c.wrs[i].next = i + 1 < c.wrs.size() ? &c.wrs[i + 1] : nullptr;
        }
        ibv_send_wr *bad = nullptr;
        // ibv_post_send returns the errno value (ibv_post_send(3)).
        if (int rc = ibv_post_send(qps_[qp].qp.get(), c.wrs.data(), &bad)) {
            char buf[128];
            std::snprintf(buf, sizeof buf, "ibv_post_send on QP 0x%06x: %s", qps_[qp].qp->qp_num,
                          std::strerror(rc));
            *error = buf;
            return false;
        }
        qps_[qp].outstanding += static_cast<uint32_t>(c.wrs.size());
        posted_wrs_ += c.wrs.size();
    }
    return true;
}

void SendSession::pump() {
    for (Write &w : writes_) {
        if (!w.posted_all && !w.done) {
            std::string error;
            if (!postWrite(w, &error)) {
                t_.link().failSession(peer_, SessionSide::kOut, error);
                return;
            }
            if (!w.posted_all) {
                return;  // the queues are full: the writes behind it wait too (order)
            }
        }
    }
}

bool SendSession::onCompletion(const ibv_wc &wc, std::vector<Completion> *done, std::string *error,
                               bool first_error) {
    size_t qp = 0;
    while (qp < qps_.size() && qps_[qp].qp->qp_num != wc.qp_num) {
        ++qp;
    }
    if (qp < qps_.size()) {
        // Completions of one QP come in order: this signalled WR retires itself and the
        // unsignalled ones before it.
        QpState &q = qps_[qp];
        while (!q.signalled.empty()) {
            auto [id, count] = q.signalled.front();
            q.signalled.pop_front();
            q.outstanding -= std::min(q.outstanding, count);
            if (id == wc.wr_id) {
                break;
            }
        }
    }
    Write *w = find(seqOfWr(wc.wr_id));
    if (wc.status != IBV_WC_SUCCESS) {
        ++errors_;
        const WcMeaning m = meaningOf(wc.status);
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s on QP 0x%06x (write %llu)", ibv_wc_status_str(wc.status),
                      wc.qp_num, static_cast<unsigned long long>(seqOfWr(wc.wr_id)));
        if (first_error) {
            *error = std::string(buf) + ": " + m.hint;
        }
        if (w != nullptr && !w->done && wc.status != IBV_WC_WR_FLUSH_ERR) {
            w->code = m.code;
        }
        return false;
    }
    if (w == nullptr || (wc.wr_id & kWrFinal) == 0) {
        return true;
    }
    if (++w->stripes_done == w->stripes.size() && !w->done) {
        // Every stripe's last WR is acknowledged: RC acknowledges a WRITE only once its
        // data is placed at the responder, so the data is in place at the target. A message
        // also waits for the receiver's verdict (its CREDIT): it may have been dropped.
        if (w->message && w->seq > credited_) {
            w->acked = true;
        } else {
            finish(*w, w->code, w->reason, done);
        }
    }
    return true;
}

void SendSession::finish(Write &w, Code code, std::string reason, std::vector<Completion> *done) {
    w.done = true;
    done->push_back(Completion{w.op.op_id, code, std::move(reason), w.op.bytes});
    if (code == Code::kOk) {
        ++completed_writes_;
    }
    if (--key_users_[w.op.remote_region] == 0) {
        key_users_.erase(w.op.remote_region);
    }
}

void SendSession::finishCredited(std::vector<Completion> *done) {
    for (Write &w : writes_) {
        if (w.seq > credited_) {
            break;
        }
        if (w.message && w.acked && !w.done) {
            finish(w, w.code, w.reason, done);
        }
    }
}

bool SendSession::poll(std::vector<Completion> *done, std::string *error) {
    ibv_wc batch[32];
    const int got = ibv_poll_cq(cq_.get(), 32, batch);
    if (got < 0) {
        *error = "ibv_poll_cq failed";
        return false;
    }
    bool ok = true;
    // What arm() found first (it came before the batch), then the batch: no copy, no
    // allocation.
    for (const ibv_wc &wc : stash_) {
        ok = onCompletion(wc, done, error, ok) && ok;
    }
    stash_.clear();
    for (int i = 0; i < got; ++i) {
        ok = onCompletion(batch[i], done, error, ok) && ok;
    }
    while (!writes_.empty() && writes_.front().done) {
        writes_.pop_front();
    }
    // Revocations whose last write ended: tell the receiver its MR may go.
    for (auto it = keys_revoking_.begin(); it != keys_revoking_.end();) {
        if (key_users_.count(*it) == 0) {
            (void)t_.sendMsg(peer_, SessionSide::kOut, VerbsMsg::kKeyDelDone, encodeU64(*it));
            keys_.erase(*it);
            keys_revoked_.insert(*it);
            it = keys_revoking_.erase(it);
        } else {
            ++it;
        }
    }
    return ok;
}

bool SendSession::onMessage(VerbsMsg m, std::span<const uint8_t> payload, std::string *error) {
    switch (m) {
        case VerbsMsg::kKeyAdd: {
            RegionKey k;
            if (!decodeRegionKey(payload, &k) || k.rkey == 0) {
                *error = "malformed KEY_ADD";
                return false;
            }
            // A peer never reuses a region id within one run: a key for a revoked one is a lie.
            if (keys_revoked_.count(k.region) != 0) {
                *error = "KEY_ADD for a region revoked before";
                return false;
            }
            keys_[k.region] = k;
            return true;
        }
        case VerbsMsg::kKeyDel: {
            uint64_t id = 0;
            if (!decodeU64(payload, &id)) {
                *error = "malformed KEY_DEL";
                return false;
            }
            if (keys_.count(id) != 0 && std::find(keys_revoking_.begin(), keys_revoking_.end(),
                                                  id) == keys_revoking_.end()) {
                keys_revoking_.push_back(id);
            }
            return true;
        }
        case VerbsMsg::kCredit: {
            uint64_t consumed = 0;
            if (!decodeU64(payload, &consumed) || consumed < credited_ ||
                consumed > next_seq_ - 1) {
                *error = "CREDIT for descriptors never sent";
                return false;
            }
            credited_ = consumed;
            finishCredited(&t_.completions());
            return true;
        }
        case VerbsMsg::kMessageDropped: {
            uint64_t seq = 0;
            Write *w = decodeU64(payload, &seq) ? find(seq) : nullptr;
            if (w == nullptr || !w->message || w->done || seq <= credited_ ||
                w->code != Code::kOk) {
                *error = "MESSAGE_DROPPED for no message in flight";
                return false;
            }
            w->code = Code::kNotFound;
            w->reason = "the peer's region " + std::to_string(w->op.remote_region) +
                        " is not exposed to us any more: the message was not delivered";
            return true;
        }
        default:
            *error = "unexpected verbs message " + std::to_string(static_cast<uint32_t>(m)) +
                     " on a sending session";
            return false;
    }
}

void SendSession::failAll(Code code, const std::string &reason, std::vector<Completion> *out) {
    for (Write &w : writes_) {
        if (!w.done) {
            w.done = true;
            out->push_back(Completion{w.op.op_id, w.code != Code::kOk ? w.code : code,
                                      w.reason.empty() ? reason : w.reason, w.op.bytes});
        }
    }
    writes_.clear();
    key_users_.clear();
}

bool SendSession::arm() {
    if (!cq_) {
        return true;
    }
    return armCq(cq_.get(), stash_);
}

void SendSession::report(TransportPeerReport *r, nlohmann::json *out) const {
    nlohmann::json &j = *out;
    nlohmann::json qps = nlohmann::json::array();
    for (const QpState &q : qps_) {
        const char *state = qpStateNow(q.qp.get());
        r->send_qps.push_back({q.local.qpn, state});
        char qpn[16];
        std::snprintf(qpn, sizeof qpn, "0x%06x", q.local.qpn);
        qps.push_back({{"qpn", qpn}, {"state", state}, {"outstanding", q.outstanding}});
    }
    r->in_flight = writes_.size();
    r->work_requests = posted_wrs_;
    r->completion_errors = errors_;
    j["qps"] = std::move(qps);
    j["path_mtu"] = mtuBytes(params_.path_mtu);
    j["traffic_class"] = params_.traffic_class;
    j["sl"] = params_.sl;
    j["in_flight"] = r->in_flight;
    j["writes_completed"] = completed_writes_;
    j["messages"] = messages_sent_;
    j["work_requests"] = r->work_requests;
    j["errors"] = r->completion_errors;
    j["keys"] = keys_.size();
    j["mrs"] = mrs_.size();
    j["dmabuf_mrs"] = mrs_.dmabufCount();
    j["credits_free"] = connected_ ? remote_.ring_slots - (next_seq_ - 1 - credited_) : 0;
}

}  // namespace tensorlane::sidecar
