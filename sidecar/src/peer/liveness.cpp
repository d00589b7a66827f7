// Deadlines of the peer layer, all on one timerfd: handshakes that take too long, listener
// pauses, reconnect backoff, heartbeats on idle control connections, peers that went silent
// (peer_timeout_ms), and lookups that wait for a connection.
#include <cstring>

#include "peer/manager.hpp"

namespace tensorlane::sidecar {

void PeerManagerImpl::runTimers(int64_t now) {
    // Everything below that sets a deadline (a reconnect scheduled by failOut, a handshake
    // deadline set by startAttempt) lowers next_deadline_ through noteDeadline() or due().
    next_deadline_ = INT64_MAX;
    const std::function<void(int64_t)> due = [this](int64_t at) {
        next_deadline_ = std::min(next_deadline_, at);
    };

    if (listen_paused_until_ != 0) {
        if (now >= listen_paused_until_) {
            listen_paused_until_ = 0;
            if (listener_) {
                poller_.add(listener_.get(), EPOLLIN, kTokenListen);
            }
        } else {
            due(listen_paused_until_);
        }
    }

    std::vector<uint64_t> expired;
    for (const auto &[token, pd] : pending_) {
        if (now >= pd.deadline_ms) {
            expired.push_back(token);
        } else {
            due(pd.deadline_ms);
        }
    }
    for (uint64_t token : expired) {
        auto it = pending_.find(token);
        const bool closing = it->second.closing;
        dropPending(token,
                    closing ? std::string("refused")
                            : "no complete handshake within " +
                                  std::to_string(cfg_.tcp.connect_timeout_ms) +
                                  " ms (half-open or slow connection)",
                    now);
    }

    for (Peer &p : peers_) {
        if (p.attempt_scheduled) {
            if (now >= p.next_attempt_ms) {
                startAttempt(p, now);
            } else {
                due(p.next_attempt_ms);
            }
        }
        checkOut(p, now, due);
        checkIn(p, now, due);
        checkLookups(p, now, due);
    }
}

void PeerManagerImpl::checkOut(Peer &p, int64_t now, const std::function<void(int64_t)> &due) {
    if (!p.out) {
        return;
    }
    OutSession &s = *p.out;
    const int64_t timeout = cfg_.tcp.peer_timeout_ms;
    if (s.phase != OutSession::Phase::kUp) {
        if (now >= s.deadline_ms) {
            using Phase = OutSession::Phase;
            const char *what = s.phase == Phase::kResolving    ? "resolving"
                               : s.phase == Phase::kConnecting ? "connecting"
                               : s.phase == Phase::kHandshake  ? "authenticating"
                               : s.phase == Phase::kSyncing    ? "reading the region snapshot"
                                                               : "opening the transport";
            failOut(p,
                    "no answer within " + std::to_string(cfg_.tcp.connect_timeout_ms) +
                        " ms while " + what,
                    true, now);
        } else {
            due(s.deadline_ms);
        }
        return;
    }
    Connection &ctl = *s.control;
    if (now - ctl.last_rx_ms >= timeout) {
        failOut(p,
                "nothing heard from the peer for " + std::to_string(now - ctl.last_rx_ms) +
                    " ms (peer_timeout_ms " + std::to_string(timeout) + ")",
                true, now);
        return;
    }
    if (now - ctl.last_tx_ms >= s.heartbeat_ms) {
        ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
        if (int rc = ctl.flush(now); rc != 0) {
            failOut(p, std::string("control connection: ") + std::strerror(rc), true, now);
            return;
        }
    }
    due(ctl.last_tx_ms + s.heartbeat_ms);
    due(ctl.last_rx_ms + timeout);
}

void PeerManagerImpl::checkIn(Peer &p, int64_t now, const std::function<void(int64_t)> &due) {
    if (!p.in) {
        return;
    }
    const int64_t timeout = cfg_.tcp.peer_timeout_ms;
    Connection &ctl = *p.in->control;
    if (now - ctl.last_rx_ms >= timeout) {
        closeIn(p,
                "nothing heard for " + std::to_string(now - ctl.last_rx_ms) +
                    " ms (peer_timeout_ms " + std::to_string(timeout) + ")",
                true);
        return;
    }
    if (now - ctl.last_tx_ms >= p.in->heartbeat_ms) {
        ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
        if (int rc = ctl.flush(now); rc != 0) {
            closeIn(p, std::string("control connection: ") + std::strerror(rc), true);
            return;
        }
    }
    due(ctl.last_tx_ms + p.in->heartbeat_ms);
    due(ctl.last_rx_ms + timeout);
}

void PeerManagerImpl::checkLookups(Peer &p, int64_t now, const std::function<void(int64_t)> &due) {
    for (auto it = p.lookups.begin(); it != p.lookups.end();) {
        if (now >= it->deadline_ms) {
            callbacks_.push_back(
                [done = std::move(it->done),
                 msg = "peer '" + p.name + "' (" + p.address + ") did not answer in time"] {
                    done(Status{Code::kPeer, msg}, RemoteRegion{});
                });
            it = p.lookups.erase(it);
        } else {
            due(it->deadline_ms);
            ++it;
        }
    }
}

}  // namespace tensorlane::sidecar
