// The accepting side: the bootstrap listener, unauthenticated connections and their
// handshakes, and the sessions peers open to us (their writes land here).
#include "peer/listener.hpp"

#include <sodium.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/frame_reader.hpp"
#include "peer/text.hpp"

namespace tensorlane::sidecar {

namespace {

// How long a refused connection may linger so the client reads the REFUSE before our close
// (closing with its unread bytes in our receive queue would reset the connection and lose it).
constexpr int64_t kRefuseLingerMs = 500;

}  // namespace

PeerListener::PeerListener(const config::Config &cfg, const PeerLimits &limits, const PeerKey &key,
                           RegionTable &regions, TransportSet &transports, Poller &poller,
                           uint64_t token, PeerTable &peers, PeerLoop &loop)
    : cfg_(cfg),
      limits_(limits),
      key_(key),
      regions_(regions),
      transports_(transports),
      poller_(poller),
      token_(token),
      peers_(peers),
      loop_(loop) {}

Status PeerListener::start(SockAddr *listen) {
    SockAddr addr;
    std::string error;
    int rc = resolveAddress(cfg_.node.listen.host, cfg_.node.listen.port, true, &addr, &error);
    if (rc != 0) {
        return {Code::kInvalid, "[node] listen: " + error};
    }
    rc = listenTcp(addr, 128, &listener_);
    if (rc != 0) {
        return {Code::kPermission,
                "cannot listen for peers on " + addr.text() + ": " + std::strerror(rc)};
    }
    SockAddr bound;
    if (localAddress(listener_.get(), &bound) == 0) {
        listen_port_ = bound.port();
        listen_address_ = bound.text();
    }
    poller_.add(listener_.get(), EPOLLIN, token_);
    *listen = addr;
    return Status::ok();
}

void PeerListener::stopListening() {
    if (listener_) {
        poller_.remove(listener_.get());
        listener_.reset();
    }
}

void PeerListener::dropAllPending() {
    pending_.clear();
    pending_by_source_.clear();
    pending_unlisted_ = 0;
}

void PeerListener::resumeAccepting() {
    listen_paused_until_ = 0;
    if (listener_) {
        poller_.add(listener_.get(), EPOLLIN, token_);
    }
}

void PeerListener::logDrop(const std::string &remote, const std::string &reason, int64_t now) {
    ++rejected_;
    last_rejection_ = remote + ": " + reason;
    uint64_t suppressed = 0;
    if (drop_log_.allow(now, &suppressed)) {
        if (suppressed > 0) {
            peerLog().warn("dropped peer connection from {}: {} ({} similar messages suppressed)",
                           remote, reason, suppressed);
        } else {
            peerLog().warn("dropped peer connection from {}: {}", remote, reason);
        }
    }
}

void PeerListener::acceptAll(int64_t now) {
    // A bounded number per call, so a connection flood cannot monopolise the engine thread.
    for (int i = 0; i < 64 && listener_; ++i) {
        ipc::UniqueFd fd;
        SockAddr from;
        int rc = acceptTcp(listener_.get(), &fd, &from);
        if (rc == EAGAIN || rc == EWOULDBLOCK) {
            return;
        }
        if (rc == EINTR || rc == ECONNABORTED) {
            continue;
        }
        if (rc != 0) {
            // EMFILE and friends leave the connection in the backlog and the listener readable:
            // stop watching it for a moment instead of spinning on it.
            logDrop("(listener)", std::string("accept failed: ") + std::strerror(rc), now);
            poller_.remove(listener_.get());
            listen_paused_until_ = now + 100;
            loop_.noteDeadline(listen_paused_until_);
            return;
        }
        // Who may take a handshake slot (docs/peers.md, "Who may connect"): the addresses of
        // configured peers, each within its own quota, so that no flood from elsewhere keeps a
        // configured peer out; others only with allow_unlisted_peers, in a shared pool.
        const HostAddress source = hostOf(from);
        const bool listed = peersAt(source) > 0;
        if (!listed) {
            refreshPeerHosts(now);  // a peer given by name may have moved
            if (!cfg_.security.allow_unlisted_peers) {
                ++unlisted_dropped_;
                logDrop(from.text(),
                        "no [[peers]] entry is at this address (closed at accept; set [security] "
                        "allow_unlisted_peers = true to let such connections authenticate)",
                        now);
                continue;  // fd closes here
            }
        }
        std::string why;
        if (!makeRoom(source, listed, now, &why)) {
            logDrop(from.text(), why, now);
            continue;  // fd closes here
        }
        tunePeerSocket(fd.get(), cfg_.tcp.peer_timeout_ms, cfg_.tcp.keepalive_ms);
        auto conn = std::make_unique<Connection>(poller_, std::move(fd), from.text(),
                                                 ConnRole::kPendingIn, now, false);
        Connection &c = *conn;
        const uint64_t token = conn->token();
        Pending pd;
        pd.conn = std::move(conn);
        pd.hs = std::make_unique<ServerHandshake>(key_, loop_.identity());
        pd.source = source;
        pd.listed = listed;
        pd.accepted_ms = now;
        // The whole handshake, from accept to AUTH, must fit in this; slow or silent clients are
        // dropped at the deadline.
        pd.deadline_ms = now + cfg_.tcp.connect_timeout_ms;
        loop_.noteDeadline(pd.deadline_ms);
        ++pending_by_source_[source];
        pending_unlisted_ += listed ? 0 : 1;
        pending_.emplace(token, std::move(pd));
        // A HELLO that came with the connection is read now: a real peer's connection is then
        // past its HELLO before the next connections from its address are looked at.
        onPendingEvent(c, EPOLLIN, now);
    }
}

size_t PeerListener::peersAt(const HostAddress &source) const {
    size_t n = 0;
    for (const Peer &p : peers_) {
        n += std::find(p.hosts.begin(), p.hosts.end(), source) != p.hosts.end() ? 1 : 0;
    }
    return n;
}

size_t PeerListener::sourceQuota(const HostAddress &source, bool listed) const {
    if (!listed) {
        return limits_.max_pending_per_source;
    }
    // A peer opens its control connection and then all its data connections at once.
    const size_t one =
        std::max<size_t>(limits_.max_pending_per_source, size_t{cfg_.tcp.connections_per_peer} + 2);
    return one * std::max<size_t>(1, peersAt(source));
}

bool PeerListener::makeRoom(const HostAddress &source, bool listed, int64_t now, std::string *why) {
    if (!listed && pending_unlisted_ >= limits_.max_pending_handshakes) {
        *why = "too many unauthenticated connections from addresses of no [[peers]] entry (" +
               std::to_string(limits_.max_pending_handshakes) + ")";
        return false;
    }
    const size_t quota = sourceQuota(source, listed);
    auto count = pending_by_source_.find(source);
    if (count == pending_by_source_.end() || count->second < quota) {
        return true;
    }
    // The source is at its quota: its oldest connection that has sent no HELLO yet (silent or
    // refused and lingering) makes room. One that got a CHALLENGE is left to finish: a real
    // peer is past its HELLO within a round trip.
    uint64_t victim = 0;
    int64_t oldest = INT64_MAX;
    for (const auto &[token, pd] : pending_) {
        if (pd.source == source && (!pd.challenged || pd.closing) && pd.accepted_ms < oldest) {
            oldest = pd.accepted_ms;
            victim = token;
        }
    }
    if (victim == 0) {
        *why = "too many unauthenticated connections from " + source.text() + " (" +
               std::to_string(quota) + ")";
        return false;
    }
    // (A refused one that lingers was logged when it was refused; dropPending says nothing more.)
    dropPending(victim,
                "closed to make room: " + std::to_string(quota) +
                    " unauthenticated connections from this address at once, and this one "
                    "has sent no HELLO",
                now);
    return true;
}

void PeerListener::forgetPending(const Pending &pd) {
    auto it = pending_by_source_.find(pd.source);
    if (it != pending_by_source_.end() && --it->second == 0) {
        pending_by_source_.erase(it);
    }
    if (!pd.listed && pending_unlisted_ > 0) {
        --pending_unlisted_;
    }
}

void PeerListener::refreshPeerHosts(int64_t now) {
    Resolver *resolver = loop_.resolver();
    if (resolver == nullptr || now - hosts_refreshed_ms_ < limits_.address_refresh_ms) {
        return;
    }
    hosts_refreshed_ms_ = now;
    for (Peer &p : peers_) {
        if (!p.numeric && !p.hosts_resolving) {
            p.hosts_resolving = true;
            resolver->requestAll(kHostsTag | p.id, p.host);
        }
    }
}

void PeerListener::onHostsResolved(const Resolver::Result &r) {
    Peer *p = peers_.byId(static_cast<PeerId>(r.tag & ~kHostsTag));
    if (p == nullptr) {
        return;
    }
    p->hosts_resolving = false;
    if (r.rc != 0) {
        // Keep what we knew: a DNS server that is down must not lock the peer out.
        peerLog().warn("peer '{}': {} (its connections are accepted from {})", p->name, r.error,
                       hostListText(p->hosts));
        return;
    }
    if (r.hosts != p->hosts) {
        peerLog().info("peer '{}' ({}) is at {}", p->name, p->address, hostListText(r.hosts));
        p->hosts = r.hosts;
    }
}

Status PeerListener::admit(const HelloMsg &hello, const HostAddress &source, ServerHandshake &hs,
                           int64_t now, std::string *log_detail) {
    Peer *p = peers_.byName(hello.from);
    if (p == nullptr) {
        return {Code::kPermission, "unknown peer '" + hello.from + "' (not in [[peers]])"};
    }
    // A peer's name is bound to its configured address: a holder of the key elsewhere cannot
    // claim it (and so cannot displace its session). Checked before any key proof.
    if (cfg_.security.verify_peer_address &&
        std::find(p->hosts.begin(), p->hosts.end(), source) == p->hosts.end()) {
        ++claims_refused_;
        if (!p->numeric) {
            refreshPeerHosts(now);
        }
        *log_detail = " (its [[peers]] address " + p->address + " is " + hostListText(p->hosts) +
                      "; the session it holds is untouched)";
        return {Code::kPermission,
                "peer '" + hello.from + "' is not accepted from " + source.text() +
                    ": a peer's name is bound to its [[peers]] address ([security] "
                    "verify_peer_address)"};
    }
    hs.useKey(p->key);
    if (hello.role == LinkRole::kData) {
        if (!p->in || p->in->session_id != hello.session_id ||
            p->in->remote_incarnation != hello.incarnation || !p->in->transport_open) {
            return {Code::kInvalid, "data connection for an unknown session"};
        }
        if (hello.data_index >= p->in->data_expected || p->in->data_taken[hello.data_index]) {
            return {Code::kInvalid, "data connection index " + std::to_string(hello.data_index) +
                                        " taken or out of range"};
        }
    }
    return Status::ok();
}

void PeerListener::refusePending(Pending &pd, const std::string &wire_reason,
                                 const std::string &log_reason, int64_t now) {
    Connection &c = *pd.conn;
    const std::string who =
        pd.claimed.empty() ? c.remote() : c.remote() + " ('" + pd.claimed + "')";
    logDrop(who, log_reason, now);
    const std::string text = wire_reason.substr(0, kMaxControlPayload);
    c.queueFrame(FrameType::kRefuse, 0,
                 std::span(reinterpret_cast<const uint8_t *>(text.data()), text.size()));
    (void)c.flush(now);
    // FIN after the REFUSE; then wait briefly for the client to close its end.
    ::shutdown(c.fd(), SHUT_WR);
    pd.closing = true;
    pd.deadline_ms = std::min(pd.deadline_ms, now + kRefuseLingerMs);
    loop_.noteDeadline(pd.deadline_ms);
}

void PeerListener::dropPending(uint64_t token, const std::string &reason, int64_t now) {
    auto it = pending_.find(token);
    if (it == pending_.end()) {
        return;
    }
    Pending &pd = it->second;
    if (!pd.closing) {
        const std::string who =
            pd.claimed.empty() ? pd.conn->remote() : pd.conn->remote() + " ('" + pd.claimed + "')";
        logDrop(who, reason, now);
    }
    pd.conn->close();
    loop_.retire(std::move(pd.conn));
    forgetPending(pd);
    pending_.erase(it);
}

void PeerListener::onPendingEvent(Connection &c, uint32_t events, int64_t now) {
    const uint64_t token = c.token();
    auto it = pending_.find(token);
    if (it == pending_.end()) {
        return;
    }
    Pending &pd = it->second;
    if (pd.closing) {
        // Discard whatever comes until the client closes (or the linger deadline passes).
        int rc = 0;
        while ((rc = c.fill(now)) == 0) {
            c.consume(c.buffered());
        }
        if (rc != EAGAIN) {
            dropPending(token, "refused", now);
        }
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        if (int rc = c.flush(now); rc != 0) {
            dropPending(token, "handshake send failed: " + errnoText(rc), now);
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    const FramesRead r = readFrames(
        c, now, kMaxHandshakePayload, [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            if (h.type == FrameType::kRefuse) {
                std::string why = printableText(payload);
                c.consumeFrame(h);
                dropPending(token, "the connecting side gave up: " + why, now);
                return FrameStep::kStop;
            }
            if (!pd.challenged) {
                if (h.type != FrameType::kHello) {
                    dropPending(
                        token, "expected HELLO, got " + frameTypeName(static_cast<uint8_t>(h.type)),
                        now);
                    return FrameStep::kStop;
                }
                uint64_t session_id = 0;
                do {
                    randombytes_buf(&session_id, sizeof session_id);
                } while (session_id == 0);
                std::vector<uint8_t> challenge;
                std::string detail;
                Status s = pd.hs->onHello(
                    payload,
                    [&](const HelloMsg &m) { return admit(m, pd.source, *pd.hs, now, &detail); },
                    session_id, &challenge);
                if (s.isOk() || !pd.hs->hello().from.empty()) {
                    pd.claimed = pd.hs->hello().from;
                }
                c.consumeFrame(h);
                if (!s.isOk()) {
                    refusePending(pd, s.message(), s.message() + detail, now);
                    return FrameStep::kStop;
                }
                c.queueFrame(FrameType::kChallenge, 0, challenge);
                if (int wrc = c.flush(now); wrc != 0) {
                    dropPending(token, "handshake send failed: " + errnoText(wrc), now);
                    return FrameStep::kStop;
                }
                pd.challenged = true;
                return FrameStep::kNext;
            }
            if (h.type != FrameType::kAuth) {
                dropPending(token,
                            "expected AUTH, got " + frameTypeName(static_cast<uint8_t>(h.type)),
                            now);
                return FrameStep::kStop;
            }
            HandshakeOutcome outcome;
            Status s = pd.hs->onAuth(payload, &outcome);
            c.consumeFrame(h);
            if (!s.isOk()) {
                // The refusal names the reason: after a failed proof it tells nothing the client
                // does not know; after a good one (a settings mismatch) both ends should see it.
                refusePending(pd, s.message(), s.message(), now);
                return FrameStep::kStop;
            }
            promote(token, outcome, now);
            return FrameStep::kStop;  // the connection is the session's now
        });
    if (r.end == FramesRead::End::kBad) {
        dropPending(token, "not a tensorlane peer handshake (" + r.error + ")", now);
        return;
    }
    if (r.end == FramesRead::End::kClosed) {
        dropPending(token,
                    pd.challenged ? "closed during the handshake (after CHALLENGE)"
                                  : "closed before completing a handshake",
                    now);
    } else if (r.end == FramesRead::End::kFailed) {
        dropPending(token, "handshake read failed: " + errnoText(r.rc), now);
    }
}

void PeerListener::sendSnapshot(Connection &control) {
    for (const auto &r : regions_.exposed()) {
        if (r->revoked.load(std::memory_order_acquire) || r->exposed_name.empty()) {
            continue;
        }
        control.queueFrame(FrameType::kRegionAdd, r->id,
                           encodeRegionAdd(r->bytes, r->exposed_name));
    }
    control.queueFrame(FrameType::kReady, 0);
}

void PeerListener::promote(uint64_t token, const HandshakeOutcome &o, int64_t now) {
    auto it = pending_.find(token);
    Peer *p = peers_.byName(o.peer_name);
    if (it == pending_.end() || p == nullptr) {
        return;
    }
    std::unique_ptr<Connection> conn = std::move(it->second.conn);
    forgetPending(it->second);
    pending_.erase(it);
    conn->peer = p->id;
    // Every frame we send from here on carries a tag, and every frame we accept must.
    enableFrameTags(*conn, o, false);

    if (o.role == LinkRole::kControl) {
        if (p->in) {
            closeIn(*p, "replaced by a new session from the same peer", false);
        }
        auto s = std::make_unique<InSession>();
        s->session_id = o.session_id;
        s->remote_incarnation = o.peer_incarnation;
        s->remote_caps = o.peer_caps;
        s->integrity = o.integrity;
        s->heartbeat_ms = heartbeatInterval(cfg_, o.peer_caps);
        conn->role = ConnRole::kInControl;
        sendSnapshot(*conn);
        if (int rc = conn->flush(now); rc != 0) {
            logDrop(conn->remote(), "cannot send the region snapshot: " + errnoText(rc), now);
            conn->close();
            loop_.retire(std::move(conn));
            return;
        }
        s->control = std::move(conn);
        peerLog().info("peer '{}' connected from {} (session {:016x}, incarnation {:016x})",
                       p->name, s->control->remote(), o.session_id, o.peer_incarnation);
        p->in = std::move(s);
        // A session from a new incarnation means the peer restarted: the session we hold to it
        // is dead (or soon will be), and the descriptors we hold are from the old run.
        // A peer we failed to reach and now hear from (it started, or came back with the right
        // key) is reachable too: the dialer retries now instead of after the backoff. Not a
        // peer that refused us (another wire version, no transport in common): its own attempts
        // would otherwise reset our backoff each time, and the two would retry each other every
        // reconnect_min_ms for as long as they disagree (the soak run's mixed versions did,
        // hundreds of log lines a second).
        if ((p->remote_incarnation != 0 && p->remote_incarnation != o.peer_incarnation) ||
            (!p->out && p->attempt_scheduled && !p->last_refused)) {
            loop_.peerRestarted(*p, now);
        }
        return;
    }

    if (!p->in || p->in->session_id != o.session_id || !p->in->transport_open ||
        o.data_index >= p->in->data_expected || p->in->data_taken[o.data_index]) {
        logDrop(conn->remote(), "data connection for a session that is gone", now);
        conn->close();
        loop_.retire(std::move(conn));
        return;
    }
    conn->index = o.data_index;
    conn->queueFrame(FrameType::kReady, 0);
    if (int rc = conn->flush(now); rc != 0) {
        closeIn(*p, "data connection: " + errnoText(rc), true);
        conn->close();
        loop_.retire(std::move(conn));
        return;
    }
    p->in->data_taken[o.data_index] = true;
    p->in->transport->adoptChannel(p->id, SessionSide::kIn, o.data_index, std::move(conn));
}

void PeerListener::closeIn(Peer &p, const std::string &reason, bool warn) {
    if (!p.in) {
        return;
    }
    if (warn) {
        peerLog().warn("session from peer '{}' ({}) closed: {}", p.name,
                       p.in->control ? p.in->control->remote() : p.address, reason);
    } else {
        peerLog().info("session from peer '{}' closed: {}", p.name, reason);
    }
    if (p.in->control) {
        p.in->control->close();
    }
    // Writes half received are dropped: the writer fails them when it sees the session die.
    std::unique_ptr<InSession> dead = std::move(p.in);
    if (dead->transport_open) {
        dead->transport->closeSession(p.id, SessionSide::kIn, Code::kPeer, reason);
    }
    loop_.inboundClosed(p, reason);
    loop_.retire(std::move(dead));
    loop_.signalWake();
}

void PeerListener::regionExposed(const Region &r, int64_t now) {
    const auto payload = encodeRegionAdd(r.bytes, r.exposed_name);
    std::shared_ptr<Region> shared = regions_.find(r.id);
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->isOpen()) {
            p.in->control->queueFrame(FrameType::kRegionAdd, r.id, payload);
            if (p.in->transport_open && shared) {
                p.in->transport->regionExposed(p.id, shared);
            }
            if (p.in && p.in->control->flush(now) != 0) {
                closeIn(p, "cannot send a region descriptor", true);
            }
        }
    }
}

void PeerListener::regionRevoked(RegionId id, int64_t now) {
    for (Peer &p : peers_) {
        if (p.in && p.in->control && p.in->control->isOpen()) {
            p.in->control->queueFrame(FrameType::kRegionDel, id);
            if (p.in->transport_open) {
                p.in->transport->regionRevoked(p.id, id);
            }
            if (p.in && p.in->control->flush(now) != 0) {
                closeIn(p, "cannot send a region revocation", true);
            }
        }
    }
}

void PeerListener::onControlEvent(Connection &c, uint32_t events, int64_t now) {
    Peer *p = peers_.byId(c.peer);
    if (p == nullptr || !p->in || p->in->control.get() != &c) {
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        if (int rc = c.flush(now); rc != 0) {
            closeIn(*p, errnoText(rc), true);
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    const FramesRead r = readFrames(
        c, now, kMaxControlPayload, [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            // false: the session was closed
            return handleControlFrame(*p, h, payload, now) ? FrameStep::kNext : FrameStep::kStop;
        });
    if (r.end == FramesRead::End::kBad) {
        closeIn(*p, "protocol error: " + r.error, true);
    } else if (r.end == FramesRead::End::kClosed) {
        closeIn(*p, "closed by the peer", false);
    } else if (r.end == FramesRead::End::kFailed) {
        closeIn(*p, errnoText(r.rc), true);
    }
}

bool PeerListener::handleControlFrame(Peer &p, const FrameHeader &h,
                                      std::span<const uint8_t> payload, int64_t now) {
    InSession &s = *p.in;
    if (h.type == FrameType::kHeartbeat) {
        return true;
    }
    if (h.type == FrameType::kSelect && !s.transport_open) {
        // The client chose the transport for its writes; open our receiving side of it and
        // answer with our own bootstrap data for it.
        Transport *t =
            h.arg <= UINT32_MAX ? transports_.byWireId(static_cast<uint32_t>(h.arg)) : nullptr;
        if (t == nullptr || !t->available()) {
            const std::string why =
                "transport " + std::to_string(h.arg) + " is not available on " + cfg_.node.name;
            s.control->queueFrame(
                FrameType::kRefuse, 0,
                std::span(reinterpret_cast<const uint8_t *>(why.data()), why.size()));
            (void)s.control->flush(now);
            closeIn(p, "refused the transport the peer selected: " + why, true);
            return false;
        }
        SessionInfo info = sessionInfo(p, s.session_id, s.remote_incarnation, s.integrity);
        info.remote_blob.assign(payload.begin(), payload.end());
        uint32_t channels = 0;
        Status st = t->openSession(p.id, SessionSide::kIn, info, &channels);
        if (!st.isOk()) {
            const std::string why = "cannot open the " + std::string(t->name()) + " session on " +
                                    cfg_.node.name + ": " + st.message();
            s.control->queueFrame(
                FrameType::kRefuse, 0,
                std::span(reinterpret_cast<const uint8_t *>(why.data()), why.size()));
            (void)s.control->flush(now);
            closeIn(p, why, true);
            return false;
        }
        s.transport = t;
        s.transport_open = true;
        // The regions exposed now (the snapshot this session's REGION_ADDs carried); later
        // ones follow through regionExposed() as they are exposed.
        for (const auto &r : regions_.exposed()) {
            if (!r->revoked.load(std::memory_order_acquire) && !r->exposed_name.empty()) {
                t->regionExposed(p.id, r);
            }
        }
        s.data_expected = channels;
        s.data_taken.assign(s.data_expected, false);
        s.control->queueFrame(FrameType::kSelected, h.arg, t->localBlob(p.id, SessionSide::kIn));
        if (int rc = s.control->flush(now); rc != 0) {
            closeIn(p, "cannot answer SELECT: " + errnoText(rc), true);
            return false;
        }
        return true;
    }
    closeIn(p,
            "protocol error: unexpected " + frameTypeName(static_cast<uint8_t>(h.type)) +
                " on the control connection",
            true);
    return false;
}

}  // namespace tensorlane::sidecar
