// The connecting side: connect attempts with jittered exponential backoff, the client
// handshake, region descriptors from the peer, the choice of transport, the extra
// connections a transport asks for, and failure.
#include "peer/dialer.hpp"

#include <sodium.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/frame_reader.hpp"
#include "peer/text.hpp"

namespace tensorlane::sidecar {

namespace {

std::span<const uint8_t> bytesOf(const std::string &s) {
    return {reinterpret_cast<const uint8_t *>(s.data()), s.size()};
}

}  // namespace

PeerDialer::PeerDialer(const config::Config &cfg, TransportSet &transports,
                       RegionDirectory &directory, Poller &poller, PeerTable &peers, PeerLoop &loop)
    : cfg_(cfg),
      transports_(transports),
      directory_(directory),
      poller_(poller),
      peers_(peers),
      loop_(loop) {}

void PeerDialer::leaveFrom(const SockAddr &listen) {
    if (const HostAddress h = hostOf(listen); !h.empty() && h.bytes != std::array<uint8_t, 16>{}) {
        SockAddr src = listen;
        if (src.storage.ss_family == AF_INET) {
            reinterpret_cast<sockaddr_in *>(&src.storage)->sin_port = 0;
        } else {
            reinterpret_cast<sockaddr_in6 *>(&src.storage)->sin6_port = 0;
        }
        bind_source_ = src;
    }
}

void PeerDialer::startAttempt(Peer &p, int64_t now) {
    p.attempt_scheduled = false;
    if (!loop_.running() || p.out) {
        return;
    }
    auto s = std::make_unique<OutSession>();
    s->attempt = next_attempt_++;
    s->deadline_ms = now + cfg_.tcp.connect_timeout_ms;
    loop_.noteDeadline(s->deadline_ms);
    loop_.setState(p, PeerState::kConnecting, "connecting to " + p.address);
    SockAddr addr;
    if (parseNumericAddress(p.host, p.port, &addr)) {
        p.out = std::move(s);
        beginConnect(p, addr, now);
        return;
    }
    s->phase = OutSession::Phase::kResolving;
    const uint64_t tag = s->attempt;
    p.out = std::move(s);
    if (Resolver *resolver = loop_.resolver(); resolver != nullptr) {
        resolver->request(tag, p.host, p.port);
    }
}

void PeerDialer::onResolved(const Resolver::Result &r, int64_t now) {
    for (Peer &p : peers_) {
        if (p.out && p.out->attempt == r.tag && p.out->phase == OutSession::Phase::kResolving) {
            if (r.rc != 0) {
                failOut(p, r.error, true, now);
            } else {
                // The address we dial is one the peer may connect from, too.
                if (const HostAddress h = hostOf(r.addr);
                    std::find(p.hosts.begin(), p.hosts.end(), h) == p.hosts.end()) {
                    p.hosts.push_back(h);
                }
                beginConnect(p, r.addr, now);
            }
            return;
        }
    }
}

bool PeerDialer::openConnection(Peer &p, ConnRole role, uint32_t index, int64_t now,
                                std::unique_ptr<Connection> *out) {
    ipc::UniqueFd fd;
    bool in_progress = false;
    const int rc =
        connectTcp(p.out->addr, &fd, &in_progress, bind_source_ ? &*bind_source_ : nullptr);
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

void PeerDialer::beginConnect(Peer &p, const SockAddr &addr, int64_t now) {
    OutSession &s = *p.out;
    s.addr = addr;
    s.phase = OutSession::Phase::kConnecting;
    s.hs = std::make_unique<ClientHandshake>(p.key, loop_.identity(), p.name, LinkRole::kControl, 0,
                                             0);
    std::unique_ptr<Connection> c;
    if (!openConnection(p, ConnRole::kOutControl, 0, now, &c)) {
        return;
    }
    s.control = std::move(c);
}

void PeerDialer::peerRestarted(Peer &p, int64_t now) {
    if (p.out) {
        failOut(p, "the peer restarted (new incarnation)", true, now);
    }
    if (p.attempt_scheduled) {
        // It is back: reconnect now instead of waiting out the backoff.
        p.backoff_ms = cfg_.tcp.reconnect_min_ms;
        p.next_attempt_ms = now;
        loop_.noteDeadline(now);
    }
}

void PeerDialer::openChannels(Peer &p, uint32_t count) {
    if (!p.out) {
        return;
    }
    OutSession &s = *p.out;
    const int64_t now = monotonicMs();
    s.extras.resize(count);
    for (uint32_t i = 0; i < count; ++i) {
        s.extras[i].hs = std::make_unique<ClientHandshake>(p.key, loop_.identity(), p.name,
                                                           LinkRole::kData, s.session_id, i);
        std::unique_ptr<Connection> c;
        if (!openConnection(p, ConnRole::kOutData, i, now, &c)) {
            return;  // failOut ran
        }
        s.extras[i].conn = std::move(c);
    }
}

void PeerDialer::sessionReady(Peer &p, int64_t now) {
    if (p.out && p.out->phase == OutSession::Phase::kOpening) {
        onUp(p, now);
    }
}

bool PeerDialer::finishConnect(Peer &p, Connection &c, uint32_t events, int64_t now) {
    if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) {
        return false;
    }
    if (int rc = connectResult(c.fd()); rc != 0) {
        failOut(p, "cannot connect to " + c.remote() + ": " + std::strerror(rc), true, now);
        return false;
    }
    c.connecting = false;
    return true;
}

void PeerDialer::onControlEvent(Connection &c, uint32_t events, int64_t now) {
    Peer *p = peers_.byId(c.peer);
    if (p == nullptr || !p->out || p->out->control.get() != &c) {
        return;
    }
    OutSession &s = *p->out;
    if (c.connecting) {
        if (!finishConnect(*p, c, events, now)) {
            return;
        }
        s.phase = OutSession::Phase::kHandshake;
        // The handshake gets its own deadline, counted from the established connection.
        s.deadline_ms = now + cfg_.tcp.connect_timeout_ms;
        loop_.noteDeadline(s.deadline_ms);
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
    const FramesRead r = readFrames(
        c, now,
        [&] {
            return s.phase == OutSession::Phase::kHandshake ? kMaxHandshakePayload
                                                            : kMaxControlPayload;
        },
        [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            // false: the session failed; `c` is closed
            return handleControlFrame(*p, h, payload, now) ? FrameStep::kNext : FrameStep::kStop;
        });
    if (r.end == FramesRead::End::kBad) {
        failOut(*p, "protocol error on the control connection: " + r.error, true, now);
    } else if (r.end == FramesRead::End::kClosed) {
        failOut(*p, "connection closed by the peer", true, now);
    } else if (r.end == FramesRead::End::kFailed) {
        failOut(*p, "control connection: " + errnoText(r.rc), true, now);
    }
}

bool PeerDialer::handleControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                                    int64_t now) {
    OutSession &s = *p.out;
    auto protocolError = [&](const std::string &what) {
        failOut(p, "protocol error: " + what, true, now);
        return false;
    };
    if (h.type == FrameType::kRefuse) {
        failOut(p, "refused by '" + p.name + "': " + printableText(payload), true, now, true);
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
                failOut(p, st.message(), true, now, true);
                return false;
            }
            s.control->queueFrame(FrameType::kAuth, 0, auth);
            if (int rc = s.control->flush(now); rc != 0) {
                failOut(p, "cannot send AUTH: " + errnoText(rc), true, now);
                return false;
            }
            // Every later frame on this connection, either way, carries a tag.
            enableFrameTags(*s.control, o, true);
            s.integrity = o.integrity;
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
                // Bounded like the live descriptors: the directory keeps at most
                // peer_regions of them; a peer cannot make us hold more here either.
                if (s.staged.size() < cfg_.limits.peer_regions || s.staged.count(d.id) != 0) {
                    s.staged[d.id] = std::move(d);
                }
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
        case Phase::kSelecting:
        case Phase::kOpening:
        case Phase::kUp:
            if (h.type == FrameType::kRegionAdd) {
                RegionDescriptor d;
                if (!decodeRegionAdd(h.arg, payload, &d)) {
                    return protocolError("malformed REGION_ADD");
                }
                if (!directory_.add(p.id, std::move(d))) {
                    uint64_t suppressed = 0;
                    if (region_log_.allow(now, &suppressed)) {
                        peerLog().warn(
                            "peer '{}' describes more than [limits] peer_regions = {} regions; "
                            "ignoring the rest ({} ignored so far)",
                            p.name, cfg_.limits.peer_regions, directory_.dropped(p.id));
                    }
                }
                return true;
            }
            if (h.type == FrameType::kRegionDel) {
                directory_.remove(p.id, h.arg);
                return true;
            }
            if (h.type == FrameType::kSelected && s.phase == Phase::kSelecting) {
                onSelected(p, h.arg, payload, now);
                return p.out != nullptr;
            }
            // A transport's own messages (ACKs, keys, credits) never come here: they ride
            // its own channels.
            return protocolError("unexpected " + frameTypeName(static_cast<uint8_t>(h.type)));
        default:
            return protocolError("frame before the connection was established");
    }
}

void PeerDialer::onSynced(Peer &p, int64_t now) {
    OutSession &s = *p.out;
    if (p.remote_incarnation != 0 && p.remote_incarnation != s.remote_incarnation) {
        peerLog().info(
            "peer '{}' restarted (incarnation {:016x} -> {:016x}): its regions are new; "
            "handles from before fail with TL_ENOENT",
            p.name, p.remote_incarnation, s.remote_incarnation);
    }
    p.remote_incarnation = s.remote_incarnation;
    directory_.replace(p.id, s.remote_incarnation, std::move(s.staged));
    s.staged.clear();
    // The transport both ends can use: verbs where both announce it, else tcp (which every
    // node speaks). Its own bootstrap data rides along.
    std::string why;
    bool transient = false;
    Transport *t = chooseTransport(p, s.remote_caps, &why, &transient);
    if (t == nullptr) {
        // Reconnect later all the same (a file may change, a port come up), but lookups waiting
        // on this attempt fail now unless one of ours is only down for the moment: two nodes
        // without a transport in common stay so however long a lookup waits (issue 24/26).
        failOut(p, why, true, now, /*refused=*/!transient);
        return;
    }
    std::vector<uint8_t> blob = t->localBlob(p.id, SessionSide::kOut);
    if (blob.empty()) {
        failOut(p, std::string("the ") + t->name() + " transport cannot make a session now", true,
                now);
        return;
    }
    s.transport = t;
    s.phase = OutSession::Phase::kSelecting;
    s.deadline_ms = now + cfg_.tcp.connect_timeout_ms;
    loop_.noteDeadline(s.deadline_ms);
    s.control->queueFrame(FrameType::kSelect, t->caps().wire_id, blob);
    if (int rc = s.control->flush(now); rc != 0) {
        failOut(p, "cannot send SELECT: " + errnoText(rc), true, now);
    }
}

void PeerDialer::onSelected(Peer &p, uint64_t kind, std::span<const uint8_t> blob, int64_t now) {
    OutSession &s = *p.out;
    if (s.transport == nullptr || kind != s.transport->caps().wire_id) {
        failOut(p, "the peer selected transport " + std::to_string(kind) + ", not the one offered",
                true, now);
        return;
    }
    SessionInfo info = sessionInfo(p, s.session_id, s.remote_incarnation, s.integrity);
    info.remote_blob.assign(blob.begin(), blob.end());
    s.phase = OutSession::Phase::kOpening;
    s.transport_open = true;
    Transport *t = s.transport;
    uint32_t channels = 0;  // kOut: the transport asks for its channels itself
    Status st = t->openSession(p.id, SessionSide::kOut, info, &channels);
    if (!st.isOk() && p.out) {
        failOut(p, "cannot open the " + std::string(t->name()) + " session: " + st.message(), true,
                now);
    }
}

void PeerDialer::onExtraEvent(Connection &c, uint32_t events, int64_t now) {
    Peer *p = peers_.byId(c.peer);
    if (p == nullptr || !p->out || c.index >= p->out->extras.size() ||
        p->out->extras[c.index].conn.get() != &c) {
        return;
    }
    OutSession &s = *p->out;
    OutExtra &d = s.extras[c.index];
    if (c.connecting) {
        if (!finishConnect(*p, c, events, now)) {
            return;
        }
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
    const FramesRead r = readFrames(
        c, now, kMaxHandshakePayload, [&](const FrameHeader &h, std::span<const uint8_t> payload) {
            if (h.type == FrameType::kRefuse) {
                failOut(*p,
                        "data connection refused by '" + p->name + "': " + printableText(payload),
                        true, now);
                return FrameStep::kStop;
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
                    return FrameStep::kStop;
                }
                if (o.peer_incarnation != s.remote_incarnation) {
                    failOut(*p, "the peer restarted while connecting", true, now);
                    return FrameStep::kStop;
                }
                c.queueFrame(FrameType::kAuth, 0, auth);
                if (int wrc = c.flush(now); wrc != 0) {
                    failOut(*p, "cannot send AUTH: " + errnoText(wrc), true, now);
                    return FrameStep::kStop;
                }
                // Everything after AUTH is tagged, both ways (the server's READY first).
                enableFrameTags(c, o, true);
                d.sent_auth = true;
                return FrameStep::kNext;
            }
            if (h.type == FrameType::kReady && d.sent_auth) {
                c.consumeFrame(h);
                // Authenticated: the transport owns it from here, with any bytes that came after
                // READY (a transport's channel may speak at once).
                std::unique_ptr<Connection> conn = std::move(d.conn);
                const uint32_t index = conn->index;
                d.hs.reset();
                s.transport->adoptChannel(p->id, SessionSide::kOut, index, std::move(conn));
                return FrameStep::kStop;
            }
            failOut(*p,
                    "protocol error: unexpected " + frameTypeName(static_cast<uint8_t>(h.type)) +
                        " on a data connection",
                    true, now);
            return FrameStep::kStop;
        });
    if (r.end == FramesRead::End::kBad) {
        failOut(*p, "protocol error on a data connection: " + r.error, true, now);
        return;
    }
    if (r.end == FramesRead::End::kClosed) {
        failOut(*p, "data connection closed by the peer", true, now);
    } else if (r.end == FramesRead::End::kFailed) {
        failOut(*p, "data connection: " + errnoText(r.rc), true, now);
    }
}

void PeerDialer::onUp(Peer &p, int64_t now) {
    OutSession &s = *p.out;
    s.phase = OutSession::Phase::kUp;
    s.heartbeat_ms = heartbeatInterval(cfg_, s.remote_caps);
    p.backoff_ms = cfg_.tcp.reconnect_min_ms;
    p.last_refused = false;
    p.last_logged_error.clear();
    // The session is up: an earlier attempt's reason no longer describes the peer (status
    // would show an up peer with, say, an old authentication error). `failures` keeps count.
    p.last_error.clear();
    peerLog().info(
        "connected to peer '{}' at {} over {} (session {:016x}, incarnation {:016x}, frames "
        "{})",
        p.name, s.addr.text(), s.transport->name(), s.session_id, s.remote_incarnation,
        s.integrity ? "authenticated" : "not authenticated (tcp_integrity = none)");
    transports_.bind(p.id, s.transport);
    loop_.setState(p, PeerState::kUp, "connected to " + s.addr.text());
    loop_.answerLookups(p);
    loop_.noteDeadline(now + s.heartbeat_ms);
}

Transport *PeerDialer::chooseTransport(const Peer &p, const PeerCaps &remote, std::string *why,
                                       bool *transient) {
    // Ours in preference order ([fabric] transports): the first this node can use now and the
    // peer announced. Never a silent fallback to one the file did not list.
    std::string skipped;  // for the log: why better ones were passed over
    std::string refused;  // for the error: why each one cannot be used
    for (Transport *t : transports_.remote()) {
        const std::string name = t->name();
        if (!t->available()) {
            *transient = true;  // ours, down now: it may come back
            skipped += (skipped.empty() ? "" : "; ") + ("this node's " + name) +
                       " transport is not usable now";
            refused += (refused.empty() ? "" : "; ") + ("this node cannot use " + name) +
                       " now (its device or port is not usable)";
            continue;
        }
        if ((remote.transports & t->caps().wire_id) == 0) {
            skipped += (skipped.empty() ? "" : "; ") + ("it offers no " + name) + " transport";
            refused += (refused.empty() ? "" : "; ") + ("peer '" + p.name) + "' cannot use " +
                       name + " (no such device there, or not in its [fabric] transports)";
            continue;
        }
        if (!skipped.empty()) {
            peerLog().info("peer '{}' uses {}: {}", p.name, name, skipped);
        }
        return t;
    }
    std::string listed;
    for (const std::string &n : config::transportPreference(cfg_.fabric)) {
        listed += (listed.empty() ? "\"" : ", \"") + n + "\"";
    }
    *why = (cfg_.fabric.transports.empty()
                ? "[fabric] transport = \"" + std::string(config::toString(cfg_.fabric.transport)) +
                      "\""
                : "[fabric] transports = [" + listed + "]") +
           ", but " + refused;
    return nullptr;
}

void PeerDialer::failOut(Peer &p, const std::string &reason, bool reconnect, int64_t now,
                         bool refused) {
    if (!p.out) {
        return;
    }
    OutSession &s = *p.out;
    const bool was_up = s.phase == OutSession::Phase::kUp;
    p.last_error = reason;
    p.last_failure_ms = now;
    p.last_refused = refused;
    ++p.failures;

    uint32_t delay = 0;
    const bool retry = reconnect && p.wanted && !loop_.stopped();
    if (retry) {
        // Jittered so peers that lost the same node do not all come back in lockstep.
        const uint32_t base = p.backoff_ms;
        delay = base / 2 + randombytes_uniform(base / 2 + 1);
        p.backoff_ms = std::min(base * 2, cfg_.tcp.reconnect_max_ms);
    }
    const std::string retry_text =
        retry ? "; retrying in " + std::to_string(delay) + " ms" : std::string();
    if (loop_.stopped() || !reconnect) {
        peerLog().info("session to peer '{}' closed: {}", p.name, reason);
    } else if (was_up) {
        peerLog().warn("lost peer '{}' ({}): {}; writes in flight fail with TL_EPEER{}", p.name,
                       p.address, reason, retry_text);
    } else if (reason != p.last_logged_error) {
        peerLog().warn("cannot reach peer '{}' ({}): {}{}", p.name, p.address, reason, retry_text);
    } else {
        peerLog().debug("cannot reach peer '{}' ({}): {}{}", p.name, p.address, reason, retry_text);
    }
    p.last_logged_error = reason;

    if (s.control) {
        s.control->dropOutput();
        s.control->close();
    }
    for (OutExtra &d : s.extras) {
        if (d.conn) {
            d.conn->close();
        }
    }
    // New writes fail at once; the transport fails every write in flight; each ends exactly
    // once, with TL_EPEER.
    transports_.unbind(p.id, "peer '" + p.name + "' is down: " + reason);
    std::unique_ptr<OutSession> dead = std::move(p.out);
    if (dead->transport != nullptr) {
        // Also before SELECTED: the transport may hold queue pairs made for SELECT.
        dead->transport->closeSession(p.id, SessionSide::kOut, Code::kPeer,
                                      "peer '" + p.name + "' failed: " + reason);
    }
    loop_.retire(std::move(dead));

    // A lookup whose deadline comes after the retry waits for it (an attempt that failed once,
    // a connection the peer closed to make room for others, is often followed by one that
    // works, 30-50 ms later); the others fail now, with the reason.
    for (auto it = p.lookups.begin(); it != p.lookups.end();) {
        if (retry && !refused && now + delay < it->deadline_ms) {
            ++it;
            continue;
        }
        loop_.defer([done = std::move(it->done),
                     msg = "peer '" + p.name + "' (" + p.address + ") is unreachable: " + reason] {
            done(Status{Code::kPeer, msg}, RemoteRegion{});
        });
        it = p.lookups.erase(it);
    }
    loop_.setState(p, PeerState::kFailed, reason);
    if (retry) {
        p.next_attempt_ms = now + delay;
        p.attempt_scheduled = true;
        loop_.noteDeadline(p.next_attempt_ms);
    }
    loop_.signalWake();
}

}  // namespace tensorlane::sidecar
