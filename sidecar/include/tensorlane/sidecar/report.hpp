// The sidecar's state as typed structs: filled once per question (`tensorlane status`, a
// Prometheus scrape) on the engine thread, by the part that owns each figure, and read by the
// engine, the metrics and status_json.cpp without parsing anything. JSON is written once, at the
// top (toJson), in the shape `tensorlane status --json` has always had.
//
// A transport's figures come in two halves: the typed fields of TransportPeerReport, which the
// engine and the metrics read, and `detail`, the transport's own JSON object as `tensorlane
// status` shows it under the peer (its device, GID, MTU, per-connection bytes, and the typed
// figures again, where a person looks for them), built by the transport from the same counters
// in the same call and carried as an object (never as text) until the document is written.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tensorlane::sidecar {

/// One queue pair of an RDMA transport's session.
struct QueuePairReport {
    uint32_t qpn = 0;
    std::string state;  ///< RESET, INIT, RTR, RTS, SQD, SQE, ERR
};

/// What a report is for: `tensorlane status` (kFull: the typed figures and each transport's own
/// `detail` object) or a metrics scrape (kTyped: the typed figures only, which is all the
/// metrics read; a verbs peer's detail alone reads 13 sysfs files on the engine thread).
enum class ReportDetail { kFull, kTyped };

/// One transport's view of one peer (Transport::peerReport).
struct TransportPeerReport {
    std::string transport;   ///< its name in [fabric] transports: "tcp", "verbs", ...
    uint64_t in_flight = 0;  ///< writes posted to it and not ended
    /// Data connections with the peer, both directions (a transport that has them: tcp).
    uint64_t data_connections = 0;
    /// The queue pairs of our session to the peer and of its session to us (RDMA transports;
    /// empty while that session does not exist).
    std::vector<QueuePairReport> send_qps;
    std::vector<QueuePairReport> receive_qps;
    uint64_t work_requests = 0;        ///< posted on our session (current session)
    uint64_t completion_errors = 0;    ///< error completions on our session
    uint64_t revocations_forced = 0;   ///< revocations the peer did not confirm in time
    uint64_t device_async_events = 0;  ///< the device's asynchronous events (device-wide)
    /// The transport's own figures for `tensorlane status`, a JSON object; null: none (and
    /// always null in a ReportDetail::kTyped report).
    std::shared_ptr<const nlohmann::json> detail;
};

/// One configured peer (PeerManager::report).
struct PeerReport {
    std::string name;
    std::string address;  ///< as configured
    std::string state;    ///< down, connecting, up, failed
    uint64_t control_connections = 0;
    uint64_t failures = 0;
    std::string last_error;
    uint64_t remote_regions = 0;
    uint64_t remote_regions_ignored = 0;
    std::string incarnation;  ///< hex; empty before the first session
    bool inbound = false;     ///< its session to us is up
    std::string hosts;        ///< what its host resolves to
    TransportPeerReport transport;
};

/// The peer listener.
struct ListenerReport {
    std::string node;
    std::string address;
    std::string incarnation;
    uint64_t pending_handshakes = 0;
    uint64_t rejected = 0;
    std::string last_rejection;
    uint64_t pending_unlisted = 0;
    uint64_t unlisted_dropped = 0;
    uint64_t claims_refused = 0;
    uint64_t handles = 0;
    uint64_t handle_tombstones = 0;
};

struct PeersReport {
    std::vector<PeerReport> peers;
    ListenerReport listener;
};

/// One connected client.
struct ClientReport {
    uint64_t session = 0;
    int64_t pid = 0;
    int64_t uid = 0;
    uint64_t regions = 0;
    uint64_t requests = 0;
    uint64_t completions = 0;
    uint64_t notifications = 0;
    uint64_t notifications_dropped = 0;
    uint64_t rejected = 0;
    uint64_t bytes_written = 0;
    uint64_t host_bytes = 0;
    uint64_t in_flight = 0;
};

struct CudaReport {
    bool available = false;
    int64_t devices = 0;
    uint64_t imports_open = 0;
    uint64_t imports_opened = 0;
    std::string why;  ///< when not available
};

/// The limits in force ([limits] and what the engine derived from the host).
struct LimitsReport {
    uint64_t regions = 0;
    uint64_t registered_bytes = 0;
    uint64_t node_registered_bytes = 0;
    std::string node_registered_bytes_source;
    uint64_t node_host_bytes = 0;
    uint64_t notification_backlog = 0;
    uint64_t sessions_per_uid = 0;
    uint64_t sessions_per_pid = 0;
    uint64_t fd_reserve = 0;
    uint64_t in_flight = 0;
    uint64_t mappings = 0;
    uint64_t max_mappings = 0;
};

struct EngineCountersReport {
    uint64_t sessions_accepted = 0;
    uint64_t sessions_refused = 0;
    uint64_t writes_local = 0;
    uint64_t writes_local_inline = 0;
    uint64_t writes_local_gpu_inline = 0;
    uint64_t writes_remote = 0;
    uint64_t requests_rejected = 0;
    uint64_t notifications = 0;
    uint64_t notifications_dropped = 0;
    uint64_t probes_received = 0;
    uint64_t probes_sent = 0;  ///< `tensorlane diag`'s writes: not in writes_remote
    uint64_t quota_refusals = 0;
    uint64_t session_cap_refusals = 0;
    uint64_t accept_pauses = 0;
    uint64_t late_wakeups = 0;
    uint64_t writes_queued = 0;
    uint64_t writes_in_flight = 0;
};

/// The cluster directory ([directory]; docs/directory.md).
struct DirectoryReport {
    std::string kind = "static";  ///< static | etcd; the rest is etcd's
    std::string state;            ///< connecting | up | down | stopped
    std::string endpoint;         ///< the etcd endpoint in use
    std::string cluster;
    std::string key;          ///< this node's key
    bool registered = false;  ///< our key is in etcd under a live lease
    int64_t lease_ttl_s = 0;
    int64_t revision = 0;   ///< the last revision the watch saw
    uint64_t nodes = 0;     ///< peers learned from it now
    uint64_t joined = 0;    ///< PUTs of new nodes since start
    uint64_t left = 0;      ///< deletions and lease expiries
    uint64_t restarts = 0;  ///< new epochs under a known name
    uint64_t refused = 0;   ///< nodes refused (key fingerprint, invalid record)
    uint64_t reconnects = 0;
    uint64_t events = 0;
    double down_for_s = 0;  ///< how long it has been unreachable; 0 while up
    std::string last_error;
    std::string last_refusal;
};

/// The whole sidecar (Engine::report): what `tensorlane status` shows.
struct EngineReport {
    std::string node;
    std::string socket;
    std::string poll_mode;         ///< resolved: busy, adaptive or event
    std::string poll_mode_reason;  ///< why ("auto: 2 usable CPUs (affinity): ...")
    /// The fastest remote transport's link rate in Mb/s (the verbs port's); 0 when none knows.
    uint64_t link_mbps = 0;
    /// The verbs NIC's PCI function in sysfs (TransportCaps::nic_pci_path); empty when none:
    /// what the NCCL plugin gives NCCL as its device's pciPath.
    std::string nic_pci_path;
    double uptime_s = 0;
    std::vector<ClientReport> clients;
    std::string clients_shown;  ///< "all", or "uid N" when filtered for a non-root client
    uint64_t regions = 0;       ///< the clients' (the sidecar's probe region left out)
    CudaReport cuda;
    uint64_t registered_bytes = 0;
    LimitsReport limits;
    EngineCountersReport counters;
    std::vector<PeerReport> peers;
    DirectoryReport directory;
};

/// The documents `tensorlane status --json` shows (status_json.cpp): `indent` as
/// nlohmann::json::dump's (-1: one line).
std::string toJsonText(const EngineReport &r, int indent = 2);
std::string toJsonText(const PeersReport &r);

}  // namespace tensorlane::sidecar
