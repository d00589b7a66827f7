// The peer table: every configured peer and the two one-way sessions it may hold (ours to it,
// "out", and its to us, "in"). The manager owns the table; the listener, the dialer and
// liveness read and change the entries (docs/peers.md, "Sessions are one-way").
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "net/connection.hpp"
#include "net/socket.hpp"
#include "peer/address.hpp"
#include "peer/directory.hpp"
#include "peer/handshake.hpp"
#include "peer/key.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "transport/set.hpp"

namespace tensorlane::sidecar {

/// A connection of our session that is still in its handshake (a transport asked for it).
struct OutExtra {
    std::unique_ptr<Connection> conn;
    std::unique_ptr<ClientHandshake> hs;
    bool sent_auth = false;
};

/// Our session to a peer, from the first connect until it fails (the dialer's).
struct OutSession {
    enum class Phase { kResolving, kConnecting, kHandshake, kSyncing, kSelecting, kOpening, kUp };
    Phase phase = Phase::kResolving;
    uint64_t attempt = 0;
    SockAddr addr;
    std::unique_ptr<Connection> control;
    std::unique_ptr<ClientHandshake> hs;
    std::vector<OutExtra> extras;  ///< by index
    uint64_t session_id = 0;
    uint64_t remote_incarnation = 0;
    PeerCaps remote_caps;
    bool integrity = false;
    std::map<uint64_t, RegionDescriptor> staged;  ///< the snapshot until READY
    Transport *transport = nullptr;               ///< chosen at SELECT
    bool transport_open = false;
    int64_t deadline_ms = 0;  ///< for the phase, until up
    int64_t heartbeat_ms = 0;
};

/// A peer's authenticated session to us (the listener's).
struct InSession {
    uint64_t session_id = 0;
    uint64_t remote_incarnation = 0;
    PeerCaps remote_caps;
    bool integrity = false;
    std::unique_ptr<Connection> control;
    uint32_t data_expected = 0;  ///< channels the transport takes (its openSession says)
    std::vector<bool> data_taken;
    Transport *transport = nullptr;  ///< the one the peer selected
    bool transport_open = false;
    int64_t heartbeat_ms = 0;
};

/// A lookup that waits for our session to the peer to come up.
struct PendingLookup {
    std::string name;
    std::function<void(Status, RemoteRegion)> done;
    int64_t deadline_ms = 0;
};

/// One configured peer.
struct Peer {
    PeerId id = 0;
    std::string name;
    std::string host;
    uint16_t port = 0;
    std::string address;  ///< as configured, for status and logs
    /// The key of this pair of nodes: [[peers]] key_file, or the shared key.
    PeerKey key;
    /// What `host` resolves to: the addresses its connections may come from.
    std::vector<HostAddress> hosts;
    bool numeric = false;          ///< `host` is a literal address (never resolved)
    bool hosts_resolving = false;  ///< a resolution of every address is queued
    PeerState state = PeerState::kDown;
    bool wanted = false;
    std::unique_ptr<OutSession> out;
    std::unique_ptr<InSession> in;
    bool attempt_scheduled = false;
    int64_t next_attempt_ms = 0;
    uint32_t backoff_ms = 0;
    uint64_t remote_incarnation = 0;  ///< of the regions in the directory
    std::vector<PendingLookup> lookups;
    uint64_t failures = 0;
    /// Why the last attempt or session failed; cleared when a session comes up.
    std::string last_error;
    int64_t last_failure_ms = 0;  ///< when it failed (monotonic), for how fresh the reason is
    /// The last attempt was refused by the peer (a version mismatch, no transport in common):
    /// hearing from it again does not pull the retry forward, only a restart of it does.
    bool last_refused = false;
    std::string last_logged_error;
    /// A peer of the cluster directory (docs/directory.md), not of [[peers]].
    bool dynamic = false;
    /// False once the directory removed it: its name is unknown (byName), its id stays
    /// (handles and writes that name it fail) until the directory lists the name again.
    bool listed = true;
    /// Its boot epoch as the directory says (0: static, or not said).
    uint64_t epoch = 0;
};

/// The peers, by id (1..n: [[peers]] in order, then the directory's in the order they joined)
/// and by name. A deque, so that adding a peer while a handler holds a Peer& keeps it valid.
class PeerTable {
public:
    /// Appends `p`; its id must be size() + 1.
    void add(Peer p) { peers_.push_back(std::move(p)); }
    Peer *byId(PeerId id) { return id >= 1 && id <= peers_.size() ? &peers_[id - 1] : nullptr; }
    const Peer *byId(PeerId id) const {
        return id >= 1 && id <= peers_.size() ? &peers_[id - 1] : nullptr;
    }
    /// The listed peer of this name (a removed one is nobody's).
    Peer *byName(std::string_view name) {
        Peer *p = byNameAny(name);
        return p != nullptr && p->listed ? p : nullptr;
    }
    const Peer *byName(std::string_view name) const {
        return const_cast<PeerTable *>(this)->byName(name);
    }
    /// The entry of this name, listed or not.
    Peer *byNameAny(std::string_view name) {
        for (Peer &p : peers_) {
            if (p.name == name) {
                return &p;
            }
        }
        return nullptr;
    }
    size_t size() const { return peers_.size(); }
    bool empty() const { return peers_.empty(); }
    /// Destroys every entry and its sessions (their connections leave the poller).
    void clear() { peers_.clear(); }

    std::deque<Peer>::iterator begin() { return peers_.begin(); }
    std::deque<Peer>::iterator end() { return peers_.end(); }
    std::deque<Peer>::const_iterator begin() const { return peers_.begin(); }
    std::deque<Peer>::const_iterator end() const { return peers_.end(); }

private:
    std::deque<Peer> peers_;
};

/// What a transport's openSession is told about a session with `p`.
SessionInfo sessionInfo(const Peer &p, uint64_t session_id, uint64_t incarnation, bool integrity);

/// How often an idle control connection carries a heartbeat to a peer with `remote`'s caps.
int64_t heartbeatInterval(const config::Config &cfg, const PeerCaps &remote);

/// Turns on the frame tags of an authenticated connection (when both ends asked for them).
void enableFrameTags(Connection &c, const HandshakeOutcome &o, bool client);

}  // namespace tensorlane::sidecar
