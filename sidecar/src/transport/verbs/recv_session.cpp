// The receiving side of a verbs session: a peer's writes to us.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "logging.hpp"
#include "net/socket.hpp"
#include "transport/verbs/verbs_transport.hpp"
#include "transport/verbs/wc_status.hpp"

namespace tensorlane::sidecar {

namespace {

/// Descriptor slots per session: at least the largest window a sender may use.
constexpr uint32_t kRingSlots = 4096;

}  // namespace

RecvSession::RecvSession(VerbsTransport &t, PeerId peer, std::shared_ptr<ibv_pd> pd,
                         std::string peer_name)
    : t_(t),
      peer_(peer),
      pd_(pd),
      peer_name_(std::move(peer_name)),
      mrs_(pd, t.registrar(), MrCache::Scope::kRegion) {}

RecvSession::~RecvSession() {
    qps_.clear();
    cq_.reset();
    ring_mr_.reset();
    exposed_.clear();
}

Status RecvSession::create(const VerbsBlob &sender) {
    const FabricSelection &sel = t_.selection();
    // The sender's class and SL for our QPs too: our ACKs travel with its data.
    params_ = t_.qpParams(sender.traffic_class, sender.sl, sender.mtu_bytes);
    rq_depth_ = std::min<uint32_t>(std::min<uint32_t>(t_.config().tcp.window, kRingSlots) + 64,
                                   t_.device().maxQpWr());
    params_.max_recv_wr = rq_depth_;
    params_.max_send_wr = 16;  // the receiving side sends nothing but ACKs (the HCA's own)
    const uint32_t n = static_cast<uint32_t>(sender.qps.size());
    // Room for the receive completions and for the GDR flush's READs (gdr_flush.hpp).
    ibv_cq *cq = ibv_create_cq(t_.device().context(), static_cast<int>(n * (rq_depth_ + 16) + 16),
                               this, t_.device().channel(), 0);
    if (cq == nullptr) {
        return {Code::kInternal, std::string("ibv_create_cq: ") + std::strerror(errno)};
    }
    cq_.reset(cq);
    ring_.assign(kRingSlots, WriteDescriptor{});
    window_ = RecvWindow(kRingSlots);
    ibv_mr *mr = ibv_reg_mr(pd_.get(), ring_.data(), ring_.size() * sizeof(WriteDescriptor),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (mr == nullptr) {
        return {Code::kInternal,
                std::string("ibv_reg_mr (descriptor ring): ") + std::strerror(errno)};
    }
    ring_mr_.reset(mr);
    outstanding_.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i) {
        verbs_detail::QpPtr qp;
        if (Status s = createRcQp(pd_.get(), cq_.get(), cq_.get(), params_, &qp); !s.isOk()) {
            return s;
        }
        // Remote writes only: nothing here is remotely readable (DESIGN.md, "remote access is
        // write-only on exposed ranges").
        if (Status s =
                qpToInit(qp.get(), params_, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
            !s.isOk()) {
            return s;
        }
        local_.push_back(QpEndpoint{qp->qp_num, randomPsn()});
        qps_.push_back(std::move(qp));
        // Receive WQEs before the sender can send: a WRITE_WITH_IMM that finds none is an RNR
        // NAK. Zero-length: the immediate needs no buffer.
        postRecvs(i, rq_depth_);
    }
    reposts_.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i) {
        if (Status s = qpToRtr(qps_[i].get(), params_, sender.qps[i], sender.gid); !s.isOk()) {
            return s;
        }
        if (Status s = qpToRts(qps_[i].get(), params_, local_[i].psn); !s.isOk()) {
            return s;
        }
    }
    (void)sel;
    return Status::ok();
}

void RecvSession::postRecvs(size_t qp, uint32_t n) {
    // Reused: after the first full post this never allocates.
    std::vector<ibv_recv_wr> &wrs = recv_scratch_;
    wrs.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
        wrs[i].wr_id = qp;
        wrs[i].sg_list = nullptr;
        wrs[i].num_sge = 0;
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr *bad = nullptr;
    // The WRs before the one that failed were posted (ibv_post_recv(3)).
    const uint32_t posted = ibv_post_recv(qps_[qp].get(), wrs.data(), &bad) == 0 || bad == nullptr
                                ? n
                                : static_cast<uint32_t>(bad - wrs.data());
    outstanding_[qp] += posted;
}

void RecvSession::stop() {
    for (const verbs_detail::QpPtr &qp : qps_) {
        qpToError(qp.get());
    }
}

bool RecvSession::drained() const {
    return std::all_of(outstanding_.begin(), outstanding_.end(), [](uint32_t n) { return n == 0; });
}

VerbsBlob RecvSession::blob() const {
    VerbsBlob b;
    b.gid = t_.selection().gid.raw;
    b.mtu_bytes = mtuBytes(params_.path_mtu);
    b.traffic_class = params_.traffic_class;
    b.sl = params_.sl;
    b.qps = local_;
    b.ring_addr = reinterpret_cast<uint64_t>(ring_.data());
    b.ring_rkey = ring_mr_->rkey;
    b.ring_slots = kRingSlots;
    return b;
}

bool RecvSession::needsFlush(const Region &r) const {
    switch (t_.config().fabric.gdr_flush) {
        case config::GdrFlush::kOn:
            return true;
        case config::GdrFlush::kOff:
            return false;
        case config::GdrFlush::kAuto:
            break;
    }
    return r.kind == MemoryKind::kCuda;
}

unsigned RecvSession::accessFor(const Region &r) const {
    return IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
           (needsFlush(r) ? static_cast<unsigned>(IBV_ACCESS_REMOTE_READ) : 0u);
}

bool RecvSession::startFlush(const Region &r, uint64_t upto, std::string *error) {
    if (!flusher_.ready()) {
        const QpParams p = t_.qpParams(params_.traffic_class, params_.sl, 0);
        if (Status s = flusher_.create(pd_.get(), cq_.get(), p, t_.selection().gid.raw);
            !s.isOk()) {
            *error = "cannot create the GDR flush queue pair: " + s.message();
            return false;
        }
    }
    std::string why;
    const MrView v = mrs_.get(r, accessFor(r), &why);
    if (v.mr == nullptr) {
        *error = "GDR flush: region " + std::to_string(r.id) + " has no MR here" +
                 (why.empty() ? "" : ": " + why);
        return false;
    }
    if (!flusher_.post(v.addr, v.mr->rkey, static_cast<uint32_t>(std::min<uint64_t>(8, r.bytes)),
                       upto)) {
        *error = "GDR flush: ibv_post_send failed";
        return false;
    }
    flush_in_flight_ = true;
    return true;
}

bool RecvSession::deliver(EventSink &sink, std::string *error, bool closing) {
    bool message_done = false;  // a writer waits for our CREDIT to end a message
    for (;;) {
        const RecvWindow::Slot *s = window_.ready();
        if (s == nullptr) {
            break;
        }
        // The window's copy, checked (RecvWindow::onImm): it stays as it is until the slot is
        // used again, which only poll() does.
        const WriteDescriptor &d = s->desc;
        const bool message = (d.flags & kDescMessage) != 0;
        auto r = t_.regions().find(d.region);
        auto e = exposed_.find(d.region);
        const bool usable = r && !r->revoked.load(std::memory_order_acquire) &&
                            r->exposed.load(std::memory_order_acquire) && e != exposed_.end() &&
                            !e->second.revoking;
        // A message places no bytes: the writes before it were flushed as they were consumed
        // (silent ones too, so that a message announcing them finds them visible).
        if (usable && !message && d.seq > flushed_upto_ && needsFlush(*r)) {
            // The owner may read the data as soon as it is told: first make the NIC's writes
            // visible (one READ for every write that is complete by now). Closing: the flush
            // pair is our own and still works, so wait for it here.
            if (!flush_in_flight_) {
                uint64_t upto = d.seq;
                while (window_.readyAt(upto + 1)) {
                    ++upto;
                }
                if (!startFlush(*r, upto, error)) {
                    return false;
                }
            }
            if (!closing) {
                break;  // poll() resumes delivery when the READ completes
            }
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
            while (flush_in_flight_ && std::chrono::steady_clock::now() < deadline) {
                ibv_wc wc{};
                if (ibv_poll_cq(cq_.get(), 1, &wc) != 1) {
                    continue;
                }
                if (!flusher_.owns(wc)) {
                    stash_.push_back(wc);  // a receive: poll() takes it next
                    continue;
                }
                flush_in_flight_ = false;
                if (wc.status == IBV_WC_SUCCESS) {
                    flushed_upto_ = std::max(flushed_upto_, wc.wr_id);
                    ++flushes_;
                }
            }
            if (d.seq > flushed_upto_) {
                break;  // cannot make it visible: not notified (its writer was told it landed)
            }
        }
        const uint64_t seq = d.seq;
        switch (judge(d, r.get(), usable)) {
            case Verdict::kDrop:
                // Revoked while the write was on its way: its owner is gone, nobody is told. A
                // message's writer waits for our word: it ends TL_ENOENT.
                ++dropped_;
                if (message) {
                    (void)t_.sendMsg(peer_, SessionSide::kIn, VerbsMsg::kMessageDropped,
                                     encodeU64(seq));
                }
                break;
            case Verdict::kRefuse:
                *error = std::string(message ? "descriptor of message " : "descriptor of write ") +
                         std::to_string(seq) + " is past region " + std::to_string(d.region) +
                         "'s end";
                window_.pop();
                return false;
            case Verdict::kDeliver:
                if (message) {
                    sink.messageArrived(d.region, d.imm, d.offset,
                                        std::span<const uint8_t>(d.message, d.message_bytes),
                                        peer_name_);
                    ++messages_received_;
                } else {
                    if ((d.flags & kDescSilent) == 0) {
                        sink.arrived(d.region, d.imm, d.offset, d.bytes, peer_name_);
                    } else {
                        ++silent_received_;
                    }
                    ++writes_received_;
                    bytes_received_ += d.bytes;
                }
                break;
        }
        message_done = message_done || message;
        window_.pop();
        ++consumed_;
    }
    credit(message_done);
    return true;
}

void RecvSession::credit(bool force) {
    const uint64_t every = window_.slots() / 4;
    if (consumed_ - credit_sent_ >= every || (force && consumed_ != credit_sent_)) {
        if (t_.sendMsg(peer_, SessionSide::kIn, VerbsMsg::kCredit, encodeU64(consumed_)).isOk()) {
            credit_sent_ = consumed_;
        }
    }
}

bool RecvSession::onCompletion(const ibv_wc &wc, std::string *error, bool closing) {
    if (flusher_.owns(wc)) {
        flush_in_flight_ = false;
        if (wc.status != IBV_WC_SUCCESS) {
            *error = std::string("GDR flush READ failed: ") + ibv_wc_status_str(wc.status);
            return false;
        }
        flushed_upto_ = std::max(flushed_upto_, wc.wr_id);
        ++flushes_;
        return true;
    }
    if (wc.wr_id < outstanding_.size() && outstanding_[wc.wr_id] != 0) {
        --outstanding_[wc.wr_id];
    }
    if (wc.status != IBV_WC_SUCCESS && closing) {
        return true;  // the receive queue flushed as the QP went to ERR (stop())
    }
    if (wc.status != IBV_WC_SUCCESS) {
        const WcMeaning m = meaningOf(wc.status);
        char buf[96];
        std::snprintf(buf, sizeof buf, "%s on receiving QP 0x%06x", ibv_wc_status_str(wc.status),
                      wc.qp_num);
        *error = std::string(buf) + ": " + m.hint;
        return false;
    }
    if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM || (wc.wc_flags & IBV_WC_WITH_IMM) == 0) {
        *error = "a receive that is not a write with immediate";
        return false;
    }
    if (wc.wr_id < reposts_.size()) {
        ++reposts_[wc.wr_id];
    }
    return window_.onImm(ntohl(wc.imm_data), ring_.data(), error);
}

bool RecvSession::poll(EventSink &sink, std::string *error, bool closing) {
    ibv_wc batch[32];
    const int got = ibv_poll_cq(cq_.get(), 32, batch);
    if (got < 0) {
        *error = "ibv_poll_cq failed";
        return false;
    }
    bool ok = true;
    // What arm() found first, then the batch: no copy, no allocation.
    for (size_t i = 0; ok && i < stash_.size(); ++i) {
        ok = onCompletion(stash_[i], error, closing);
    }
    stash_.clear();
    for (int i = 0; ok && i < got; ++i) {
        ok = onCompletion(batch[i], error, closing);
    }
    if (!ok) {
        return false;
    }
    // Replenish at once: in steady state a receive queue never runs dry (no RNR NAKs).
    for (size_t qp = 0; qp < reposts_.size(); ++qp) {
        if (reposts_[qp] != 0 && !closing) {
            postRecvs(qp, reposts_[qp]);
        }
        reposts_[qp] = 0;
    }
    if (closing && (got == 32 || !stash_.empty())) {
        // More may be waiting: keep draining (bounded by the CQ's size).
        if (!deliver(sink, error, true)) {
            return false;
        }
        return poll(sink, error, true);
    }
    return deliver(sink, error, closing);
}

void RecvSession::expose(const std::shared_ptr<Region> &r) {
    if (exposed_.count(r->id) != 0) {
        return;
    }
    exposed_[r->id] = Exposed{r};
    sendReadyKeys();
}

void RecvSession::sendReadyKeys() {
    for (auto &[id, e] : exposed_) {
        if (e.key_sent || e.revoking) {
            continue;
        }
        std::string error;
        MrView v = mrs_.get(*e.region, accessFor(*e.region), &error);
        if (v.mr == nullptr) {
            if (!error.empty()) {
                // The region stays unusable for this peer: its writes wait for the key and
                // then fail (kKeyWaitMs at the sender) with the reason in our log.
                e.key_sent = true;
            }
            continue;
        }
        RegionKey k{id, v.addr, v.mr->rkey, e.region->bytes};
        if (t_.sendMsg(peer_, SessionSide::kIn, VerbsMsg::kKeyAdd, encodeRegionKey(k)).isOk()) {
            e.key_sent = true;
        }
    }
}

void RecvSession::revoke(RegionId id) {
    auto it = exposed_.find(id);
    if (it == exposed_.end() || it->second.revoking) {
        return;
    }
    if (!it->second.key_sent) {
        exposed_.erase(it);
        mrs_.release(id);  // the peer never had its key (a registration running ends unused)
        return;
    }
    // The MR stays until the sender says no write of its uses the key any more: deregistering
    // it now would turn its writes in flight into remote access errors that kill the session.
    // But not longer than [security] revoke_timeout_ms: the memory is its owner's again.
    it->second.revoking = true;
    it->second.revoke_by = monotonicMs() + t_.config().security.revoke_timeout_ms;
    ++revoking_;
    (void)t_.sendMsg(peer_, SessionSide::kIn, VerbsMsg::kKeyDel, encodeU64(id));
}

void RecvSession::expireRevocations(int64_t now) {
    for (auto it = exposed_.begin(); it != exposed_.end();) {
        Exposed &e = it->second;
        if (!e.revoking || now < e.revoke_by) {
            ++it;
            continue;
        }
        const RegionId id = it->first;
        verbsLog().warn(
            "peer '{}' did not confirm the revocation of region {} within {} ms: its key is "
            "revoked now (a write of its with it fails on the HCA and ends its session)",
            peer_name_, id, t_.config().security.revoke_timeout_ms);
        it = exposed_.erase(it);
        --revoking_;
        mrs_.release(id);
        t_.countForcedRevocation(peer_);
    }
}

bool RecvSession::onMessage(VerbsMsg m, std::span<const uint8_t> payload, std::string *error) {
    if (m != VerbsMsg::kKeyDelDone) {
        *error = "unexpected verbs message " + std::to_string(static_cast<uint32_t>(m)) +
                 " on a receiving session";
        return false;
    }
    uint64_t id = 0;
    if (!decodeU64(payload, &id)) {
        *error = "malformed KEY_DEL_DONE";
        return false;
    }
    auto it = exposed_.find(id);
    if (it == exposed_.end() || !it->second.revoking) {
        return true;  // late (the deadline took it), repeated or unasked: harmless
    }
    exposed_.erase(it);
    --revoking_;
    mrs_.release(id);  // the region's own MR: its key reaches nothing from now on
    return true;
}

bool RecvSession::arm() {
    return armCq(cq_.get(), stash_);
}

void RecvSession::report(TransportPeerReport *r, nlohmann::json *out) const {
    nlohmann::json &j = *out;
    nlohmann::json qps = nlohmann::json::array();
    for (size_t i = 0; i < qps_.size(); ++i) {
        const char *state = qpStateNow(qps_[i].get());
        r->receive_qps.push_back({local_[i].qpn, state});
        char qpn[16];
        std::snprintf(qpn, sizeof qpn, "0x%06x", local_[i].qpn);
        qps.push_back({{"qpn", qpn}, {"state", state}});
    }
    j["qps"] = std::move(qps);
    j["path_mtu"] = mtuBytes(params_.path_mtu);
    j["traffic_class"] = params_.traffic_class;
    j["writes_received"] = writes_received_;
    j["silent_writes_received"] = silent_received_;
    j["messages_received"] = messages_received_;
    j["bytes_received"] = bytes_received_;
    j["dropped"] = dropped_;
    j["gdr_flushes"] = flushes_;
    j["exposed"] = exposed_.size();
    j["revoking"] = revoking_;
    j["mrs"] = mrs_.size();
    j["dmabuf_mrs"] = mrs_.dmabufCount();
}

}  // namespace tensorlane::sidecar
