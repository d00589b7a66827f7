// The connecting side of the peer layer: connect attempts with jittered exponential backoff,
// the client side of handshakes, our control connection to each peer (its region descriptors,
// the choice of transport), the extra connections a transport asks for, and failure. Its
// deadlines are liveness's (peer/liveness.hpp).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "net/connection.hpp"
#include "net/socket.hpp"
#include "peer/directory.hpp"
#include "peer/log.hpp"
#include "peer/loop.hpp"
#include "peer/peer_table.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/config/config.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

class PeerDialer {
public:
    /// The descriptors peers send land in `directory`; `transports` are offered and bound.
    PeerDialer(const config::Config &cfg, TransportSet &transports, RegionDirectory &directory,
               Poller &poller, PeerTable &peers, PeerLoop &loop);
    PeerDialer(const PeerDialer &) = delete;
    PeerDialer &operator=(const PeerDialer &) = delete;

    /// Outgoing connections leave from `listen` when it is a specific address, so that peers
    /// see us come from the address they dial (verify_peer_address); a wildcard one leaves the
    /// choice to routing.
    void leaveFrom(const SockAddr &listen);

    /// Starts a connect attempt to `p` (nothing while not running or when one is under way).
    void startAttempt(Peer &p, int64_t now);
    /// Fails our session to `p` (if any), unbinds its transport, fails its lookups (those whose
    /// deadline comes after the retry wait for it, unless `refused`), and
    /// schedules a reconnect with backoff when `reconnect` and the peer is wanted.
    /// `refused`: the peer said no (REFUSE, a failed handshake): retrying the same way will not
    /// help, so waiting lookups fail now rather than wait for the retry.
    void failOut(Peer &p, const std::string &reason, bool reconnect, int64_t now,
                 bool refused = false);
    /// `p` restarted: fails our session to it and, if a reconnect waits, makes it now.
    void peerRestarted(Peer &p, int64_t now);

    // ----- events (the loop routes them here)
    /// A resolution of a peer's address for a connect attempt (tagged with the attempt).
    void onResolved(const Resolver::Result &r, int64_t now);
    /// Our control connection (ConnRole::kOutControl).
    void onControlEvent(Connection &c, uint32_t events, int64_t now);
    /// A connection a transport asked for, in its handshake (ConnRole::kOutData).
    void onExtraEvent(Connection &c, uint32_t events, int64_t now);

    // ----- what the transport asks of our session (TransportHost, through the manager)
    /// Opens `count` authenticated connections of our session to `p` for its transport.
    void openChannels(Peer &p, uint32_t count);
    /// The transport of our session to `p` is ready: the session is up.
    void sessionReady(Peer &p, int64_t now);

private:
    /// A connection of `p`'s session still connecting saw `events`: false while it is still
    /// connecting, or when the connect failed (the session is failed then); true once it is
    /// established (connecting cleared).
    bool finishConnect(Peer &p, Connection &c, uint32_t events, int64_t now);
    void beginConnect(Peer &p, const SockAddr &addr, int64_t now);
    bool openConnection(Peer &p, ConnRole role, uint32_t index, int64_t now,
                        std::unique_ptr<Connection> *out);
    bool handleControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                            int64_t now);
    void onSynced(Peer &p, int64_t now);
    void onSelected(Peer &p, uint64_t kind, std::span<const uint8_t> blob, int64_t now);
    void onUp(Peer &p, int64_t now);
    /// The transport our session to `p` should use: the first of ours, in preference order,
    /// that is available here and that the peer announced; or nullptr with `*why`, and
    /// `*transient` set when one of ours was passed over only because it is not usable now.
    Transport *chooseTransport(const Peer &p, const PeerCaps &remote, std::string *why,
                               bool *transient);

    const config::Config &cfg_;
    TransportSet &transports_;
    RegionDirectory &directory_;
    Poller &poller_;
    PeerTable &peers_;
    PeerLoop &loop_;

    std::optional<SockAddr> bind_source_;
    uint64_t next_attempt_ = 1;
    LogLimiter region_log_{5, 10000};
};

}  // namespace tensorlane::sidecar
