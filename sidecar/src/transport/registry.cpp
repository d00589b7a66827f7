// The remote transports this sidecar can run, by name: the one place that knows them all.
// Adding a transport: implement tensorlane/sidecar/transport.hpp (transport/tcp is the worked
// example), give it a wire id there, add its name to config::isTransportName, and a line here.
#include <algorithm>
#include <cstring>

#include "logging.hpp"
#include "tensorlane/sidecar/fabric.hpp"
#include "transport/set.hpp"
#include "transport/tcp/tcp_transport.hpp"
#include "transport/verbs/verbs_transport.hpp"

namespace tensorlane::sidecar {
namespace {

Status makeTcp(const config::Config &cfg, RegionTable &regions, std::unique_ptr<Transport> *out) {
    auto tcp = std::make_unique<TcpTransport>(cfg, regions);
    if (int rc = tcp->init(); rc != 0) {
        return {Code::kInternal, std::string("tcp transport: epoll_create1: ") + std::strerror(rc)};
    }
    *out = std::move(tcp);
    return Status::ok();
}

Status makeVerbs(const config::Config &cfg, RegionTable &regions, std::unique_ptr<Transport> *out) {
    // A RoCE port usable now (the file's device, or the first ACTIVE one for "auto").
    const config::TransportChoice choice = config::resolveTransport(cfg);
    if (choice.kind != config::TransportKind::kVerbs) {
        return {Code::kNotFound, choice.reason};
    }
    FabricSelection sel;
    if (Status s = selectFabric(cfg, SysfsRoot::fromEnvironment(), &sel); !s.isOk()) {
        return s;
    }
    auto verbs = std::make_unique<VerbsTransport>(cfg, regions, sel);
    if (Status s = verbs->init(); !s.isOk()) {
        return s;
    }
    *out = std::move(verbs);
    return Status::ok();
}

struct Entry {
    const char *name;
    Status (*make)(const config::Config &, RegionTable &, std::unique_ptr<Transport> *);
};

constexpr Entry kRegistry[] = {
    {"tcp", makeTcp},
    {"verbs", makeVerbs},
};

}  // namespace

Status addRemoteTransports(const config::Config &cfg, RegionTable &regions, TransportSet *set) {
    if (!cfg.hasPeers()) {
        return Status::ok();  // nothing to reach: no transport opens a device or a socket
    }
    const std::vector<std::string> wanted = config::transportPreference(cfg.fabric);
    std::string skipped;
    for (const std::string &name : wanted) {
        const Entry *e = std::find_if(std::begin(kRegistry), std::end(kRegistry),
                                      [&](const Entry &x) { return name == x.name; });
        if (e == std::end(kRegistry)) {
            return {Code::kInvalid, "[fabric] transports: no transport named '" + name + "'"};
        }
        std::unique_ptr<Transport> t;
        Status s = e->make(cfg, regions, &t);
        if (s.isOk() && !t->caps().remote) {
            s = {Code::kInvalid, "it carries writes only within this node"};
        }
        if (!s.isOk()) {
            sidecarLogger(name)->warn("no {} transport: {}", name, s.message());
            skipped += (skipped.empty() ? "" : "; ") + name + ": " + s.message();
            continue;
        }
        set->add(std::move(t));
    }
    if (set->remote().empty()) {
        const std::string key = cfg.fabric.transports.empty()
                                    ? "[fabric] transport = \"" +
                                          std::string(config::toString(cfg.fabric.transport)) + "\""
                                    : std::string("[fabric] transports");
        return {Code::kNotFound, key + ": no transport to peers can start here (" + skipped + ")"};
    }
    return Status::ok();
}

}  // namespace tensorlane::sidecar
