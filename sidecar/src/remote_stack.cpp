// Puts the remote side together: the peer layer (peer/) and the transport that carries writes
// (transport/tcp). Neither folder includes the other; this file knows both.
#include <sodium.h>

#include <algorithm>

#include "logging.hpp"
#include "peer/manager.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "transport/tcp/tcp_transport.hpp"
#include "transport/verbs/verbs_transport.hpp"

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
    // A node without peers needs no key: it neither listens nor connects; nor does one whose
    // peers all have a key_file of their own (the peer manager reads those).
    const bool shared_key_used = std::any_of(cfg.peers.begin(), cfg.peers.end(),
                                             [](const auto &p) { return p.key_file.empty(); });
    if (shared_key_used) {
        s = PeerKey::fromFile(cfg.security.peer_key_file, &key);
        if (!s.isOk()) {
            return fail(std::move(s));
        }
    }
    if (sodium_init() < 0) {
        return fail({Code::kInternal, "libsodium failed to initialise"});
    }
    std::vector<std::unique_ptr<RemoteTransport>> transports;
    auto tcp = std::make_unique<TcpTransport>(cfg, regions);
    if (int rc = tcp->init(); rc != 0) {
        return fail({Code::kInternal, std::string("epoll_create1: ") + std::strerror(rc)});
    }
    transports.push_back(std::move(tcp));
    // verbs where the file allows it and this host has a usable RoCE port; tcp stays for peers
    // that have none (auto) — with transport = "verbs" such peers are refused (peer layer).
    if (cfg.fabric.transport != config::TransportKind::kTcp) {
        const config::TransportChoice choice = config::resolveTransport(cfg);
        FabricSelection sel;
        Status fs = choice.kind == config::TransportKind::kVerbs
                        ? selectFabric(cfg, SysfsRoot::fromEnvironment(), &sel)
                        : Status{Code::kNotFound, choice.reason};
        std::unique_ptr<VerbsTransport> verbs;
        if (fs.isOk()) {
            verbs = std::make_unique<VerbsTransport>(cfg, regions, sel);
            fs = verbs->init();
        }
        if (fs.isOk()) {
            transports.push_back(std::move(verbs));
        } else if (cfg.fabric.transport == config::TransportKind::kVerbs) {
            return fail({fs.code(), "[fabric] transport = \"verbs\": " + fs.message()});
        } else {
            sidecarLogger("verbs")->warn("no verbs transport ({}): peers use tcp", fs.message());
        }
    }
    auto pm = std::make_unique<PeerManagerImpl>(cfg, regions, key, std::move(transports));
    s = pm->init();
    if (!s.isOk()) {
        return fail(std::move(s));
    }
    return pm;
}

}  // namespace tensorlane::sidecar
