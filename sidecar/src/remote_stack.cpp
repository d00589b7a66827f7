// Puts the remote side together: the peer layer (peer/) and the transport that carries writes
// (transport/tcp). Neither folder includes the other; this file knows both.
#include <sodium.h>

#include "peer/manager.hpp"
#include "transport/tcp/tcp_transport.hpp"

namespace tensorlane::sidecar {

std::unique_ptr<PeerManager> makePeerManager(const config::Config &cfg, RegionTable &regions,
                                             Status *error) {
    auto fail = [&](Status s) -> std::unique_ptr<PeerManager> {
        if (error != nullptr) {
            *error = std::move(s);
        }
        return nullptr;
    };
    Status s = checkPeerConfig(cfg);
    if (!s.isOk()) {
        return fail(std::move(s));
    }
    PeerKey key;
    // A node without peers needs no key: it neither listens nor connects.
    if (!cfg.peers.empty()) {
        s = PeerKey::fromFile(cfg.security.peer_key_file, &key);
        if (!s.isOk()) {
            return fail(std::move(s));
        }
    }
    if (sodium_init() < 0) {
        return fail({Code::kInternal, "libsodium failed to initialise"});
    }
    // The manager keeps its own copy of the config; the transport refers to it.
    auto tcp = std::make_unique<TcpTransport>(cfg, regions);
    if (int rc = tcp->init(); rc != 0) {
        return fail({Code::kInternal, std::string("epoll_create1: ") + std::strerror(rc)});
    }
    auto pm = std::make_unique<PeerManagerImpl>(cfg, regions, key, std::move(tcp));
    s = pm->init();
    if (!s.isOk()) {
        return fail(std::move(s));
    }
    return pm;
}

}  // namespace tensorlane::sidecar
