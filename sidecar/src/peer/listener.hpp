// The accepting side of the peer layer: the bootstrap listener, the limits on connections that
// have not authenticated yet, the server side of their handshakes, and the sessions peers open
// to us (their control connections, region descriptors out, the transport they select). Their
// deadlines are liveness's (peer/liveness.hpp).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "net/connection.hpp"
#include "net/socket.hpp"
#include "peer/address.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "peer/log.hpp"
#include "peer/loop.hpp"
#include "peer/peer_table.hpp"
#include "peer/resolver.hpp"
#include "tensorlane/config/config.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

/// Limits that keep unauthenticated and misbehaving peers bounded.
struct PeerLimits {
    /// Accepted connections from unlisted addresses ([security] allow_unlisted_peers) still in
    /// their handshake, all sources together; more are closed at once. Connections from the
    /// addresses of configured peers do not count here: a flood from elsewhere never keeps a
    /// configured peer out.
    size_t max_pending_handshakes = 64;
    /// Accepted connections from one source address still in their handshake; for the address
    /// of configured peers, at least connections_per_peer + 2, times the peers at it. When a
    /// source is at its limit, its oldest connection that has not sent a HELLO yet is closed
    /// to make room; with none, the new one is.
    size_t max_pending_per_source = 16;
    /// A connection from an address no peer is known at starts a new resolution of the peers'
    /// host names, at most this often.
    int64_t address_refresh_ms = 1000;
};

class PeerListener {
public:
    /// Resolver tags of address-book lookups: this bit, then the peer id.
    static constexpr uint64_t kHostsTag = uint64_t{1} << 63;

    /// An accepted connection that has not authenticated yet.
    struct Pending {
        std::unique_ptr<Connection> conn;
        std::unique_ptr<ServerHandshake> hs;
        HostAddress source;   ///< where it comes from (port left out)
        bool listed = false;  ///< the source is a configured peer's address
        int64_t accepted_ms = 0;
        int64_t deadline_ms = 0;
        bool challenged = false;
        bool closing = false;  ///< refused: REFUSE sent, waiting for the client to close
        std::string claimed;   ///< the name its HELLO claimed, for logs
    };

    /// `key` is the shared key (a HELLO's pair key replaces it); the listening socket is
    /// registered in `poller` under `token`.
    PeerListener(const config::Config &cfg, const PeerLimits &limits, const PeerKey &key,
                 RegionTable &regions, TransportSet &transports, Poller &poller, uint64_t token,
                 PeerTable &peers, PeerLoop &loop);
    PeerListener(const PeerListener &) = delete;
    PeerListener &operator=(const PeerListener &) = delete;

    /// Listens on [node] listen; `*listen` is the address asked for (a wildcard or a specific
    /// one; the dialer leaves from a specific one).
    Status start(SockAddr *listen);
    /// Stops listening (stop(): no more connections are accepted).
    void stopListening();
    /// Closes every unauthenticated connection at once, without a word (stop()).
    void dropAllPending();

    /// The port bound (0 before start()).
    uint16_t port() const { return listen_port_; }
    /// The address bound, as text ("" before start()).
    const std::string &address() const { return listen_address_; }

    // ----- events (the loop routes them here)
    /// The listener is readable: accepts a bounded number of connections.
    void acceptAll(int64_t now);
    /// An unauthenticated connection (ConnRole::kPendingIn).
    void onPendingEvent(Connection &c, uint32_t events, int64_t now);
    /// A peer's control connection to us (ConnRole::kInControl).
    void onControlEvent(Connection &c, uint32_t events, int64_t now);
    /// An address-book lookup (a resolver result tagged kHostsTag) finished.
    void onHostsResolved(const Resolver::Result &r);
    /// Resolves the host names of the peers again (at most every address_refresh_ms).
    void refreshPeerHosts(int64_t now);

    // ----- the sessions peers opened to us
    /// Closes `p`'s session to us (and its transport's receiving side), if it has one.
    void closeIn(Peer &p, const std::string &reason, bool warn);
    /// Sends the descriptor of a region exposed now on every session to us (REGION_ADD).
    void regionExposed(const Region &r, int64_t now);
    /// Sends a revocation on every session to us (REGION_DEL).
    void regionRevoked(RegionId id, int64_t now);

    // ----- for liveness
    /// The accepted connections still in their handshake, by connection token.
    const std::unordered_map<uint64_t, Pending> &pending() const { return pending_; }
    /// Closes one of them (logged with `reason` unless it was refused already).
    void dropPending(uint64_t token, const std::string &reason, int64_t now);
    /// Until when accepting pauses after a failed accept() (0: it does not).
    int64_t pausedUntil() const { return listen_paused_until_; }
    /// Watches the listener again after a pause.
    void resumeAccepting();

    // ----- for status
    size_t pendingUnlisted() const { return pending_unlisted_; }
    uint64_t rejected() const { return rejected_; }
    const std::string &lastRejection() const { return last_rejection_; }
    uint64_t unlistedDropped() const { return unlisted_dropped_; }
    uint64_t claimsRefused() const { return claims_refused_; }

private:
    /// Whether a HELLO from `source` may proceed; picks the pair's key into `hs`.
    Status admit(const HelloMsg &hello, const HostAddress &source, ServerHandshake &hs, int64_t now,
                 std::string *log_detail);
    /// Whether `source` is an address of a configured peer; how many peers are at it.
    size_t peersAt(const HostAddress &source) const;
    /// The most pending handshakes `source` may hold.
    size_t sourceQuota(const HostAddress &source, bool listed) const;
    /// Makes room for one more pending handshake from `source`: true when there is (maybe
    /// after closing its oldest connection that has not sent a HELLO), else false with `*why`.
    bool makeRoom(const HostAddress &source, bool listed, int64_t now, std::string *why);
    /// Removes a pending handshake from the per-source counts (before it leaves pending_).
    void forgetPending(const Pending &pd);
    void promote(uint64_t token, const HandshakeOutcome &o, int64_t now);
    void refusePending(Pending &pd, const std::string &wire_reason, const std::string &log_reason,
                       int64_t now);
    bool handleControlFrame(Peer &p, const FrameHeader &h, std::span<const uint8_t> payload,
                            int64_t now);
    void sendSnapshot(Connection &control);
    void logDrop(const std::string &remote, const std::string &reason, int64_t now);

    const config::Config &cfg_;
    const PeerLimits &limits_;
    const PeerKey &key_;
    RegionTable &regions_;
    TransportSet &transports_;
    Poller &poller_;
    const uint64_t token_;
    PeerTable &peers_;
    PeerLoop &loop_;

    ipc::UniqueFd listener_;
    uint16_t listen_port_ = 0;
    std::string listen_address_;
    int64_t listen_paused_until_ = 0;

    std::unordered_map<uint64_t, Pending> pending_;  ///< by connection token
    std::map<HostAddress, size_t> pending_by_source_;
    size_t pending_unlisted_ = 0;
    int64_t hosts_refreshed_ms_ = INT64_MIN / 2;

    LogLimiter drop_log_{20, 10000};
    uint64_t rejected_ = 0;
    std::string last_rejection_;
    uint64_t unlisted_dropped_ = 0;  ///< closed at accept: no configured peer is at the address
    uint64_t claims_refused_ = 0;    ///< a peer's name claimed from another address
};

}  // namespace tensorlane::sidecar
