#include "cluster_directory.hpp"

#include <chrono>
#include <fstream>
#include <set>

#include "key_file_status.hpp"
#include "logging.hpp"

namespace tensorlane::sidecar {

namespace {

spdlog::logger &directoryLog() {
    static const std::shared_ptr<spdlog::logger> logger = sidecarLogger("cluster");
    return *logger;
}

/// [directory] password_file: its first line (the file is the operator's, like the key file).
Status readPassword(const std::string &path, std::string *out) {
    std::ifstream in(path);
    if (!in) {
        return {Code::kPermission, "[directory] password_file " + path + ": cannot be read"};
    }
    std::getline(in, *out);
    if (!out->empty() && out->back() == '\r') {
        out->pop_back();
    }
    return Status::ok();
}

std::string transportInfo(const config::Config &cfg, const std::string &name) {
    if (name == "tcp") {
        return "{\"connections_per_peer\":" + std::to_string(cfg.tcp.connections_per_peer) +
               ",\"chunk_bytes\":" + std::to_string(cfg.tcp.chunk_bytes) + "}";
    }
    if (name == "verbs") {
        return "{\"device\":\"" + cfg.fabric.device +
               "\",\"port\":" + std::to_string(cfg.fabric.port) +
               ",\"mtu\":" + std::to_string(cfg.fabric.mtu) +
               ",\"traffic_class\":" + std::to_string(cfg.trafficClass()) + "}";
    }
    return "{}";
}

}  // namespace

ClusterDirectory::ClusterDirectory(const config::Config &cfg, PeerManager &peers,
                                   std::string fingerprint)
    : cfg_(cfg), peers_(peers), fingerprint_(std::move(fingerprint)) {
    counts_.kind = "etcd";
    counts_.cluster = cfg.directory.cluster;
}

ClusterDirectory::~ClusterDirectory() {
    if (membership_) {
        membership_->stop(false);
    }
}

std::unique_ptr<ClusterDirectory> ClusterDirectory::start(
    const config::Config &cfg, PeerManager &peers, const std::vector<std::string> &transports,
    Status *error) {
    config::KeyBytes key;
    if (Status s = readPeerKeyFile(cfg.security.peer_key_file, &key); !s.isOk()) {
        *error = std::move(s);
        return nullptr;
    }
    std::string password;
    if (!cfg.directory.password_file.empty()) {
        if (Status s = readPassword(cfg.directory.password_file, &password); !s.isOk()) {
            *error = std::move(s);
            return nullptr;
        }
    }
    std::unique_ptr<ClusterDirectory> d(new ClusterDirectory(cfg, peers, keyFingerprint(key)));
    NodeRecord self;
    self.name = cfg.node.name;
    self.address = cfg.advertisedAddress();
    self.key_fingerprint = d->fingerprint_;
    self.epoch = peers.incarnation();
    for (const std::string &t : transports) {
        self.transports.push_back({t, transportInfo(cfg, t)});
    }
    d->membership_ = Membership::start(cfg.directory, std::move(self), std::move(password), error);
    if (!d->membership_) {
        return nullptr;
    }
    d->counts_.key = d->membership_->keyOf(cfg.node.name);
    // Until the first listing, a name nobody told us of may yet come.
    peers.setUnknownPeerAnswer(Code::kPeer,
                               "is not known yet: the directory (etcd) has not "
                               "answered since the sidecar started");
    return d;
}

void ClusterDirectory::accept(const NodeRecord &r) {
    if (r.key_fingerprint != fingerprint_) {
        refuse(r.name, "is refused: it registered the key fingerprint " + r.key_fingerprint +
                           ", this node's key has " + fingerprint_ +
                           " (another [security] peer_key_file)");
        return;
    }
    const auto it = listed_.find(r.name);
    const bool known = it != listed_.end();
    if (known && it->second != r.epoch) {
        ++counts_.restarts;
    }
    PeerId id = 0;
    if (Status s = peers_.addPeer(DirectoryPeer{r.name, r.address, r.epoch}, &id); !s.isOk()) {
        refuse(r.name, "is refused: " + s.message());
        return;
    }
    if (!known) {
        ++counts_.joined;
    }
    listed_[r.name] = r.epoch;
}

void ClusterDirectory::remove(const std::string &name, const std::string &reason) {
    if (listed_.erase(name) != 0) {
        ++counts_.left;
    }
    peers_.removePeer(name, reason);
}

void ClusterDirectory::refuse(const std::string &name, const std::string &reason) {
    ++counts_.refused;
    counts_.last_refusal = "node '" + name + "' " + reason;
    directoryLog().warn("directory: node '{}' {}", name, reason);
    listed_.erase(name);
    peers_.removePeer(name, reason);
}

void ClusterDirectory::stateChanged(bool up, const std::string &reason) {
    if (up) {
        peers_.setUnknownPeerAnswer(Code::kNotFound,
                                    "is not registered in the directory (etcd, "
                                    "cluster '" +
                                        cfg_.directory.cluster + "')");
    } else {
        peers_.setUnknownPeerAnswer(Code::kPeer,
                                    "is unknown and the directory is down (etcd: " + reason +
                                        "); peers learned before go on working");
    }
}

size_t ClusterDirectory::apply() {
    std::vector<MembershipEvent> events = membership_->take();
    for (MembershipEvent &e : events) {
        switch (e.kind) {
            case MembershipEvent::Kind::kSnapshot: {
                std::set<std::string, std::less<>> present;
                for (const NodeRecord &r : e.nodes) {
                    present.insert(r.name);
                    accept(r);
                }
                for (const auto &[name, why] : e.rejected) {
                    present.insert(name);
                    refuse(name, "is refused: its directory record is invalid: " + why);
                }
                std::vector<std::string> gone;
                for (const auto &[name, epoch] : listed_) {
                    if (present.count(name) == 0) {
                        gone.push_back(name);
                    }
                }
                for (const std::string &name : gone) {
                    remove(name,
                           "left the cluster: its etcd key went while the directory was "
                           "out of reach");
                }
                break;
            }
            case MembershipEvent::Kind::kPut:
                if (!e.nodes.empty()) {
                    accept(e.nodes.front());
                }
                break;
            case MembershipEvent::Kind::kDelete:
                remove(e.name,
                       "left the cluster: its etcd key was deleted (a clean stop) or its "
                       "lease expired");
                break;
            case MembershipEvent::Kind::kRejected:
                refuse(e.name, "is refused: its directory record is invalid: " + e.reason);
                break;
            case MembershipEvent::Kind::kState:
                stateChanged(e.up, e.reason);
                break;
        }
    }
    return events.size();
}

DirectoryReport ClusterDirectory::report() const {
    DirectoryReport r = counts_;
    const MembershipReport m = membership_->report();
    r.state = m.state;
    r.endpoint = m.endpoint;
    r.registered = m.registered;
    r.lease_ttl_s = m.lease_ttl_s;
    r.revision = m.revision;
    r.nodes = listed_.size();
    r.reconnects = m.reconnects;
    r.events = m.events;
    r.last_error = m.last_error;
    if (m.down_since_ms != 0) {
        const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now().time_since_epoch())
                                .count();
        r.down_for_s = static_cast<double>(now - m.down_since_ms) / 1000.0;
    }
    return r;
}

}  // namespace tensorlane::sidecar
