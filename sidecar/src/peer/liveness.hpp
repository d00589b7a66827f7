// Deadlines of the peer layer, all on one timerfd: handshakes that take too long (accepted
// connections and each phase of a connect attempt), listener pauses, reconnect backoff,
// heartbeats on idle control connections, peers that went silent (peer_timeout_ms), and lookups
// that wait for a connection. Liveness decides when; the listener and the dialer close.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>

#include "peer/dialer.hpp"
#include "peer/listener.hpp"
#include "peer/loop.hpp"
#include "peer/peer_table.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/fd.hpp"

namespace tensorlane::sidecar {

class PeerLiveness {
public:
    PeerLiveness(const config::Config &cfg, PeerTable &peers, PeerLoop &loop,
                 PeerListener &listener, PeerDialer &dialer);
    PeerLiveness(const PeerLiveness &) = delete;
    PeerLiveness &operator=(const PeerLiveness &) = delete;

    /// Creates the timerfd.
    Status open();
    /// The timerfd, readable when the armed deadline passed (the loop polls it).
    int timerFd() const { return timer_.get(); }

    /// Lowers the next deadline to `at`; rearm() sets the timer to it.
    void note(int64_t at) { next_deadline_ = std::min(next_deadline_, at); }
    /// Arms the timerfd for the next deadline (nothing when it is armed for it already).
    void rearm();
    /// The timerfd fired: its deadline passed, so the next run() is due whatever `now` says.
    void fired(int64_t now);
    /// A deadline passed.
    bool due(int64_t now) const { return now >= next_deadline_; }
    /// Acts on every deadline passed and notes the next ones.
    void run(int64_t now);

private:
    using Due = std::function<void(int64_t)>;
    void checkPending(int64_t now, const Due &due);
    void checkOut(Peer &p, int64_t now, const Due &due);
    void checkIn(Peer &p, int64_t now, const Due &due);
    void checkLookups(Peer &p, int64_t now, const Due &due);

    const config::Config &cfg_;
    PeerTable &peers_;
    PeerLoop &loop_;
    PeerListener &listener_;
    PeerDialer &dialer_;

    ipc::UniqueFd timer_;
    int64_t next_deadline_ = INT64_MAX;
    int64_t armed_deadline_ = INT64_MAX;
};

}  // namespace tensorlane::sidecar
