// The status documents (`tensorlane status --json`, tl_sidecar_status) written from the typed
// reports, once: the keys and their order are the ones the document has always had.
#include <nlohmann/json.hpp>

#include "tensorlane/sidecar/engine.hpp"
#include "tensorlane/sidecar/peers.hpp"
#include "tensorlane/sidecar/report.hpp"

namespace tensorlane::sidecar {

namespace {

using nlohmann::json;

json toJson(const PeerReport &p) {
    json j = p.transport.detail && p.transport.detail->is_object() ? *p.transport.detail
                                                                   : json::object();
    j["transport"] = p.transport.transport;
    j["name"] = p.name;
    j["address"] = p.address;
    j["state"] = p.state;
    j["control_connections"] = p.control_connections;
    j["failures"] = p.failures;
    j["last_error"] = p.last_error;
    j["remote_regions"] = p.remote_regions;
    j["remote_regions_ignored"] = p.remote_regions_ignored;
    j["incarnation"] = p.incarnation;
    j["inbound"] = p.inbound;
    j["hosts"] = p.hosts;
    return j;
}

json toJson(const std::vector<PeerReport> &peers) {
    json a = json::array();
    for (const PeerReport &p : peers) {
        a.push_back(toJson(p));
    }
    return a;
}

json toJson(const ListenerReport &l) {
    return {{"node", l.node},
            {"address", l.address},
            {"incarnation", l.incarnation},
            {"pending_handshakes", l.pending_handshakes},
            {"rejected", l.rejected},
            {"last_rejection", l.last_rejection},
            {"pending_unlisted", l.pending_unlisted},
            {"unlisted_dropped", l.unlisted_dropped},
            {"claims_refused", l.claims_refused},
            {"handles", l.handles},
            {"handle_tombstones", l.handle_tombstones}};
}

json toJson(const ClientReport &c) {
    return {{"session", c.session},
            {"pid", c.pid},
            {"uid", c.uid},
            {"regions", c.regions},
            {"requests", c.requests},
            {"completions", c.completions},
            {"notifications", c.notifications},
            {"notifications_dropped", c.notifications_dropped},
            {"rejected", c.rejected},
            {"bytes_written", c.bytes_written},
            {"host_bytes", c.host_bytes},
            {"in_flight", c.in_flight}};
}

json toJson(const CudaReport &c) {
    json j = {{"available", c.available},
              {"devices", c.devices},
              {"imports_open", c.imports_open},
              {"imports_opened", c.imports_opened}};
    if (!c.available) {
        j["why"] = c.why;
    }
    return j;
}

json toJson(const LimitsReport &l) {
    return {{"regions", l.regions},
            {"registered_bytes", l.registered_bytes},
            {"node_registered_bytes", l.node_registered_bytes},
            {"node_registered_bytes_source", l.node_registered_bytes_source},
            {"node_host_bytes", l.node_host_bytes},
            {"notification_backlog", l.notification_backlog},
            {"sessions_per_uid", l.sessions_per_uid},
            {"sessions_per_pid", l.sessions_per_pid},
            {"fd_reserve", l.fd_reserve},
            {"in_flight", l.in_flight},
            {"mappings", l.mappings},
            {"max_mappings", l.max_mappings}};
}

json toJson(const EngineCountersReport &c) {
    return {{"sessions_accepted", c.sessions_accepted},
            {"sessions_refused", c.sessions_refused},
            {"writes_local", c.writes_local},
            {"writes_local_inline", c.writes_local_inline},
            {"writes_local_gpu_inline", c.writes_local_gpu_inline},
            {"writes_remote", c.writes_remote},
            {"requests_rejected", c.requests_rejected},
            {"notifications", c.notifications},
            {"notifications_dropped", c.notifications_dropped},
            {"probes_received", c.probes_received},
            {"probes_sent", c.probes_sent},
            {"quota_refusals", c.quota_refusals},
            {"session_cap_refusals", c.session_cap_refusals},
            {"accept_pauses", c.accept_pauses},
            {"late_wakeups", c.late_wakeups},
            {"writes_queued", c.writes_queued},
            {"writes_in_flight", c.writes_in_flight}};
}

}  // namespace

std::string toJsonText(const EngineReport &r, int indent) {
    json j;
    j["node"] = r.node;
    j["socket"] = r.socket;
    j["poll_mode"] = r.poll_mode;
    j["poll_mode_reason"] = r.poll_mode_reason;
    j["link_mbps"] = r.link_mbps;
    j["nic_pci_path"] = r.nic_pci_path;
    j["uptime_s"] = r.uptime_s;
    json clients = json::array();
    for (const ClientReport &c : r.clients) {
        clients.push_back(toJson(c));
    }
    j["clients"] = std::move(clients);
    j["clients_shown"] = r.clients_shown;
    j["regions"] = r.regions;
    j["cuda"] = toJson(r.cuda);
    j["registered_bytes"] = r.registered_bytes;
    j["limits"] = toJson(r.limits);
    j["counters"] = toJson(r.counters);
    j["peers"] = toJson(r.peers);
    const DirectoryReport &d = r.directory;
    j["directory"] = {{"kind", d.kind}};
    if (d.kind != "static") {
        j["directory"].update({{"state", d.state},
                               {"endpoint", d.endpoint},
                               {"cluster", d.cluster},
                               {"key", d.key},
                               {"registered", d.registered},
                               {"lease_ttl_s", d.lease_ttl_s},
                               {"revision", d.revision},
                               {"nodes", d.nodes},
                               {"joined", d.joined},
                               {"left", d.left},
                               {"restarts", d.restarts},
                               {"refused", d.refused},
                               {"reconnects", d.reconnects},
                               {"events", d.events},
                               {"down_for_s", d.down_for_s},
                               {"last_error", d.last_error},
                               {"last_refusal", d.last_refusal}});
    }
    return j.dump(indent, ' ', false, json::error_handler_t::replace);
}

std::string toJsonText(const PeersReport &r) {
    json j;
    j["peers"] = toJson(r.peers);
    j["listener"] = toJson(r.listener);
    return j.dump();
}

std::string PeerManager::statusJson() const {
    return toJsonText(report());
}

}  // namespace tensorlane::sidecar
