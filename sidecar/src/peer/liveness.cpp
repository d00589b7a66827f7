// Deadlines of the peer layer (peer/liveness.hpp).
#include "peer/liveness.hpp"

#include <sys/timerfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace tensorlane::sidecar {

PeerLiveness::PeerLiveness(const config::Config &cfg, PeerTable &peers, PeerLoop &loop,
                           PeerListener &listener, PeerDialer &dialer)
    : cfg_(cfg), peers_(peers), loop_(loop), listener_(listener), dialer_(dialer) {}

Status PeerLiveness::open() {
    int tfd = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tfd < 0) {
        return {Code::kInternal, std::string("timerfd_create: ") + std::strerror(errno)};
    }
    timer_.reset(tfd);
    return Status::ok();
}

void PeerLiveness::rearm() {
    if (next_deadline_ == armed_deadline_ || !timer_) {
        return;
    }
    itimerspec its{};
    if (next_deadline_ != INT64_MAX) {
        // An absolute CLOCK_MONOTONIC time: the same clock monotonicMs() reads. A zero value
        // would disarm, so a deadline already passed becomes 1 ns.
        const int64_t ms = std::max<int64_t>(next_deadline_, 0);
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (ms % 1000) * 1000000;
        if (its.it_value.tv_sec == 0 && its.it_value.tv_nsec == 0) {
            its.it_value.tv_nsec = 1;
        }
    }
    ::timerfd_settime(timer_.get(), TFD_TIMER_ABSTIME, &its, nullptr);
    armed_deadline_ = next_deadline_;
}

void PeerLiveness::fired(int64_t now) {
    uint64_t expirations = 0;
    [[maybe_unused]] ssize_t n = ::read(timer_.get(), &expirations, sizeof expirations);
    // The armed deadline fired; force a timer pass even if the clock read above is a hair
    // early.
    next_deadline_ = std::min(next_deadline_, now);
    armed_deadline_ = INT64_MAX;
}

void PeerLiveness::run(int64_t now) {
    // Everything below that sets a deadline (a reconnect scheduled by failOut, a handshake
    // deadline set by startAttempt) lowers next_deadline_ through the loop's noteDeadline()
    // (which comes to note()) or due().
    next_deadline_ = INT64_MAX;
    const Due due = [this](int64_t at) { note(at); };

    if (const int64_t until = listener_.pausedUntil(); until != 0) {
        if (now >= until) {
            listener_.resumeAccepting();
        } else {
            due(until);
        }
    }
    checkPending(now, due);

    for (Peer &p : peers_) {
        if (p.attempt_scheduled) {
            if (now >= p.next_attempt_ms) {
                dialer_.startAttempt(p, now);
            } else {
                due(p.next_attempt_ms);
            }
        }
        checkOut(p, now, due);
        checkIn(p, now, due);
        checkLookups(p, now, due);
    }
}

void PeerLiveness::checkPending(int64_t now, const Due &due) {
    std::vector<uint64_t> expired;
    for (const auto &[token, pd] : listener_.pending()) {
        if (now >= pd.deadline_ms) {
            expired.push_back(token);
        } else {
            due(pd.deadline_ms);
        }
    }
    for (uint64_t token : expired) {
        auto it = listener_.pending().find(token);
        if (it == listener_.pending().end()) {
            continue;
        }
        const bool closing = it->second.closing;
        listener_.dropPending(token,
                              closing ? std::string("refused")
                                      : "no complete handshake within " +
                                            std::to_string(cfg_.tcp.connect_timeout_ms) +
                                            " ms (half-open or slow connection)",
                              now);
    }
}

void PeerLiveness::checkOut(Peer &p, int64_t now, const Due &due) {
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
            dialer_.failOut(p,
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
        dialer_.failOut(p,
                        "nothing heard from the peer for " + std::to_string(now - ctl.last_rx_ms) +
                            " ms (peer_timeout_ms " + std::to_string(timeout) + ")",
                        true, now);
        return;
    }
    if (now - ctl.last_tx_ms >= s.heartbeat_ms) {
        ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
        if (int rc = ctl.flush(now); rc != 0) {
            dialer_.failOut(p, std::string("control connection: ") + std::strerror(rc), true, now);
            return;
        }
    }
    due(ctl.last_tx_ms + s.heartbeat_ms);
    due(ctl.last_rx_ms + timeout);
}

void PeerLiveness::checkIn(Peer &p, int64_t now, const Due &due) {
    if (!p.in) {
        return;
    }
    const int64_t timeout = cfg_.tcp.peer_timeout_ms;
    Connection &ctl = *p.in->control;
    if (now - ctl.last_rx_ms >= timeout) {
        listener_.closeIn(p,
                          "nothing heard for " + std::to_string(now - ctl.last_rx_ms) +
                              " ms (peer_timeout_ms " + std::to_string(timeout) + ")",
                          true);
        return;
    }
    if (now - ctl.last_tx_ms >= p.in->heartbeat_ms) {
        ctl.queueFrame(FrameType::kHeartbeat, static_cast<uint64_t>(now));
        if (int rc = ctl.flush(now); rc != 0) {
            listener_.closeIn(p, std::string("control connection: ") + std::strerror(rc), true);
            return;
        }
    }
    due(ctl.last_tx_ms + p.in->heartbeat_ms);
    due(ctl.last_rx_ms + timeout);
}

void PeerLiveness::checkLookups(Peer &p, int64_t now, const Due &due) {
    for (auto it = p.lookups.begin(); it != p.lookups.end();) {
        if (now >= it->deadline_ms) {
            std::string msg = "peer '" + p.name + "' (" + p.address + ") did not answer in time";
            if (!p.last_error.empty() && p.state != PeerState::kUp) {
                msg += " (last attempt: " + p.last_error + ")";
            }
            loop_.defer([done = std::move(it->done), msg = std::move(msg)] {
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
