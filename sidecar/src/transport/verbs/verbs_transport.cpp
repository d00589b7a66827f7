#include "transport/verbs/verbs_transport.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "logging.hpp"
#include "net/frame_reader.hpp"
#include "net/socket.hpp"

namespace tensorlane::sidecar {

spdlog::logger &verbsLog() {
    static const std::shared_ptr<spdlog::logger> log = sidecarLogger("verbs");
    return *log;
}

VerbsTransport::VerbsTransport(const config::Config &cfg, RegionTable &regions,
                               FabricSelection selection)
    : cfg_(cfg),
      regions_(regions),
      sel_(std::move(selection)),
      busy_(cfg.ipc.poll_mode == config::PollMode::kBusy) {}

VerbsTransport::~VerbsTransport() {
    // Sessions (QPs, CQs, MRs, PDs) before the device they were made on, their CQs' events
    // acknowledged first.
    if (device_) {
        (void)device_->drainCqEvents();
    }
    peers_.clear();
    dead_out_.clear();
    dead_in_.clear();
    closing_in_.clear();
    dead_conns_.clear();  // connections leave chan_poller_ as they go: before it does
}

Status VerbsTransport::init() {
    if (Status s = VerbsDevice::open(sel_, &device_); !s.isOk()) {
        return s;
    }
    if (Status s = registrar_.start(); !s.isOk()) {
        return s;
    }
    if (int rc = chan_poller_.open(); rc != 0) {
        return {Code::kInternal, std::string("epoll_create1: ") + std::strerror(rc)};
    }
    available_ = device_->portState() == IBV_PORT_ACTIVE;
    verbsLog().info("verbs transport on {} (max message {} bytes, {} QPs per peer)", sel_.summary(),
                    device_->maxMessage(), cfg_.fabric.qps_per_peer);
    return Status::ok();
}

QpParams VerbsTransport::qpParams(uint8_t tc, uint8_t sl, uint32_t peer_mtu) const {
    QpParams p;
    p.port = static_cast<uint8_t>(sel_.port);
    p.sgid_index = static_cast<uint8_t>(sel_.gid_index);
    const uint32_t ours = sel_.path_mtu != 0 ? sel_.path_mtu : cfg_.fabric.mtu;
    p.path_mtu = mtuEnum(peer_mtu != 0 ? std::min(ours, peer_mtu) : ours);
    p.traffic_class = tc;
    p.sl = sl;
    p.timeout = cfg_.fabric.timeout;
    p.retry_cnt = cfg_.fabric.retry_cnt;
    p.rnr_retry = cfg_.fabric.rnr_retry;
    p.min_rnr_timer = cfg_.fabric.min_rnr_timer;
    p.max_send_wr = std::min<uint32_t>(1024, device_->maxQpWr());
    p.max_recv_wr = 16;
    p.max_inline = 64;
    return p;
}

std::shared_ptr<ibv_pd> VerbsTransport::newPd() {
    ibv_pd *pd = ibv_alloc_pd(device_->context());
    if (pd == nullptr) {
        return nullptr;
    }
    return std::shared_ptr<ibv_pd>(pd, [](ibv_pd *p) { (void)ibv_dealloc_pd(p); });
}

std::vector<uint8_t> VerbsTransport::localBlob(PeerId peer, SessionSide side) {
    PeerData &p = peers_[peer];
    if (side == SessionSide::kIn) {
        return p.in ? encodeVerbsBlob(p.in->blob()) : std::vector<uint8_t>();
    }
    if (!gidMatchesDevice()) {
        // The GID table changed and no event said so yet (or it is on its way): read it again
        // rather than build QPs on an address this port no longer has.
        verbsLog().warn("GID index {} of {} is not {} any more: reading the table again",
                        sel_.gid_index, sel_.device, sel_.gid_text);
        available_ = false;
        reselect_at_ = monotonicMs() + kSettleMs;
        return {};
    }
    // The sending side's QPs exist before SELECT: their numbers go in it.
    if (p.out) {
        dead_out_.push_back(std::move(p.out));
    }
    auto pd = newPd();
    if (!pd) {
        verbsLog().error("ibv_alloc_pd: {}", std::strerror(errno));
        return {};
    }
    auto out = std::make_unique<SendSession>(*this, peer, pd);
    if (Status s = out->create(cfg_.fabric.qps_per_peer); !s.isOk()) {
        verbsLog().error("peer {}: cannot create queue pairs: {}", link_->peerName(peer),
                         s.message());
        return {};
    }
    p.out = std::move(out);
    p.out_connected = false;
    return encodeVerbsBlob(p.out->blob());
}

TransportCaps VerbsTransport::caps() const {
    TransportCaps c;
    c.host_memory = true;
    c.cuda_memory = true;  // GPUDirect RDMA: dma-buf or peermem MRs (registrar.hpp)
    c.remote = true;
    c.ordered = true;
    c.wire_id = kTransportVerbs;
    c.link_mbps = sel_.rate_mbps;
    c.nic_pci_path = sel_.pci_path;
    return c;
}

Status VerbsTransport::openSession(PeerId peer, SessionSide side, const SessionInfo &info,
                                   uint32_t *channels) {
    *channels = 0;
    PeerData &p = peers_[peer];
    VerbsBlob remote;
    std::string error;
    if (!decodeVerbsBlob(info.remote_blob, &remote, &error)) {
        return {Code::kInvalid, error};
    }
    if (side == SessionSide::kOut) {
        if (!p.out) {
            return {Code::kInternal, "no queue pairs were made for this session"};
        }
        if (Status s = p.out->connect(remote); !s.isOk()) {
            return s;
        }
        p.out_connected = true;
        verbsLog().info("peer '{}': sending over {} RC QPs, path MTU {}, traffic class {}",
                        info.peer_name, remote.qps.size(),
                        std::min(remote.mtu_bytes, sel_.path_mtu), cfg_.trafficClass());
        // Ready once the verbs channel (keys and credits) is up too: adoptChannel().
        closeChannel(p.out_ch);
        link_->openChannels(peer, 1);
        return Status::ok();
    }
    if (!gidMatchesDevice()) {
        available_ = false;
        reselect_at_ = monotonicMs() + kSettleMs;
        return {Code::kPeer, "GID index " + std::to_string(sel_.gid_index) + " of " + sel_.device +
                                 " is not " + sel_.gid_text + " any more (reading it again)"};
    }
    auto pd = newPd();
    if (!pd) {
        return {Code::kInternal, std::string("ibv_alloc_pd: ") + std::strerror(errno)};
    }
    auto in = std::make_unique<RecvSession>(*this, peer, pd, info.peer_name);
    if (Status s = in->create(remote); !s.isOk()) {
        return s;
    }
    if (p.in) {
        retire(std::move(p.in));  // what its QPs acknowledged is still delivered
    }
    closeChannel(p.in_ch);
    p.in = std::move(in);
    *channels = 1;  // the verbs channel
    // The regions exposed now come through regionExposed() right after this returns, like
    // later ones: each goes into this peer's protection domain, its key follows once registered.
    verbsLog().info("peer '{}': receiving over {} RC QPs (its traffic class {})", info.peer_name,
                    remote.qps.size(), remote.traffic_class);
    return Status::ok();
}

void VerbsTransport::closeSession(PeerId peer, SessionSide side, Code code,
                                  const std::string &reason) {
    auto it = peers_.find(peer);
    if (it == peers_.end()) {
        return;
    }
    PeerData &p = it->second;
    if (side == SessionSide::kOut) {
        closeChannel(p.out_ch);
    } else {
        closeChannel(p.in_ch);
    }
    if (side == SessionSide::kOut && p.out) {
        p.out->failAll(code, reason, &completions_);
        dead_out_.push_back(std::move(p.out));
        p.out_connected = false;
    } else if (side == SessionSide::kIn && p.in) {
        // Writes whose every stripe has come were acknowledged to their writer by our HCA:
        // their owners are still told (progress() drains it).
        retire(std::move(p.in));
    }
}

void VerbsTransport::retire(std::unique_ptr<RecvSession> in) {
    in->stop();
    closing_in_.push_back(Closing{std::move(in), monotonicMs() + kDrainMs});
}

bool VerbsTransport::onMessage(PeerId peer, SessionSide side, uint64_t arg,
                               std::span<const uint8_t> payload, std::string *error) {
    const uint32_t m = verbsMsgOf(arg);
    auto it = peers_.find(peer);
    if (m == 0 || it == peers_.end()) {
        *error = "a verbs channel frame that is no verbs message";
        return false;
    }
    PeerData &p = it->second;
    if (side == SessionSide::kOut) {
        if (!p.out) {
            return true;  // the session is being torn down
        }
        return p.out->onMessage(static_cast<VerbsMsg>(m), payload, error);
    }
    if (!p.in) {
        return true;
    }
    return p.in->onMessage(static_cast<VerbsMsg>(m), payload, error);
}

Status VerbsTransport::sendMsg(PeerId peer, SessionSide side, VerbsMsg m,
                               std::vector<uint8_t> payload) {
    auto it = peers_.find(peer);
    if (it == peers_.end() || (side == SessionSide::kOut ? !it->second.out : !it->second.in)) {
        return {Code::kPeer, "no verbs session"};
    }
    Channel &ch = side == SessionSide::kOut ? it->second.out_ch : it->second.in_ch;
    if (!ch.conn) {
        ch.early.emplace_back(m, std::move(payload));
        return Status::ok();
    }
    if (!ch.conn->isOpen()) {
        return {Code::kPeer, "the verbs channel is closed"};
    }
    ch.conn->queueFrame(FrameType::kTransport, verbsMsgArg(m), payload);
    chan_output_ = true;
    return Status::ok();
}

void VerbsTransport::adoptChannel(PeerId peer, SessionSide side, uint32_t index,
                                  std::unique_ptr<Connection> conn) {
    auto it = peers_.find(peer);
    const bool live = it != peers_.end() && (side == SessionSide::kOut ? it->second.out != nullptr
                                                                       : it->second.in != nullptr);
    Channel *ch = !live                       ? nullptr
                  : side == SessionSide::kOut ? &it->second.out_ch
                                              : &it->second.in_ch;
    if (ch == nullptr || index != 0 || ch->conn) {
        conn->close();
        dead_conns_.push_back(std::move(conn));
        return;
    }
    conn->rebind(chan_poller_);
    conn->peer = peer;
    conn->index = 0;
    conn->role = side == SessionSide::kOut ? ConnRole::kOutData : ConnRole::kInData;
    if (conn->buffered() != 0) {
        chan_buffered_ = true;  // messages that came with READY: read at the next progress()
    }
    ch->conn = std::move(conn);
    for (auto &[m, payload] : std::exchange(ch->early, {})) {
        ch->conn->queueFrame(FrameType::kTransport, verbsMsgArg(m), payload);
    }
    chan_output_ = true;
    if (side == SessionSide::kOut && it->second.out_connected) {
        link_->sessionReady(peer);  // QPs connected and the channel up: writes may go
    }
}

void VerbsTransport::readable(int fd) {
    if (fd == chan_poller_.fd()) {
        chan_readable_ = true;
    }
}

void VerbsTransport::closeChannel(Channel &ch) {
    ch.early.clear();
    if (ch.conn) {
        ch.conn->dropOutput();
        ch.conn->close();
        dead_conns_.push_back(std::move(ch.conn));
    }
}

void VerbsTransport::onChannelEvent(Connection &c, uint32_t events, int64_t now) {
    const PeerId peer = c.peer;
    const SessionSide side = c.role == ConnRole::kOutData ? SessionSide::kOut : SessionSide::kIn;
    if ((events & EPOLLOUT) != 0) {
        if (int rc = c.flush(now); rc != 0) {
            fail(peer, side, std::string("verbs channel: ") + std::strerror(rc));
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    const FramesRead r = readFrames(
        c, now, kMaxVerbsMsgBytes, [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            if (h.type != FrameType::kTransport) {
                fail(peer, side,
                     "protocol error on the verbs channel: unexpected " +
                         frameTypeName(static_cast<uint8_t>(h.type)));
                return FrameStep::kStop;
            }
            std::string error;
            if (!onMessage(peer, side, h.arg, payload, &error)) {
                fail(peer, side, "protocol error: " + error);
                return FrameStep::kStop;  // the session is gone; its channel with it
            }
            return FrameStep::kNext;
        });
    if (r.end == FramesRead::End::kBad) {
        fail(peer, side, "protocol error on the verbs channel: " + r.error);
    } else if (r.end == FramesRead::End::kClosed) {
        fail(peer, side, "verbs channel closed by the peer");
    } else if (r.end == FramesRead::End::kFailed) {
        fail(peer, side, std::string("verbs channel: ") + std::strerror(r.rc));
    }
}

void VerbsTransport::pumpChannels(int64_t now) {
    if (chan_buffered_) {
        chan_buffered_ = false;
        std::vector<Connection *> held;
        for (auto &[id, p] : peers_) {
            for (Channel *ch : {&p.out_ch, &p.in_ch}) {
                if (ch->conn && ch->conn->isOpen() && ch->conn->buffered() != 0) {
                    held.push_back(ch->conn.get());
                }
            }
        }
        // Each stays alive until the end of this turn even if a message fails its session.
        for (Connection *c : held) {
            if (c->isOpen()) {
                onChannelEvent(*c, EPOLLIN, now);
            }
        }
    }
    if (chan_readable_) {
        chan_readable_ = false;
        epoll_event evs[32];
        const int n = chan_poller_.wait(evs, 32, 0);
        for (int i = 0; i < n; ++i) {
            if (Connection *c = chan_poller_.find(evs[i].data.u64)) {
                onChannelEvent(*c, evs[i].events, now);
            }
        }
        if (n == 32) {
            chan_readable_ = true;  // more may wait: look again next turn
        }
    }
    if (chan_output_) {
        chan_output_ = false;
        std::vector<std::pair<PeerId, SessionSide>> broken;
        for (auto &[id, p] : peers_) {
            for (Channel *ch : {&p.out_ch, &p.in_ch}) {
                if (ch->conn && ch->conn->isOpen() && ch->conn->hasOutput()) {
                    if (ch->conn->flush(now) != 0) {
                        broken.emplace_back(id,
                                            ch == &p.out_ch ? SessionSide::kOut : SessionSide::kIn);
                    }
                }
            }
        }
        for (auto &[id, side] : broken) {
            fail(id, side, "cannot send on the verbs channel");
        }
    }
}

Status VerbsTransport::post(const WriteOp &op) {
    if (Status st = checkMessage(op); !st.isOk()) {
        return st;  // a write of no bytes would have its descriptor refused
    }
    auto it = peers_.find(op.peer);
    if (it == peers_.end() || !it->second.out || !it->second.out_connected) {
        return {Code::kPeer, "no verbs session to peer " + std::to_string(op.peer) + " is up"};
    }
    if (!available_) {
        return {Code::kPeer, "the RDMA port is down"};
    }
    return it->second.out->post(op);
}

void VerbsTransport::regionExposed(PeerId peer, const std::shared_ptr<Region> &r) {
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second.in) {
        it->second.in->expose(r);
    }
}

void VerbsTransport::regionRevoked(PeerId peer, RegionId r) {
    auto it = peers_.find(peer);
    if (it != peers_.end() && it->second.in) {
        it->second.in->revoke(r);
    }
}

void VerbsTransport::deregisterRegion(RegionId r) {
    // No write of ours uses it any more: the sending sides let go of their MRs of its
    // allocation that no other region uses. (Receiving sides keep a region's MR until the peer
    // confirmed its revocation, or [security] revoke_timeout_ms passed.)
    for (auto &[id, p] : peers_) {
        if (p.out) {
            p.out->mrs().release(r);
        }
    }
    for (auto &s : dead_out_) {
        s->mrs().release(r);
    }
}

void VerbsTransport::fail(PeerId peer, SessionSide side, const std::string &reason) {
    verbsLog().warn("peer '{}': {}", link_->peerName(peer), reason);
    link_->failSession(peer, side, reason);
}

void VerbsTransport::handleEvents() {
    for (const VerbsDevice::AsyncEvent &e : device_->takeEvents()) {
        ++async_events_;
        last_event_ = VerbsDevice::describe(e);
        switch (e.type) {
            case IBV_EVENT_PORT_ERR:
            case IBV_EVENT_DEVICE_FATAL:
            case IBV_EVENT_CQ_ERR:
            case IBV_EVENT_GID_CHANGE: {
                // Every session on this device is suspect: fail them all (each write in
                // flight ends once, with TL_EPEER); the peer layer reconnects with backoff and
                // SELECT builds new QPs once the port is usable again.
                const bool gid = e.type == IBV_EVENT_GID_CHANGE;
                verbsLog().warn("{}: failing every verbs session{}", last_event_,
                                gid ? "; the GID table is read again once it settles" : "");
                available_ = false;
                // The kernel rewrites the table entry by entry (a GID can leave one index and
                // appear at another a moment later): read it only after kSettleMs without a
                // change. A port error cancels that; PORT_ACTIVE schedules it again.
                reselect_at_ = gid ? monotonicMs() + kSettleMs : 0;
                std::vector<PeerId> ids;
                for (auto &[id, p] : peers_) {
                    ids.push_back(id);
                }
                for (PeerId id : ids) {
                    link_->failSession(id, SessionSide::kOut, last_event_);
                    link_->failSession(id, SessionSide::kIn, last_event_);
                }
                break;
            }
            case IBV_EVENT_PORT_ACTIVE:
                // The GID table may be rebuilt after a flap, and not in one step either.
                verbsLog().info("{}: reading the port and its GID table again", last_event_);
                reselect_at_ = monotonicMs() + kSettleMs;
                break;
            case IBV_EVENT_QP_FATAL:
            case IBV_EVENT_QP_REQ_ERR:
            case IBV_EVENT_QP_ACCESS_ERR:
                // The CQ reports the same failure (flushes) and poll() fails the session.
                verbsLog().warn("{}", last_event_);
                break;
            default:
                verbsLog().info("{}", last_event_);
                break;
        }
    }
}

void VerbsTransport::reselect() {
    reselect_at_ = 0;
    FabricSelection again;
    if (Status s = selectFabric(cfg_, SysfsRoot::fromEnvironment(), &again); !s.isOk()) {
        verbsLog().error("after {}: {}; verbs stays unusable until the next port event",
                         last_event_, s.message());
        available_ = false;
        return;
    }
    if (device_->portState() != IBV_PORT_ACTIVE) {
        verbsLog().warn("after {}: {} port {} is not ACTIVE yet", last_event_, again.device,
                        again.port);
        available_ = false;
        return;
    }
    if (again.gid_index != sel_.gid_index || again.gid.raw != sel_.gid.raw) {
        verbsLog().info("GID re-read: {} (was index {})", again.summary(), sel_.gid_index);
    }
    sel_ = again;
    if (!gidMatchesDevice()) {
        // sysfs and the device disagree: the table is still moving. Try again shortly.
        reselect_at_ = monotonicMs() + kSettleMs;
        return;
    }
    available_ = true;
    verbsLog().info("{} ready again", sel_.summary());
}

bool VerbsTransport::gidMatchesDevice() const {
    ibv_gid gid{};
    return ibv_query_gid(device_->context(), static_cast<uint8_t>(sel_.port),
                         static_cast<int>(sel_.gid_index), &gid) == 0 &&
           std::memcmp(gid.raw, sel_.gid.raw.data(), 16) == 0;
}

size_t VerbsTransport::progress(EventSink &sink) {
    size_t events = 0;
    if (chan_readable_ || chan_buffered_) {
        pumpChannels(monotonicMs());
        ++events;
    }
    if (device_->eventsPending()) {
        handleEvents();
    }
    if (reselect_at_ != 0 && monotonicMs() >= reselect_at_) {
        reselect();
    }
    if (registrar_.pending()) {
        for (Registrar::Result &r : registrar_.take()) {
            bool taken = false;
            for (auto &[id, p] : peers_) {
                taken = (p.out && p.out->mrs().complete(r)) || (p.in && p.in->mrs().complete(r));
                if (taken) {
                    break;
                }
            }
            for (auto &s : dead_out_) {
                taken = taken || s->mrs().complete(r);
            }
            for (auto &s : dead_in_) {
                taken = taken || s->mrs().complete(r);
            }
            for (auto &c : closing_in_) {
                taken = taken || c.in->mrs().complete(r);
            }
            if (!taken && r.mr != nullptr) {
                (void)ibv_dereg_mr(r.mr);
            }
            if (r.error != 0) {
                verbsLog().error("memory registration failed: {}", std::strerror(r.error));
            }
        }
        for (auto &[id, p] : peers_) {
            if (p.in) {
                p.in->sendReadyKeys();
            }
        }
        ++events;
    }
    if (cq_armed_) {
        // Each event must be acknowledged before its CQ is destroyed (ibv_get_cq_event(3)).
        // One that comes after this drain (the CQ was armed, its completion is later) keeps
        // the fd readable: the engine's next sleep returns at once and the next turn drains it.
        cq_armed_ = false;
        (void)device_->drainCqEvents();
    }
    std::vector<std::pair<PeerId, SessionSide>> failed;
    std::vector<std::string> reasons;
    for (auto &[id, p] : peers_) {
        if (p.out && p.out_connected) {
            std::string error;
            if (!p.out->poll(&completions_, &error)) {
                failed.emplace_back(id, SessionSide::kOut);
                reasons.push_back(error);
            } else {
                p.out->pump();
            }
        }
        if (p.in) {
            if (p.in->revoking()) {
                // Not counted as work: nothing woke the engine for it (its idle tick did).
                p.in->expireRevocations(monotonicMs());
            }
            std::string error;
            if (!p.in->poll(sink, &error)) {
                failed.emplace_back(id, SessionSide::kIn);
                reasons.push_back(error);
            }
        }
    }
    for (size_t i = 0; i < failed.size(); ++i) {
        fail(failed[i].first, failed[i].second, reasons[i]);
    }
    if (!closing_in_.empty()) {
        const int64_t now = monotonicMs();
        for (auto it = closing_in_.begin(); it != closing_in_.end();) {
            std::string error;
            const bool ok = it->in->poll(sink, &error, true);
            if (ok && !it->in->drained() && now < it->until) {
                ++it;
                continue;
            }
            if (!ok || !it->in->drained()) {
                verbsLog().warn(
                    "a closed receiving session went without all its completions: {}",
                    ok ? "they did not come in " + std::to_string(kDrainMs) + " ms" : error);
            }
            dead_in_.push_back(std::move(it->in));
            it = closing_in_.erase(it);
        }
        ++events;
    }
    // Swapped, not moved out: both vectors keep their capacity, so a completion costs no
    // allocation. (A sink may post, and a post may fail into completions_.)
    done_scratch_.clear();
    done_scratch_.swap(completions_);
    for (const Completion &c : done_scratch_) {
        sink.completed(c.op_id, c.code, c.reason);
    }
    events += done_scratch_.size();
    if (chan_output_) {
        pumpChannels(monotonicMs());  // this turn's KEY_ADDs and CREDITs, one send a channel
    }
    if (!dead_out_.empty() || !dead_in_.empty()) {
        // Their CQs go now: acknowledge what their channel holds first.
        (void)device_->drainCqEvents();
        dead_out_.clear();
        dead_in_.clear();
    }
    dead_conns_.clear();
    return events;
}

std::vector<int> VerbsTransport::pollFds() const {
    std::vector<int> fds = device_->fds();
    fds.push_back(registrar_.fd());
    fds.push_back(chan_poller_.fd());
    return fds;
}

bool VerbsTransport::arm() {
    if (!completions_.empty() || device_->eventsPending() || registrar_.pending() || chan_output_ ||
        chan_readable_ || chan_buffered_ || !closing_in_.empty()) {
        return false;
    }
    if (busy_) {
        return true;  // never sleeps: nothing to be woken for
    }
    cq_armed_ = true;
    for (auto &[id, p] : peers_) {
        if ((p.out && p.out_connected && !p.out->arm()) || (p.in && !p.in->arm())) {
            return false;
        }
    }
    return true;
}

TransportPeerReport VerbsTransport::peerReport(PeerId peer, ReportDetail want) const {
    TransportPeerReport r;
    r.transport = "verbs";
    r.device_async_events = async_events_;
    r.revocations_forced = forcedRevocations(peer);
    auto detail = std::make_shared<nlohmann::json>(nlohmann::json::object());
    nlohmann::json &j = *detail;
    if (want == ReportDetail::kTyped) {
        // The typed figures only: the sessions fill them (their JSON goes nowhere); no sysfs.
        if (auto it = peers_.find(peer); it != peers_.end()) {
            if (it->second.out) {
                it->second.out->report(&r, &j["send"]);
            }
            if (it->second.in) {
                it->second.in->report(&r, &j["receive"]);
            }
        }
        return r;
    }
    r.detail = detail;
    j["transport"] = "verbs";
    j["device"] = sel_.device;
    j["port"] = sel_.port;
    j["gid_index"] = sel_.gid_index;
    j["gid"] = sel_.gid_text;
    j["async_events"] = r.device_async_events;
    j["last_event"] = last_event_;
    // The port's retransmission and error counters (device-wide: the HCA does not count per
    // QP), as hw_counters has them; those this device lacks are left out.
    nlohmann::json counters = nlohmann::json::object();
    const SysfsRoot root = SysfsRoot::fromEnvironment();
    const std::string dir =
        "class/infiniband/" + sel_.device + "/ports/" + std::to_string(sel_.port) + "/hw_counters/";
    for (const char *name :
         {"local_ack_timeout_err", "out_of_sequence", "packet_seq_err", "duplicate_request",
          "rnr_nak_retry_err", "implied_nak_seq_err", "req_remote_access_errors",
          "resp_remote_access_errors", "np_cnp_sent", "rp_cnp_handled",
          "np_ecn_marked_roce_packets", "roce_adp_retrans", "sim_tx_retransmits"}) {
        if (auto v = root.read(dir + name)) {
            char *end = nullptr;
            const unsigned long long n = std::strtoull(v->c_str(), &end, 10);
            if (end != v->c_str()) {
                counters[name] = n;
            }
        }
    }
    j["nic_counters"] = std::move(counters);
    // How GPU memory is registered on this host (the probe runs on the first CUDA region).
    // "dma-buf" once an fd registered; "peermem" once the IPC mapping did (no fd from the owner)
    // or the host refused dma-buf MRs; "untried" before the first CUDA region.
    const int dmabuf = registrar_.dmabufSupported();
    j["gpu_registration"] = dmabuf == 1                               ? "dma-buf"
                            : dmabuf == 0 || registrar_.peermemUsed() ? "peermem"
                                                                      : "untried";
    // Revocations this peer did not confirm within [security] revoke_timeout_ms (its MRs were
    // deregistered anyway), over all its sessions.
    j["revocations_forced"] = r.revocations_forced;
    auto it = peers_.find(peer);
    if (it != peers_.end()) {
        if (it->second.out) {
            it->second.out->report(&r, &j["send"]);
            j["in_flight"] = r.in_flight;
        }
        if (it->second.in) {
            it->second.in->report(&r, &j["receive"]);
        }
    }
    return r;
}

}  // namespace tensorlane::sidecar
