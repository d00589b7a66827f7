// The connecting side: connect attempts with jittered exponential backoff, the client
// handshake, region descriptors from the peer, acknowledgements of our writes, and failure.
#include <sodium.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "peer/manager.hpp"
#include "peer/text.hpp"

namespace tensorlane::sidecar {

namespace {

std::span<const uint8_t> bytesOf(const std::string &s) {
    return {reinterpret_cast<const uint8_t *>(s.data()), s.size()};
}

std::string errnoText(int rc) {
    return rc == ECONNRESET ? std::string("connection closed by the peer")
                            : std::string(std::strerror(rc));
}

}  // namespace

void PeerManagerImpl::startAttempt(Peer &p, int64_t now) {
    p.attempt_scheduled = false;
    if (stopped_ || !started_ || p.out) {
        return;
    }
    auto s = std::make_unique<OutSession>();
    s->attempt = next_attempt_++;
    s->deadline_ms = now + cfg_.tcp.connect_timeout_ms;
    noteDeadline(s->deadline_ms);
    setState(p, PeerState::kConnecting, "connecting to " + p.address);
    SockAddr addr;
    if (parseNumericAddress(p.host, p.port, &addr)) {
        p.out = std::move(s);
        beginConnect(p, addr, now);
        return;
    }
    s->phase = OutSession::Phase::kResolving;
    const uint64_t tag = s->attempt;
    p.out = std::move(s);
    if (resolver_) {
        resolver_->request(tag, p.host, p.port);
    }
}

void PeerManagerImpl::onResolved(const Resolver::Result &r, int64_t now) {
    for (Peer &p : peers_) {
        if (p.out && p.out->attempt == r.tag && p.out->phase == OutSession::Phase::kResolving) {
            if (r.rc != 0) {
                failOut(p, r.error, true, now);
            } else {
                beginConnect(p, r.addr, now);
            }
            return;
        }
    }
}

bool PeerManagerImpl::openConnection(Peer &p, ConnRole role, uint32_t index, int64_t now,
                                     std::unique_ptr<Connection> *out) {
    ipc::UniqueFd fd;
    bool in_progress = false;
    const int rc = connectTcp(p.out->addr, &fd, &in_progress);
    if (rc != 0) {
        failOut(p, "cannot connect to " + p.out->addr.text() + ": " + std::strerror(rc), true, now);
        return false;
    }
    tunePeerSocket(fd.get(), cfg_.tcp.peer_timeout_ms, cfg_.tcp.keepalive_ms);
    // Registered for writability either way: a connect that finished at once reports it
    // immediately, so both cases take the same path.
    auto c =
        std::make_unique<Connection>(poller_, std::move(fd), p.out->addr.text(), role, now, true);
    c->peer = p.id;
    c->index = index;
    *out = std::move(c);
    return true;
}

void PeerManagerImpl::beginConnect(Peer &p, const SockAddr &addr, int64_t now) {
    OutSession &s = *p.out;
    s.addr = addr;
    s.phase = OutSession::Phase::kConnecting;
    s.hs = std::make_unique<ClientHandshake>(key_, identity(), p.name, LinkRole::kControl, 0, 0);
    std::unique_ptr<Connection> c;
    if (!openConnection(p, ConnRole::kOutControl, 0, now, &c)) {
        return;
    }
    s.control = std::move(c);
}

void PeerManagerImpl::onOutControlEvent(Connection &c, uint32_t events, int64_t now) {
    Peer *p = peerOf(c.peer);
    if (p == nullptr || !p->out || p->out->control.get() != &c) {
        return;
    }
    OutSession &s = *p->out;
    if (c.connecting) {
        if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) {
            return;
        }
        if (int rc = connectResult(c.fd()); rc != 0) {
            failOut(*p, "cannot connect to " + c.remote() + ": " + std::strerror(rc), true, now);
            return;
        }
        c.connecting = false;
        s.phase = OutSession::Phase::kHandshake;
        // The handshake gets its own deadline, counted from the established connection.
        s.deadline_ms = now + cfg_.tcp.connect_timeout_ms;
        noteDeadline(s.deadline_ms);
        c.queueFrame(FrameType::kHello, 0, s.hs->hello());
        if (int rc = c.flush(now); rc != 0) {
            failOut(*p, "cannot send HELLO: " + errnoText(rc), true, now);
        }
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        if (int rc = c.flush(now); rc != 0) {
            failOut(*p, "control connection: " + errnoText(rc), true, now);
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    const int rc = c.fill(now);
    for (;;) {
        FrameHeader h;
        std::span<const uint8_t> payload;
        std::string error;
        const uint32_t limit =
            s.phase == OutSession::Phase::kHandshake ? kMaxHandshakePayload : kMaxControlPayload;
        const auto parsed = c.nextFrame(limit, &h, &payload, &error);
        if (parsed == Connection::Parse::kNeedMore) {
            break;
        }
        if (parsed == Connection::Parse::kBad) {
            failOut(*p, "protocol error on the control connection: " + error, true, now);
            return;
        }
        if (!handleOutControlFrame(*p, h, payload, now)) {
            return;  // the session failed; `c` is closed
        }
        c.consumeFrame(h);
    }
    if (rc == ECONNRESET) {
        failOut(*p, "connection closed by the peer", true, now);
    } else if (rc != 0 && rc != EAGAIN) {
        failOut(*p, "control connection: " + errnoText(rc), true, now);
    }
}

bool PeerManagerImpl::handleOutControlFrame(Peer &p, const FrameHeader &h,
                                            std::span<const uint8_t> payload, int64_t now) {
    OutSession &s = *p.out;
    auto protocolError = [&](const std::string &what) {
        failOut(p, "protocol error: " + what, true, now);
        return false;
    };
    if (h.type == FrameType::kRefuse) {
        failOut(p, "refused by '" + p.name + "': " + printableText(payload), true, now);
        return false;
    }
    if (h.type == FrameType::kHeartbeat) {
        return true;
    }
    using Phase = OutSession::Phase;
    switch (s.phase) {
        case Phase::kHandshake: {
            if (h.type != FrameType::kChallenge) {
                return protocolError("expected CHALLENGE, got " +
                                     frameTypeName(static_cast<uint8_t>(h.type)));
            }
            std::vector<uint8_t> auth;
            HandshakeOutcome o;
            Status st = s.hs->onChallenge(payload, &auth, &o);
            if (!st.isOk()) {
                // Tell the server why, so the refusal shows in both nodes' logs.
                s.control->queueFrame(FrameType::kRefuse, 0, bytesOf(st.message()));
                (void)s.control->flush(now);
                failOut(p, st.message(), true, now);
                return false;
            }
            s.control->queueFrame(FrameType::kAuth, 0, auth);
            if (int rc = s.control->flush(now); rc != 0) {
                failOut(p, "cannot send AUTH: " + errnoText(rc), true, now);
                return false;
            }
            s.session_id = o.session_id;
            s.remote_incarnation = o.peer_incarnation;
            s.remote_caps = o.peer_caps;
            s.phase = Phase::kSyncing;
            return true;
        }
        case Phase::kSyncing:
            if (h.type == FrameType::kRegionAdd) {
                RegionDescriptor d;
                if (!decodeRegionAdd(h.arg, payload, &d)) {
                    return protocolError("malformed REGION_ADD");
                }
                s.staged[d.id] = std::move(d);
                return true;
            }
            if (h.type == FrameType::kRegionDel) {
                s.staged.erase(h.arg);
                return true;
            }
            if (h.type == FrameType::kReady) {
                onSynced(p, now);
                return p.out != nullptr;
            }
            return protocolError("unexpected " + frameTypeName(static_cast<uint8_t>(h.type)) +
                                 " before READY");
        case Phase::kData:
        case Phase::kUp:
            if (h.type == FrameType::kRegionAdd) {
                RegionDescriptor d;
                if (!decodeRegionAdd(h.arg, payload, &d)) {
                    return protocolError("malformed REGION_ADD");
                }
                applyRegionAdd(p, std::move(d));
                return true;
            }
            if (h.type == FrameType::kRegionDel) {
                applyRegionDel(p, h.arg);
                return true;
            }
            if (h.type == FrameType::kAck && s.phase == Phase::kUp && payload.size() == 8) {
                const Code code = ipc::sanitizeCode(static_cast<int32_t>(loadLe32(payload.data())));
                const size_t before = completions_.size();
                if (!s.link->onAck(h.arg, code, &completions_)) {
                    return protocolError("ACK for write " + std::to_string(h.arg) +
                                         ", which is not the oldest in flight");
                }
                if (code == Code::kOk && completions_.size() > before) {
                    ++p.writes_sent;
                    p.bytes_sent += completions_.back().bytes;
                }
                return true;
            }
            return protocolError("unexpected " + frameTypeName(static_cast<uint8_t>(h.type)));
        default:
            return protocolError("frame before the connection was established");
    }
}

void PeerManagerImpl::onSynced(Peer &p, int64_t now) {
    OutSession &s = *p.out;
    if (p.remote_incarnation != 0 && p.remote_incarnation != s.remote_incarnation) {
        peerLog().info(
            "peer '{}' restarted (incarnation {:016x} -> {:016x}): its regions are new; "
            "handles from before fail with TL_ENOENT",
            p.name, p.remote_incarnation, s.remote_incarnation);
        pruneHandles(p.id);
    }
    p.remote_incarnation = s.remote_incarnation;
    p.regions = std::move(s.staged);
    p.region_by_name.clear();
    for (const auto &[id, d] : p.regions) {
        p.region_by_name[d.name] = id;
    }
    s.phase = OutSession::Phase::kData;
    s.data.resize(cfg_.tcp.connections_per_peer);
    for (uint32_t i = 0; i < s.data.size(); ++i) {
        s.data[i].hs = std::make_unique<ClientHandshake>(key_, identity(), p.name, LinkRole::kData,
                                                         s.session_id, i);
        std::unique_ptr<Connection> c;
        if (!openConnection(p, ConnRole::kOutData, i, now, &c)) {
            return;
        }
        s.data[i].conn = std::move(c);
    }
}

void PeerManagerImpl::onOutDataEvent(Connection &c, uint32_t events, int64_t now) {
    Peer *p = peerOf(c.peer);
    if (p == nullptr || !p->out || c.index >= p->out->data.size() ||
        p->out->data[c.index].conn.get() != &c) {
        return;
    }
    OutSession &s = *p->out;
    OutData &d = s.data[c.index];
    if (c.connecting) {
        if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) {
            return;
        }
        if (int rc = connectResult(c.fd()); rc != 0) {
            failOut(*p, "cannot connect to " + c.remote() + ": " + std::strerror(rc), true, now);
            return;
        }
        c.connecting = false;
        c.queueFrame(FrameType::kHello, 0, d.hs->hello());
        if (int rc = c.flush(now); rc != 0) {
            failOut(*p, "cannot send HELLO: " + errnoText(rc), true, now);
        }
        return;
    }
    if ((events & EPOLLOUT) != 0) {
        if (int rc = c.flush(now); rc != 0) {
            failOut(*p, "data connection: " + errnoText(rc), true, now);
            return;
        }
    }
    if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) == 0) {
        return;
    }
    const int rc = c.fill(now);
    if (d.ready) {
        // The server sends nothing after READY on a data connection: readable means closed.
        if (rc == EAGAIN) {
            return;
        }
        failOut(*p,
                rc == 0 ? std::string("unexpected bytes on a data connection")
                        : "data connection: " + errnoText(rc),
                true, now);
        return;
    }
    for (;;) {
        FrameHeader h;
        std::span<const uint8_t> payload;
        std::string error;
        const auto parsed = c.nextFrame(kMaxHandshakePayload, &h, &payload, &error);
        if (parsed == Connection::Parse::kNeedMore) {
            break;
        }
        if (parsed == Connection::Parse::kBad) {
            failOut(*p, "protocol error on a data connection: " + error, true, now);
            return;
        }
        if (h.type == FrameType::kRefuse) {
            failOut(*p, "data connection refused by '" + p->name + "': " + printableText(payload),
                    true, now);
            return;
        }
        if (h.type == FrameType::kChallenge && !d.sent_auth) {
            std::vector<uint8_t> auth;
            HandshakeOutcome o;
            Status st = d.hs->onChallenge(payload, &auth, &o);
            c.consumeFrame(h);
            if (!st.isOk()) {
                c.queueFrame(FrameType::kRefuse, 0, bytesOf(st.message()));
                (void)c.flush(now);
                failOut(*p, st.message(), true, now);
                return;
            }
            if (o.peer_incarnation != s.remote_incarnation) {
                failOut(*p, "the peer restarted while connecting", true, now);
                return;
            }
            c.queueFrame(FrameType::kAuth, 0, auth);
            if (int wrc = c.flush(now); wrc != 0) {
                failOut(*p, "cannot send AUTH: " + errnoText(wrc), true, now);
                return;
            }
            d.sent_auth = true;
            continue;
        }
        if (h.type == FrameType::kReady && d.sent_auth && c.buffered() == kFrameHeaderBytes) {
            c.consumeFrame(h);
            d.ready = true;
            const bool all =
                std::all_of(s.data.begin(), s.data.end(), [](const OutData &x) { return x.ready; });
            if (all) {
                onUp(*p, now);
            }
            return;
        }
        failOut(*p,
                "protocol error: unexpected " + frameTypeName(static_cast<uint8_t>(h.type)) +
                    " on a data connection",
                true, now);
        return;
    }
    if (rc == ECONNRESET) {
        failOut(*p, "data connection closed by the peer", true, now);
    } else if (rc != 0 && rc != EAGAIN) {
        failOut(*p, "data connection: " + errnoText(rc), true, now);
    }
}

void PeerManagerImpl::onUp(Peer &p, int64_t now) {
    OutSession &s = *p.out;
    s.phase = OutSession::Phase::kUp;
    std::vector<Connection *> conns;
    for (OutData &d : s.data) {
        conns.push_back(d.conn.get());
    }
    s.link = std::make_unique<OutLink>(std::move(conns), cfg_.tcp.chunk_bytes,
                                      std::min<size_t>(cfg_.tcp.window, limits_.window));
    s.heartbeat_ms = heartbeatInterval(s.remote_caps);
    p.backoff_ms = cfg_.tcp.reconnect_min_ms;
    p.last_logged_error.clear();
    peerLog().info(
        "connected to peer '{}' at {} (session {:016x}, incarnation {:016x}, {} data "
        "connections)",
        p.name, s.addr.text(), s.session_id, s.remote_incarnation, s.data.size());
    setState(p, PeerState::kUp, "connected to " + s.addr.text());
    for (PendingLookup &l : p.lookups) {
        resolveLookup(p, l.name, std::move(l.done));
    }
    p.lookups.clear();
    noteDeadline(now + s.heartbeat_ms);
}

void PeerManagerImpl::failOut(Peer &p, const std::string &reason, bool reconnect, int64_t now) {
    if (!p.out) {
        return;
    }
    OutSession &s = *p.out;
    const bool was_up = s.phase == OutSession::Phase::kUp;
    const size_t in_flight = s.link ? s.link->inFlight() : 0;
    p.last_error = reason;
    ++p.failures;

    uint32_t delay = 0;
    const bool retry = reconnect && p.wanted && !stopped_;
    if (retry) {
        // Jittered so peers that lost the same node do not all come back in lockstep.
        const uint32_t base = p.backoff_ms;
        delay = base / 2 + randombytes_uniform(base / 2 + 1);
        p.backoff_ms = std::min(base * 2, cfg_.tcp.reconnect_max_ms);
    }
    const std::string retry_text =
        retry ? "; retrying in " + std::to_string(delay) + " ms" : std::string();
    if (stopped_ || !reconnect) {
        peerLog().info("session to peer '{}' closed: {}", p.name, reason);
    } else if (was_up) {
        peerLog().warn("lost peer '{}' ({}): {}; {} writes in flight fail with TL_EPEER{}", p.name,
                       p.address, reason, in_flight, retry_text);
    } else if (reason != p.last_logged_error) {
        peerLog().warn("cannot reach peer '{}' ({}): {}{}", p.name, p.address, reason, retry_text);
    } else {
        peerLog().debug("cannot reach peer '{}' ({}): {}{}", p.name, p.address, reason, retry_text);
    }
    p.last_logged_error = reason;

    // Close the connections first: their queued output points into the writes' source
    // regions, which failing the writes lets go.
    if (s.control) {
        s.control->dropOutput();
        s.control->close();
    }
    for (OutData &d : s.data) {
        if (d.conn) {
            d.conn->dropOutput();
            d.conn->close();
        }
    }
    if (s.link) {
        s.link->failAll(Code::kPeer, "peer '" + p.name + "' failed: " + reason, &completions_);
    }
    dead_out_.push_back(std::move(p.out));

    for (PendingLookup &l : p.lookups) {
        callbacks_.push_back(
            [done = std::move(l.done),
             msg = "peer '" + p.name + "' (" + p.address + ") is unreachable: " + reason] {
                done(Status{Code::kPeer, msg}, RemoteRegion{});
            });
    }
    p.lookups.clear();
    setState(p, PeerState::kFailed, reason);
    if (retry) {
        p.next_attempt_ms = now + delay;
        p.attempt_scheduled = true;
        noteDeadline(p.next_attempt_ms);
    }
    signalWake();
}

void PeerManagerImpl::applyRegionAdd(Peer &p, RegionDescriptor d) {
    auto old = p.regions.find(d.id);
    if (old != p.regions.end()) {
        auto byname = p.region_by_name.find(old->second.name);
        if (byname != p.region_by_name.end() && byname->second == d.id) {
            p.region_by_name.erase(byname);
        }
    }
    p.region_by_name[d.name] = d.id;
    p.regions[d.id] = std::move(d);
}

void PeerManagerImpl::applyRegionDel(Peer &p, uint64_t id) {
    auto it = p.regions.find(id);
    if (it == p.regions.end()) {
        return;
    }
    auto byname = p.region_by_name.find(it->second.name);
    if (byname != p.region_by_name.end() && byname->second == id) {
        p.region_by_name.erase(byname);
    }
    p.regions.erase(it);
}

}  // namespace tensorlane::sidecar
