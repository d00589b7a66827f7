// describeText / describeJson: the resolved configuration, derived values included, as printed
// by `tensorlane-sidecar --check-config`.
#include <nlohmann/json.hpp>
#include <sstream>

#include "internal.hpp"
#include "tensorlane/config/config.hpp"

namespace tensorlane::config {
namespace {

using detail::quote;

// Paths and names can be long; in a dump for people they are shown whole.
constexpr size_t kNoCut = static_cast<size_t>(-1);

std::string idList(const std::vector<uint32_t> &ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i == 0 ? "" : ", ") + std::to_string(ids[i]);
    }
    return out + "]";
}

const char *boolText(bool b) {
    return b ? "true" : "false";
}

std::string transportText(const Config &cfg, const TransportChoice &choice) {
    std::string out = toString(choice.kind);
    if (cfg.fabric.transport == TransportKind::kAuto) {
        out += " (auto: " + choice.reason + ")";
    } else {
        out += " (" + choice.reason + ")";
    }
    return out;
}

}  // namespace

std::string describeText(const Config &cfg, const TransportChoice &choice) {
    const FabricConfig &f = cfg.fabric;
    std::ostringstream os;
    os << "# tensorlane configuration from " << cfg.source << "\n";

    os << "\n[node]\n"
       << "name = " << quote(cfg.node.name, kNoCut) << "\n"
       << "listen = " << quote(cfg.node.listen.text(), kNoCut) << "\n"
       << "socket = " << quote(cfg.node.socket, kNoCut) << "\n"
       << "connect_eagerly = " << boolText(cfg.node.connect_eagerly) << "\n";

    os << "\n[fabric]\n"
       << "transport = " << transportText(cfg, choice) << "\n"
       << "device = " << quote(f.device, kNoCut) << "\n"
       << "port = " << unsigned{f.port} << "\n"
       << "netdev = " << quote(f.netdev, kNoCut) << "\n";
    if (f.gid_index) {
        os << "gid_index = " << unsigned{*f.gid_index} << "\n";
    } else {
        // The GID is chosen by family and subnet when the verbs transport opens the device.
        os << "gid_index = auto (picked by the verbs transport from the port's GID table)\n";
    }
    os << "dscp = " << unsigned{f.dscp} << "\n"
       << "ecn = " << boolText(f.ecn) << "\n"
       << "traffic_class = " << unsigned{cfg.trafficClass()} << " (dscp " << unsigned{f.dscp}
       << " << 2 | ecn " << (f.ecn ? 2 : 0) << ")\n"
       << "pfc_priority = " << unsigned{f.pfc_priority} << "\n"
       << "trust = " << toString(f.trust) << "\n"
       << "mtu = " << f.mtu << " (clamped to the port's active MTU)\n"
       << "timeout = " << unsigned{f.timeout} << "\n";
    if (f.timeout == 0) {
        os << "rc_timeout = infinite (timeout 0)\n";
    } else {
        os << "rc_timeout = " << detail::formatRcTimeout(f.timeout) << " (4.096 us * 2^"
           << unsigned{f.timeout} << ")\n";
    }
    os << "retry_cnt = " << unsigned{f.retry_cnt} << "\n"
       << "rnr_retry = " << unsigned{f.rnr_retry} << (f.rnr_retry == 7 ? " (infinite)" : "") << "\n"
       << "min_rnr_timer = " << unsigned{f.min_rnr_timer} << "\n"
       << "qps_per_peer = " << f.qps_per_peer << "\n"
       << "tclass_override = " << toString(f.tclass_override) << "\n"
       << "preflight = " << toString(f.preflight) << "\n"
       << "gdr_flush = " << toString(f.gdr_flush) << "\n";

    const TcpConfig &t = cfg.tcp;
    os << "\n[tcp]\n"
       << "connections_per_peer = " << t.connections_per_peer << "\n"
       << "chunk_bytes = " << t.chunk_bytes << "\n"
       << "keepalive_ms = " << t.keepalive_ms << "\n"
       << "peer_timeout_ms = " << t.peer_timeout_ms << "\n"
       << "connect_timeout_ms = " << t.connect_timeout_ms << "\n"
       << "reconnect_min_ms = " << t.reconnect_min_ms << "\n"
       << "reconnect_max_ms = " << t.reconnect_max_ms << "\n"
       << "window = " << t.window << " (writes in flight per peer)\n";
    if (t.tag_threads) {
        os << "tag_threads = " << *t.tag_threads << "\n";
    } else {
        os << "tag_threads = auto (none below 4 CPUs, else one per 4 CPUs, at most 4)\n";
    }

    os << "\n[ipc]\n"
       << "ring_depth = " << cfg.ipc.ring_depth << "\n"
       << "poll_mode = " << toString(cfg.ipc.poll_mode)
       << (cfg.ipc.poll_mode == PollMode::kAuto
               ? " (adaptive from " + std::to_string(kAdaptiveMinCpus) +
                     " usable CPUs, else event; the sidecar logs its choice)"
               : std::string())
       << "\n"
       << "spin_us = " << cfg.ipc.spin_us << "\n";

    const SecurityConfig &s = cfg.security;
    os << "\n[security]\n"
       << "allowed_uids = " << idList(s.allowed_uids)
       << (s.allowed_uids.empty() ? " (root and the sidecar's own uid)" : "") << "\n"
       << "allowed_gids = " << idList(s.allowed_gids) << "\n"
       << "peer_key_file = " << quote(s.peer_key_file, kNoCut) << "\n"
       << "tcp_integrity = " << toString(s.tcp_integrity)
       << (s.tcp_integrity == TcpIntegrity::kNone ? " (TCP data frames are not authenticated)" : "")
       << "\n"
       << "revoke_timeout_ms = " << s.revoke_timeout_ms
       << " (a verbs peer's key is revoked by then, confirmed or not)\n"
       << "allow_unlisted_peers = " << (s.allow_unlisted_peers ? "true" : "false")
       << (s.allow_unlisted_peers ? "" : " (connections from other addresses are closed at accept)")
       << "\n"
       << "verify_peer_address = " << (s.verify_peer_address ? "true" : "false")
       << (s.verify_peer_address ? "" : " (a peer's name is accepted from any address)") << "\n";
    os << "reserved_names = [";
    for (size_t i = 0; i < s.reserved_names.size(); ++i) {
        const ReservedName &e = s.reserved_names[i];
        os << (i == 0 ? "" : ", ") << "{ prefix = " << quote(e.prefix, kNoCut)
           << ", uids = " << idList(e.uids) << ", gids = " << idList(e.gids) << " }";
    }
    os << "]" << (s.reserved_names.empty() ? " (any local client may expose any name)" : "")
       << "\n";

    const LimitsConfig &l = cfg.limits;
    os << "\n[limits]\n"
       << "regions = " << l.regions << "\n"
       << "registered_bytes = " << quote(formatBytes(l.registered_bytes), kNoCut) << " ("
       << l.registered_bytes << " bytes)\n"
       << "in_flight = " << l.in_flight << "\n"
       << "peer_regions = " << l.peer_regions << "\n"
       << "notification_backlog = " << l.notification_backlog << "\n"
       << "sessions_per_uid = " << l.sessions_per_uid << "\n"
       << "sessions_per_pid = " << l.sessions_per_pid << "\n"
       << "fd_reserve = " << l.fd_reserve << "\n"
       << "node_registered_bytes = "
       << (l.node_registered_bytes == 0
               ? std::string("\"auto\" (") +
                     std::to_string(LimitsConfig::kAutoNodeRegisteredPercent) +
                     "% of the memory the sidecar may use)"
               : quote(formatBytes(l.node_registered_bytes), kNoCut) + " (" +
                     std::to_string(l.node_registered_bytes) + " bytes)")
       << "\n";

    os << "\n[metrics]\n"
       << "listen = "
       << (cfg.metrics.listen ? quote(cfg.metrics.listen->text(), kNoCut)
                              : std::string("\"\" (off)"))
       << "\n";

    const DirectoryConfig &d = cfg.directory;
    os << "\n[directory]\n"
       << "kind = " << toString(d.kind)
       << (d.kind == DirectoryKind::kStatic ? " (peers are the [[peers]] entries)" : "") << "\n";
    if (d.kind == DirectoryKind::kEtcd) {
        os << "endpoints = [";
        for (size_t i = 0; i < d.endpoints.size(); ++i) {
            os << (i == 0 ? "" : ", ") << quote(d.endpoints[i], kNoCut);
        }
        os << "]\n"
           << "cluster = " << quote(d.cluster, kNoCut) << " (keys under "
           << quote(d.prefix(), kNoCut) << ", this node at "
           << quote(d.prefix() + "nodes/" + cfg.node.name, kNoCut) << ")\n"
           << "lease_ttl_ms = " << d.lease_ttl_ms << " (etcd TTL " << (d.lease_ttl_ms + 999) / 1000
           << " s)\n"
           << "advertise = " << quote(cfg.advertisedAddress().text(), kNoCut)
           << (d.advertise ? "" : " ([node] listen)") << "\n"
           << "request_timeout_ms = " << d.request_timeout_ms << "\n"
           << "reconnect_min_ms = " << d.reconnect_min_ms << "\n"
           << "reconnect_max_ms = " << d.reconnect_max_ms << "\n"
           << "ca_file = "
           << (d.ca_file.empty() ? std::string("(the system's CAs)") : quote(d.ca_file, kNoCut))
           << "\n"
           << "cert_file = "
           << (d.cert_file.empty() ? std::string("(none)") : quote(d.cert_file, kNoCut)) << "\n"
           << "key_file = "
           << (d.key_file.empty() ? std::string("(none)") : quote(d.key_file, kNoCut)) << "\n"
           << "username = "
           << (d.username.empty() ? std::string("(no etcd auth)") : quote(d.username, kNoCut))
           << "\n"
           << "password_file = "
           << (d.password_file.empty() ? std::string("(none)") : quote(d.password_file, kNoCut))
           << "\n";
    }

    if (cfg.peers.empty()) {
        os << (d.kind == DirectoryKind::kEtcd ? "\n# peers: learned from etcd\n"
                                              : "\n# peers: none\n");
    }
    for (const auto &peer : cfg.peers) {
        os << "\n[[peers]]\n"
           << "name = " << quote(peer.name, kNoCut) << "\n"
           << "address = " << quote(peer.address.text(), kNoCut) << "\n"
           << "key_file = "
           << (peer.key_file.empty() ? std::string("(the [security] peer_key_file)")
                                     : quote(peer.key_file, kNoCut))
           << "\n";
    }
    std::string text = os.str();
    text.pop_back();  // no final newline, as for describeJson: the caller ends the line
    return text;
}

std::string describeJson(const Config &cfg, const TransportChoice &choice) {
    // ordered_json keeps the file's table and key order, which is easier to read than sorted.
    using Json = nlohmann::ordered_json;
    const FabricConfig &f = cfg.fabric;
    const TcpConfig &t = cfg.tcp;
    const SecurityConfig &s = cfg.security;

    Json j;
    j["source"] = cfg.source;
    j["node"] = {{"name", cfg.node.name},
                 {"listen", cfg.node.listen.text()},
                 {"socket", cfg.node.socket},
                 {"connect_eagerly", cfg.node.connect_eagerly}};
    j["fabric"] = {{"transport", toString(f.transport)},
                   {"transports", transportPreference(f)},
                   {"device", f.device},
                   {"port", f.port},
                   {"netdev", f.netdev},
                   {"gid_index", f.gid_index ? Json(*f.gid_index) : Json("auto")},
                   {"dscp", f.dscp},
                   {"ecn", f.ecn},
                   {"pfc_priority", f.pfc_priority},
                   {"trust", toString(f.trust)},
                   {"mtu", f.mtu},
                   {"timeout", f.timeout},
                   {"retry_cnt", f.retry_cnt},
                   {"rnr_retry", f.rnr_retry},
                   {"min_rnr_timer", f.min_rnr_timer},
                   {"qps_per_peer", f.qps_per_peer},
                   {"tclass_override", toString(f.tclass_override)},
                   {"preflight", toString(f.preflight)},
                   {"gdr_flush", toString(f.gdr_flush)}};
    j["tcp"] = {{"connections_per_peer", t.connections_per_peer},
                {"chunk_bytes", t.chunk_bytes},
                {"keepalive_ms", t.keepalive_ms},
                {"peer_timeout_ms", t.peer_timeout_ms},
                {"connect_timeout_ms", t.connect_timeout_ms},
                {"reconnect_min_ms", t.reconnect_min_ms},
                {"reconnect_max_ms", t.reconnect_max_ms},
                {"window", t.window},
                {"tag_threads", t.tag_threads ? Json(*t.tag_threads) : Json("auto")}};
    j["ipc"] = {{"ring_depth", cfg.ipc.ring_depth},
                {"poll_mode", toString(cfg.ipc.poll_mode)},
                {"spin_us", cfg.ipc.spin_us}};
    j["security"] = {{"allowed_uids", s.allowed_uids},
                     {"allowed_gids", s.allowed_gids},
                     {"peer_key_file", s.peer_key_file},
                     {"tcp_integrity", toString(s.tcp_integrity)},
                     {"revoke_timeout_ms", s.revoke_timeout_ms},
                     {"allow_unlisted_peers", s.allow_unlisted_peers},
                     {"verify_peer_address", s.verify_peer_address}};
    Json reserved = Json::array();
    for (const ReservedName &e : s.reserved_names) {
        reserved.push_back({{"prefix", e.prefix}, {"uids", e.uids}, {"gids", e.gids}});
    }
    j["security"]["reserved_names"] = std::move(reserved);
    j["limits"] = {{"regions", cfg.limits.regions},
                   {"registered_bytes", cfg.limits.registered_bytes},
                   {"in_flight", cfg.limits.in_flight},
                   {"peer_regions", cfg.limits.peer_regions},
                   {"notification_backlog", cfg.limits.notification_backlog},
                   {"sessions_per_uid", cfg.limits.sessions_per_uid},
                   {"sessions_per_pid", cfg.limits.sessions_per_pid},
                   {"fd_reserve", cfg.limits.fd_reserve},
                   {"node_registered_bytes", cfg.limits.node_registered_bytes == 0
                                                 ? Json("auto")
                                                 : Json(cfg.limits.node_registered_bytes)}};
    j["metrics"] = {{"listen", cfg.metrics.listen ? cfg.metrics.listen->text() : std::string()}};
    Json peers = Json::array();
    for (const auto &peer : cfg.peers) {
        peers.push_back({{"name", peer.name},
                         {"address", peer.address.text()},
                         {"key_file", peer.key_file.empty() ? s.peer_key_file : peer.key_file}});
    }
    j["peers"] = std::move(peers);
    const DirectoryConfig &d = cfg.directory;
    j["directory"] = {{"kind", toString(d.kind)}};
    if (d.kind == DirectoryKind::kEtcd) {
        j["directory"].update({{"endpoints", d.endpoints},
                               {"cluster", d.cluster},
                               {"prefix", d.prefix()},
                               {"lease_ttl_ms", d.lease_ttl_ms},
                               {"advertise", cfg.advertisedAddress().text()},
                               {"request_timeout_ms", d.request_timeout_ms},
                               {"reconnect_min_ms", d.reconnect_min_ms},
                               {"reconnect_max_ms", d.reconnect_max_ms},
                               {"ca_file", d.ca_file},
                               {"cert_file", d.cert_file},
                               {"key_file", d.key_file},
                               {"username", d.username},
                               {"password_file", d.password_file}});
    }
    // rc_timeout_s is 0 for timeout 0, as rcTimeoutSeconds() returns; the flag says what it means.
    j["derived"] = {{"traffic_class", cfg.trafficClass()},
                    {"rc_timeout_s", cfg.rcTimeoutSeconds()},
                    {"rc_timeout_infinite", f.timeout == 0},
                    {"transport", toString(choice.kind)},
                    {"transport_reason", choice.reason}};
    // replace, not throw: a Config built in code may hold any bytes.
    return j.dump(2, ' ', false, Json::error_handler_t::replace);
}

}  // namespace tensorlane::config
