#include "families.hpp"

#include <limits>
#include <map>
#include <string>
#include <unordered_map>

#include "tensorlane/ipc/status.hpp"

#ifndef TENSORLANE_VERSION_STRING
#define TENSORLANE_VERSION_STRING "unknown"
#endif

namespace tensorlane::sidecar {

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

/// Families by name in the order first seen; a family only exists once it has a sample.
class Families {
public:
    void gauge(const std::string &name, const char *help, Labels labels, double v) {
        ClientMetric m;
        m.label = std::move(labels);
        m.gauge.value = v;
        add(name, help, MetricType::Gauge, std::move(m));
    }
    void counter(const std::string &name, const char *help, Labels labels, double v) {
        ClientMetric m;
        m.label = std::move(labels);
        m.counter.value = v;
        add(name, help, MetricType::Counter, std::move(m));
    }
    void histogram(const std::string &name, const char *help, Labels labels,
                   ClientMetric::Histogram h) {
        ClientMetric m;
        m.label = std::move(labels);
        m.histogram = std::move(h);
        add(name, help, MetricType::Histogram, std::move(m));
    }
    std::vector<MetricFamily> take() { return std::move(families_); }

private:
    void add(const std::string &name, const char *help, MetricType type, ClientMetric m) {
        auto [it, fresh] = index_.try_emplace(name, families_.size());
        if (fresh) {
            families_.push_back(MetricFamily{name, help, type, {}});
        }
        families_[it->second].metric.push_back(std::move(m));
    }
    std::vector<MetricFamily> families_;
    std::unordered_map<std::string, size_t> index_;
};

constexpr const char *kPeerStates[] = {"down", "connecting", "up", "failed"};
constexpr const char *kQpStates[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};

double num(uint64_t v) {
    return static_cast<double>(v);
}

void engineFamilies(const Snapshot &snap, Families *f) {
    const EngineReport &status = snap.report;
    f->gauge("tensorlane_info", "The sidecar's node name, version and poll mode (always 1)",
             {{"node", status.node},
              {"poll_mode", status.poll_mode},
              {"version", TENSORLANE_VERSION_STRING}},
             1);
    f->gauge("tensorlane_uptime_seconds", "Seconds since the engine started", {}, status.uptime_s);
    double host_bytes = 0;
    double client_in_flight = 0;
    for (const ClientReport &c : status.clients) {
        host_bytes += num(c.host_bytes);
        client_in_flight += num(c.in_flight);
    }
    f->gauge("tensorlane_clients", "Worker processes connected to the sidecar", {},
             num(status.clients.size()));
    f->gauge("tensorlane_regions", "Regions registered by all clients (buffers and ranges)", {},
             num(status.regions));
    f->gauge("tensorlane_registered_bytes", "Bytes of all registered regions", {},
             num(status.registered_bytes));
    f->gauge("tensorlane_host_buffer_bytes",
             "Bytes of host buffers (tl_alloc_host) the clients hold, counted against [limits] "
             "registered_bytes",
             {}, host_bytes);
    f->gauge("tensorlane_client_requests_in_flight",
             "Requests accepted from the clients and not ended, all clients", {}, client_in_flight);
    f->gauge("tensorlane_mappings", "Shared-memory segments the sidecar maps", {},
             num(status.limits.mappings));
    f->gauge("tensorlane_mappings_limit",
             "Segments the sidecar allows itself (vm.max_map_count less headroom)", {},
             num(status.limits.max_mappings));

    const EngineCountersReport &c = status.counters;
    struct CounterDef {
        uint64_t EngineCountersReport::*field;
        const char *name;
        const char *help;
    };
    static constexpr CounterDef kCounters[] = {
        {&EngineCountersReport::sessions_accepted, "tensorlane_sessions_accepted_total",
         "Clients admitted"},
        {&EngineCountersReport::sessions_refused, "tensorlane_sessions_refused_total",
         "Clients refused ([security] allowed_uids/allowed_gids)"},
        {&EngineCountersReport::notifications, "tensorlane_notifications_total",
         "Notifications handed to the owners of local regions"},
        {&EngineCountersReport::notifications_dropped, "tensorlane_notifications_dropped_total",
         "Notifications not delivered: the region's owner was gone, or its backlog was full "
         "([limits] notification_backlog)"},
        {&EngineCountersReport::quota_refusals, "tensorlane_quota_refusals_total",
         "Calls refused by a [limits] quota (TL_ENOMEM)"},
        {&EngineCountersReport::accept_pauses, "tensorlane_accept_pauses_total",
         "Times accepting clients paused for lack of file descriptors"},
        {&EngineCountersReport::late_wakeups, "tensorlane_late_wakeups_total",
         "Engine sleeps that ended by the idle tick with work waiting (a lost wake-up; 0 "
         "expected)"},
    };
    for (const CounterDef &d : kCounters) {
        f->counter(d.name, d.help, {}, num(c.*d.field));
    }
    f->gauge("tensorlane_writes_queued", "Accepted writes waiting for their transport, all peers",
             {}, num(c.writes_queued));
    f->gauge("tensorlane_writes_in_flight", "Accepted writes not yet ended, all peers", {},
             num(c.writes_in_flight));
    for (size_t code = 1; code < kStatusCodes; ++code) {
        f->counter("tensorlane_requests_rejected_total",
                   "Requests refused on their face (never accepted), by status",
                   {{"status", ipc::codeName(static_cast<ipc::Code>(code))}},
                   static_cast<double>(snap.rejected[code]));
    }
}

void writeFamilies(const Snapshot &snap, Families *f) {
    for (const PeerSample &p : snap.peers) {
        const Labels peer{{"peer", p.name}};
        const WriteStats &s = p.stats;
        f->counter("tensorlane_peer_writes_total",
                   "Writes to the peer that ended (completed, failed or cancelled)", peer,
                   static_cast<double>(s.writes));
        f->counter("tensorlane_peer_write_bytes_total",
                   "Bytes of the writes to the peer that completed (in place at the target)", peer,
                   static_cast<double>(s.bytes));
        for (size_t code = 1; code < kStatusCodes; ++code) {
            f->counter("tensorlane_peer_write_errors_total",
                       "Writes to the peer that ended with an error, by status (tl_status name)",
                       {{"peer", p.name}, {"status", ipc::codeName(static_cast<ipc::Code>(code))}},
                       static_cast<double>(s.by_status[code]));
        }
        f->gauge("tensorlane_peer_writes_in_flight", "Writes to the peer accepted and not ended",
                 peer, static_cast<double>(p.in_flight));
        f->gauge("tensorlane_peer_writes_queued",
                 "Writes to the peer waiting for its transport (the peer's queue)", peer,
                 static_cast<double>(p.queued));
        f->counter("tensorlane_peer_received_writes_total",
                   "Writes from the peer that landed in a local region", peer,
                   static_cast<double>(s.received_writes));
        f->counter("tensorlane_peer_received_bytes_total",
                   "Bytes of the writes from the peer that landed in a local region", peer,
                   static_cast<double>(s.received_bytes));
        if (!snap.timing) {
            continue;
        }
        ClientMetric::Histogram h;
        uint64_t cumulative = 0;
        for (size_t i = 0; i < kLatencyBoundsNs.size(); ++i) {
            cumulative += s.latency_buckets[i];
            h.bucket.push_back({cumulative, static_cast<double>(kLatencyBoundsNs[i]) / 1e9});
        }
        cumulative += s.latency_buckets.back();
        h.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
        h.sample_count = cumulative;
        h.sample_sum = static_cast<double>(s.latency_sum_ns) / 1e9;
        f->histogram("tensorlane_peer_write_latency_seconds",
                     "Time from the sidecar taking a write off the client's ring to its "
                     "completion (data in place at the target), completed writes",
                     peer, std::move(h));
    }
}

/// Counts the QPs of one direction by state; every known state gets a sample (0 included).
void qpFamilies(const std::string &peer, const char *direction,
                const std::vector<QueuePairReport> &qps, Families *f) {
    std::map<std::string, double> by_state;
    for (const char *s : kQpStates) {
        by_state[s] = 0;
    }
    for (const QueuePairReport &q : qps) {
        by_state[q.state.empty() ? "?" : q.state] += 1;
    }
    for (const auto &[state, n] : by_state) {
        f->gauge("tensorlane_peer_qps",
                 "RC queue pairs of the verbs transport to/from the peer, by direction and state",
                 {{"peer", peer}, {"direction", direction}, {"state", state}}, n);
    }
}

/// The cluster directory ([directory] kind = "etcd"; nothing for a static one).
void directoryFamilies(const DirectoryReport &d, Families *f) {
    if (d.kind == "static") {
        return;
    }
    f->gauge("tensorlane_directory_up", "1 while the etcd directory's watch is established", {},
             d.state == "up" ? 1 : 0);
    f->gauge("tensorlane_directory_registered",
             "1 while this node's key is in etcd under a live lease", {}, d.registered ? 1 : 0);
    f->gauge("tensorlane_directory_nodes", "Peers learned from the directory now", {},
             static_cast<double>(d.nodes));
    f->gauge("tensorlane_directory_revision", "The last etcd revision the watch saw", {},
             static_cast<double>(d.revision));
    f->gauge("tensorlane_directory_down_seconds", "How long etcd has been unreachable (0 while up)",
             {}, d.down_for_s);
    f->counter("tensorlane_directory_joined_total", "Nodes that joined since start", {},
               static_cast<double>(d.joined));
    f->counter("tensorlane_directory_left_total",
               "Nodes whose key was deleted or whose lease expired", {},
               static_cast<double>(d.left));
    f->counter("tensorlane_directory_restarts_total", "Known nodes seen with a new epoch", {},
               static_cast<double>(d.restarts));
    f->counter("tensorlane_directory_refused_total",
               "Nodes refused (another key fingerprint, an invalid record)", {},
               static_cast<double>(d.refused));
    f->counter("tensorlane_directory_reconnects_total", "Times the watch was lost and made again",
               {}, static_cast<double>(d.reconnects));
}

void peerFamilies(const std::vector<PeerReport> &peers, Families *f) {
    bool verbs_seen = false;
    for (const PeerReport &p : peers) {
        const std::string &name = p.name;
        if (name.empty()) {
            continue;
        }
        const Labels peer{{"peer", name}};
        const TransportPeerReport &t = p.transport;
        f->gauge("tensorlane_peer_info", "A configured peer, its address and transport (always 1)",
                 {{"peer", name}, {"address", p.address}, {"transport", t.transport}}, 1);
        for (const char *s : kPeerStates) {
            f->gauge("tensorlane_peer_state", "1 for the peer's current state, 0 for the others",
                     {{"peer", name}, {"state", s}}, p.state == s ? 1 : 0);
        }
        f->counter("tensorlane_peer_failures_total", "Times the peer's session failed", peer,
                   num(p.failures));
        f->gauge("tensorlane_peer_control_connections",
                 "Authenticated control connections with the peer (0-2: one per direction)", peer,
                 num(p.control_connections));
        f->gauge("tensorlane_peer_remote_regions", "Regions the peer exposes to this node", peer,
                 num(p.remote_regions));
        if (t.transport == "tcp") {
            f->gauge("tensorlane_peer_tcp_data_connections",
                     "TCP data connections with the peer (both directions)", peer,
                     num(t.data_connections));
        } else if (t.transport == "verbs") {
            qpFamilies(name, "send", t.send_qps, f);
            qpFamilies(name, "receive", t.receive_qps, f);
            f->counter("tensorlane_peer_verbs_work_requests_total",
                       "RDMA work requests posted to the peer (current session)", peer,
                       num(t.work_requests));
            f->counter("tensorlane_peer_verbs_completion_errors_total",
                       "Error completions on the send QPs to the peer (current session)", peer,
                       num(t.completion_errors));
            f->counter("tensorlane_peer_verbs_revocations_forced_total",
                       "Revocations the peer did not confirm within [security] "
                       "revoke_timeout_ms (its key was revoked anyway)",
                       peer, num(t.revocations_forced));
            if (!verbs_seen) {
                verbs_seen = true;
                f->counter("tensorlane_verbs_async_events_total",
                           "Asynchronous events from the RDMA device (port, GID, QP fatal)", {},
                           num(t.device_async_events));
            }
        }
    }
}

void nicFamilies(const std::vector<NicPortSample> &nic, Families *f) {
    for (const NicPortSample &port : nic) {
        const std::string p = std::to_string(port.port);
        f->gauge("tensorlane_rdma_port_active", "1 when the RDMA port's state is ACTIVE",
                 {{"device", port.device}, {"port", p}}, port.active ? 1 : 0);
        for (const auto &[name, v] : port.counters) {
            f->counter("tensorlane_rdma_hw_counters_total",
                       "The RDMA port's hw_counters (sysfs), by counter name: np_cnp_sent, "
                       "np_ecn_marked_roce_packets, rp_cnp_handled, out_of_sequence, "
                       "packet_seq_err, local_ack_timeout_err, ...",
                       {{"device", port.device}, {"port", p}, {"counter", name}},
                       static_cast<double>(v));
        }
    }
}

}  // namespace

std::vector<MetricFamily> buildFamilies(const Snapshot *snap,
                                        const std::vector<NicPortSample> &nic) {
    Families f;
    f.gauge("tensorlane_engine_up",
            "1 when the engine answered this scrape in time (its metrics are below), else 0", {},
            snap != nullptr ? 1 : 0);
    if (snap != nullptr) {
        engineFamilies(*snap, &f);
        writeFamilies(*snap, &f);
        peerFamilies(snap->report.peers, &f);
        directoryFamilies(snap->report.directory, &f);
    }
    nicFamilies(nic, &f);
    return f.take();
}

}  // namespace tensorlane::sidecar
