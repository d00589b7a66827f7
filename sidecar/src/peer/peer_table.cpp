#include "peer/peer_table.hpp"

#include <algorithm>

namespace tensorlane::sidecar {

SessionInfo sessionInfo(const Peer &p, uint64_t session_id, uint64_t incarnation, bool integrity) {
    SessionInfo info;
    info.peer_name = p.name;
    info.session_id = session_id;
    info.incarnation = incarnation;
    info.integrity = integrity;
    return info;
}

int64_t heartbeatInterval(const config::Config &cfg, const PeerCaps &remote) {
    // Idle connections carry a heartbeat every keepalive_ms, and always often enough that the
    // other end hears several within its own peer_timeout_ms.
    int64_t hb = std::min<int64_t>(cfg.tcp.keepalive_ms, remote.peer_timeout_ms / 4);
    return std::max<int64_t>(hb, 10);
}

void enableFrameTags(Connection &c, const HandshakeOutcome &o, bool client) {
    if (o.integrity) {
        c.enableAuth(client ? o.c2s_key : o.s2c_key, client ? o.s2c_key : o.c2s_key);
    }
}

}  // namespace tensorlane::sidecar
