// tensorlane configuration: the one TOML file of DESIGN.md, parsed into typed structs.
//
// Every key of DESIGN.md's [node], [fabric], [ipc], [security] and [[peers]] tables is here with
// its default. Unknown keys are errors; every error names file, line, column, key, what was
// expected and what was found.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tensorlane::config {

/// Transport selection in [fabric] transport.
enum class TransportKind { kAuto, kVerbs, kTcp };
/// Ring poll mode in [ipc] poll_mode. kAuto is resolved by resolvePollMode() when the sidecar
/// starts; nothing downstream of it ever sees kAuto.
enum class PollMode { kBusy, kAdaptive, kEvent, kAuto };
/// Switch trust mode in [fabric] trust.
enum class TrustMode { kDscp, kPcp };
/// [fabric] tclass_override: what to do when the host-wide traffic class in sysfs differs.
enum class TclassOverride { kFail, kAdopt };
/// [fabric] preflight: whether a failing diag finding stops the sidecar at start.
enum class Preflight { kWarn, kFail };
/// [fabric] gdr_flush: flush NIC writes into GPU memory before notifying (auto: where needed).
enum class GdrFlush { kAuto, kOn, kOff };
/// [security] tcp_integrity: authenticate every TCP data frame (mac) or not (none).
enum class TcpIntegrity { kMac, kNone };

/// A host:port pair as written in the file; names are resolved when connecting, not parsing.
struct Endpoint {
    /// "0.0.0.0", "10.0.0.2", "node-b.example", "::1" (IPv6 without the brackets).
    std::string host;
    /// 1-65535.
    uint16_t port = 0;
    /// "host:port" ("[v6]:port" for IPv6 literals).
    std::string text() const;
};

/// [node]: who this node is and where it listens.
struct NodeConfig {
    /// This node's name, 1-63 characters of [A-Za-z0-9._-]; peers list it under [[peers]].
    std::string name = "node-a";
    /// Peer bootstrap address.
    Endpoint listen{"0.0.0.0", 18515};
    /// Unix socket workers connect to: absolute, shorter than 108 bytes (sun_path).
    std::string socket = "/run/tensorlane/sidecar.sock";
    /// Connect every peer at start (default: on first use).
    bool connect_eagerly = false;
};

/// [fabric]: the RoCE device and the QP attributes.
struct FabricConfig {
    /// auto | verbs | tcp; see resolveTransport(). Set from `transports` when that is given
    /// (tcp without verbs in it, verbs when it is verbs alone, else auto).
    TransportKind transport = TransportKind::kAuto;
    /// The remote transports in order of preference (`transports = ["verbs", "tcp"]`); empty:
    /// what `transport` says (transportPreference()).
    std::vector<std::string> transports;
    /// "auto" or an RDMA device name such as "mlx5_0".
    std::string device = "auto";
    /// Device port, 1-255.
    uint8_t port = 1;
    /// "auto" or the Ethernet interface behind the device, such as "eth0" (1-15 characters).
    std::string netdev = "auto";
    /// 0-255; nullopt means "auto" (picked by the verbs transport).
    std::optional<uint8_t> gid_index;
    /// 0-63.
    uint8_t dscp = 26;
    /// Mark packets ECN-capable (ECT(0)) in the traffic class.
    bool ecn = true;
    /// 0-7.
    uint8_t pfc_priority = 3;
    /// dscp | pcp.
    TrustMode trust = TrustMode::kDscp;
    /// 256 | 512 | 1024 | 2048 | 4096, clamped to the port's active MTU.
    uint32_t mtu = 4096;
    /// 0-31: local ACK timeout 4.096 us * 2^timeout; 0 is infinite.
    uint8_t timeout = 18;
    /// 0-7.
    uint8_t retry_cnt = 7;
    /// 0-7 (7 retries forever).
    uint8_t rnr_retry = 7;
    /// 0-31.
    uint8_t min_rnr_timer = 12;
    /// 1-64.
    uint32_t qps_per_peer = 2;
    /// fail | adopt: the host-wide traffic class (sysfs tc/<port>/traffic_class) differs.
    TclassOverride tclass_override = TclassOverride::kFail;
    /// warn | fail: refuse to start on a failing `tensorlane diag` finding.
    Preflight preflight = Preflight::kWarn;
    /// auto | on | off: GDR flush (an RDMA READ on a loopback QP) before notifying the owner
    /// of a GPU region; auto flushes where the platform needs it.
    GdrFlush gdr_flush = GdrFlush::kAuto;
};

/// [tcp]: the TCP transport, used when no RDMA port is up or transport = "tcp".
struct TcpConfig {
    /// 1-16 data connections per peer.
    uint32_t connections_per_peer = 2;
    /// Pipelining chunk, 4 KiB - 64 MiB (4096-67108864).
    uint32_t chunk_bytes = 1u << 20;
    /// Probe interval when a connection is idle, 10-60000.
    uint32_t keepalive_ms = 1000;
    /// In-flight writes fail with TL_EPEER after this, 100-600000.
    uint32_t peer_timeout_ms = 5000;
    /// 10-60000.
    uint32_t connect_timeout_ms = 2000;
    /// Backoff start (jittered, doubling), 1-60000.
    uint32_t reconnect_min_ms = 100;
    /// Backoff cap, reconnect_min_ms-600000.
    uint32_t reconnect_max_ms = 5000;
    /// Writes in flight to one peer before its queue holds the rest, 1-4096.
    uint32_t window = 1024;
    /// Threads that compute and check the frame tags of big chunks off the engine thread,
    /// 0-16; unset ("auto"): none on a host with fewer than 4 CPUs, else one per 4, at most 4.
    std::optional<uint32_t> tag_threads;
};

/// [ipc]: the shared-memory rings between workers and the sidecar.
struct IpcConfig {
    /// Power of two, 16-65536.
    uint32_t ring_depth = 1024;
    /// auto | busy | adaptive | event; auto: see resolvePollMode().
    PollMode poll_mode = PollMode::kAuto;
    /// Adaptive: spin this long before sleeping, 0-10000.
    uint32_t spin_us = 50;
};

/// One [security] reserved_names entry: exposed names starting with `prefix` belong to these
/// uids and groups (and root); any other local client's tl_expose of such a name is TL_EPERM.
struct ReservedName {
    /// 1-63 characters of a region name ([A-Za-z0-9._-/:]); no two entries share one.
    std::string prefix;
    std::vector<uint32_t> uids;
    std::vector<uint32_t> gids;  ///< primary or supplementary groups of the exposing client
};

/// [security]: who may use the socket and the key peers share.
struct SecurityConfig {
    /// Uids allowed on the socket; empty: root and the sidecar's own uid.
    std::vector<uint32_t> allowed_uids;
    /// Gids allowed on the socket.
    std::vector<uint32_t> allowed_gids;
    /// Mode 0600 (no group or other access); shared by the nodes that may talk.
    std::string peer_key_file = "/etc/tensorlane/peer.key";
    /// mac | none: authenticate every TCP data frame with a key derived from the handshake.
    TcpIntegrity tcp_integrity = TcpIntegrity::kMac;
    /// How long a verbs receiver waits for a peer to confirm a revocation (KEY_DEL_DONE)
    /// before it deregisters the region's MR anyway (10-600000 ms).
    uint32_t revoke_timeout_ms = 1500;
    /// Name prefixes reserved for some uids/gids (tl_expose); empty: none.
    std::vector<ReservedName> reserved_names;
    /// Let connections from addresses that no [[peers]] entry resolves to reach the handshake
    /// (peers behind NAT); false: they are closed as they are accepted (docs/peers.md).
    bool allow_unlisted_peers = false;
    /// Accept a peer's name only from an address its [[peers]] entry resolves to; false for
    /// setups where peers connect from other addresses than the ones they are dialled at.
    bool verify_peer_address = true;
};

/// [limits]: per-client quotas (and one per peer), refused with a clear status when exceeded.
struct LimitsConfig {
    /// Regions one client may hold, 1-1048576.
    uint32_t regions = 4096;
    /// Bytes of host buffers one client may allocate, 4 KiB - 1 PiB ("64GiB" or an integer).
    uint64_t registered_bytes = uint64_t{64} << 30;
    /// Requests one client may have in flight (the rest waits in its ring), 1-65536.
    uint32_t in_flight = 1024;
    /// Regions a peer may describe to us, 1-16777216.
    uint32_t peer_regions = 65536;
    /// Notifications kept for one client whose ring is full, 1-1048576; past it they are
    /// dropped and counted (the next one delivered carries the count).
    uint32_t notification_backlog = 65536;
    /// Sessions one uid may hold at once, 1-1048576.
    uint32_t sessions_per_uid = 1024;
    /// Sessions one process may hold at once, 1-1048576.
    uint32_t sessions_per_pid = 256;
    /// File descriptors held back for uids with no session yet, 0-65536.
    uint32_t fd_reserve = 256;
    /// Bytes of host buffers all clients together may allocate, 4 KiB - 1 PiB; 0 is "auto":
    /// kAutoNodeRegisteredPercent of the memory the sidecar may use (its cgroup's limit, v1 or
    /// v2, else MemTotal), resolved when the sidecar starts.
    uint64_t node_registered_bytes = 0;
    /// What "auto" resolves node_registered_bytes to, in percent of the memory it may use.
    static constexpr uint64_t kAutoNodeRegisteredPercent = 75;
};

/// [metrics]: the Prometheus endpoint.
struct MetricsConfig {
    /// "host:port" serving Prometheus text at /metrics; nullopt (the file's "") is off.
    std::optional<Endpoint> listen;
};

/// [directory] kind: where this node learns its peers.
enum class DirectoryKind { kStatic, kEtcd };

/// [directory]: how nodes find each other. "static" (the default) is [[peers]]; "etcd" keeps
/// the cluster's membership in etcd (docs/directory.md): this node registers itself under
/// /tensorlane/<cluster>/nodes/<name> with a lease and learns the others from a watch.
struct DirectoryConfig {
    /// static | etcd.
    DirectoryKind kind = DirectoryKind::kStatic;
    /// etcd's client URLs, "http://host:port" or "https://host:port" (no path), tried in turn.
    std::vector<std::string> endpoints;
    /// The cluster's name, 1-63 characters of [A-Za-z0-9._-]: the key prefix
    /// /tensorlane/<cluster>/, so clusters sharing one etcd never see each other.
    std::string cluster;
    /// TTL of this node's lease, 2000-600000 ms (etcd counts whole seconds: rounded up); a node
    /// that dies leaves the cluster this long after its last keep-alive.
    uint32_t lease_ttl_ms = 10000;
    /// The bootstrap address peers dial, registered in etcd; unset: [node] listen (which must
    /// then not be a wildcard address).
    std::optional<Endpoint> advertise;
    /// How long one request to etcd may take before the endpoint counts as down, 100-60000.
    uint32_t request_timeout_ms = 2000;
    /// Backoff between reconnects to etcd (jittered, doubling from min to max), 10-600000.
    uint32_t reconnect_min_ms = 200;
    uint32_t reconnect_max_ms = 5000;
    /// TLS (https endpoints): the CA bundle that signs etcd's certificate; empty: the system's.
    std::string ca_file;
    /// TLS client certificate and its key (etcd's --client-cert-auth); both or neither.
    std::string cert_file;
    std::string key_file;
    /// etcd authentication (etcd's user/role auth): user name, and a file holding the password
    /// (one line, mode 0600); both or neither.
    std::string username;
    std::string password_file;

    /// "/tensorlane/<cluster>/".
    std::string prefix() const { return "/tensorlane/" + cluster + "/"; }
};

/// One [[peers]] entry; name and address are required.
struct PeerConfig {
    /// 1-63 characters of [A-Za-z0-9._-]; unique, and not this node's name.
    std::string name;
    /// Unique among the peers.
    Endpoint address;
    /// The key only this node and this peer hold (a tensorlane-key-v1 file, mode 0600); empty:
    /// [security] peer_key_file.
    std::string key_file;
};

/// The whole file, validated.
struct Config {
    /// The file it came from ("<string>" when parsed from memory).
    std::string source;
    /// [node].
    NodeConfig node;
    /// [fabric].
    FabricConfig fabric;
    /// [tcp].
    TcpConfig tcp;
    /// [ipc].
    IpcConfig ipc;
    /// [security].
    SecurityConfig security;
    /// [limits].
    LimitsConfig limits;
    /// [metrics].
    MetricsConfig metrics;
    /// [[peers]], in file order.
    std::vector<PeerConfig> peers;
    /// [directory].
    DirectoryConfig directory;

    /// Whether this node talks to peers at all: it has [[peers]] or an etcd directory (then it
    /// listens, and needs the shared key, even before any other node joined).
    bool hasPeers() const { return !peers.empty() || directory.kind == DirectoryKind::kEtcd; }
    /// The bootstrap address registered in the directory: [directory] advertise or [node] listen.
    const Endpoint &advertisedAddress() const {
        return directory.advertise ? *directory.advertise : node.listen;
    }

    /// DSCP << 2 | (ecn ? 2 : 0): DSCP 26 with ECN gives 106.
    uint8_t trafficClass() const;
    /// The RC local ACK timeout in seconds: 4.096 us * 2^timeout (0 means infinite).
    double rcTimeoutSeconds() const;
    /// Finds a peer by name, nullptr when there is none.
    const PeerConfig *findPeer(std::string_view name) const;
};

/// One problem found in a file. `text()` is the one-line form printed to users:
/// "FILE:LINE:COL: key 'fabric.dscp': expected an integer 0-63, found 64".
/// The position is the value's for a bad value, the key's for an unknown key or a key file.
struct Error {
    /// The file name, or the source name given to parseString.
    std::string file;
    /// 1-based; 0 when the error has no position (a missing key file, an unreadable file).
    uint32_t line = 0;
    /// 1-based, in characters.
    uint32_t column = 0;
    /// Dotted path, e.g. "peers[1].address"; empty for TOML syntax and I/O errors.
    std::string key;
    /// What the key takes, e.g. "an integer 0-63".
    std::string expected;
    /// What the file has, e.g. "64" or "string \"x\"".
    std::string found;
    /// Free-form text for errors that are not an expected/found pair (TOML syntax, I/O); when
    /// set, text() prints it in place of "expected ..., found ...".
    std::string message;
    /// "FILE:LINE:COL: key 'K': expected E, found F"; ":LINE:COL" is left out when line is 0.
    std::string text() const;
    /// What to change, for people and tools (`--check-config --json`): "set 'K' to E", "remove
    /// or rename 'K'", or where the TOML syntax or the file is wrong.
    std::string fix() const;
};

/// The outcome of parsing: a Config, or every error found (never just the first).
struct ParseResult {
    /// Set only when there are no errors.
    std::optional<Config> config;
    /// Every error, in file order; position-less ones last.
    std::vector<Error> errors;
    /// A config and no errors.
    bool ok() const { return config.has_value() && errors.empty(); }
};

/// Options that make the file checks testable.
struct ParseOptions {
    /// Check [security] peer_key_file exists, is readable and is not group/other accessible.
    bool check_key_file = true;
};

/// Parses and validates a file. Never throws.
ParseResult parseFile(const std::string &path, const ParseOptions &opts = {});
/// Parses and validates TOML text; `source_name` is used in error messages. Never throws.
ParseResult parseString(std::string_view text, const std::string &source_name = "<string>",
                        const ParseOptions &opts = {});

/// What `transport = "auto"` (or an explicit choice) resolves to on this host.
struct TransportChoice {
    /// Never kAuto.
    TransportKind kind = TransportKind::kTcp;
    /// Why, e.g. "mlx5_0 port 1 is ACTIVE", "no RDMA device under /sys/class/infiniband",
    /// "set in the file".
    std::string reason;
};
/// Resolves the transport by looking at <sysfs_root>/class/infiniband/*/ports/*/state: auto
/// gives verbs when a port is ACTIVE (only the configured device and port when device is not
/// "auto"), else tcp; explicit verbs and tcp are kept, the reason saying what sysfs shows.
/// Reads files only (no libibverbs). A root of "/sys" is replaced by $TENSORLANE_SYSFS_ROOT
/// when that is set. Never throws.
TransportChoice resolveTransport(const Config &cfg, const std::string &sysfs_root = "/sys");

/// What [ipc] poll_mode resolves to on a host with `cpus` usable CPUs.
struct PollModeChoice {
    /// Never kAuto.
    PollMode mode = PollMode::kEvent;
    /// Why, for the log, the status and the bench, e.g. "auto: 2 usable CPUs (affinity) ...".
    std::string reason;
    /// An explicit spinning mode on a host too small for it: worth a warning in the log.
    bool warn = false;
};
/// Spinning modes need a CPU for each spinning side: from this many usable CPUs, auto is
/// adaptive; below it, event (a spinning client or sidecar takes the CPU that the other side
/// of each hand-off needs: on 2 vCPUs, adaptive made a 64 B round trip ~90x a TCP ping-pong).
constexpr unsigned kAdaptiveMinCpus = 4;
/// auto gives adaptive with kAdaptiveMinCpus or more usable CPUs, else event; an explicit mode is
/// kept (warn set for busy or adaptive below kAdaptiveMinCpus). `cpu_source` says where the
/// count comes from ("affinity", "cgroup cpu.max"). Never throws.
PollModeChoice resolvePollMode(PollMode configured, unsigned cpus, std::string_view cpu_source);

/// The resolved configuration with derived values, as text for people: one "key = value" line
/// per setting, grouped by table, derived values next to what they derive from. No final newline.
std::string describeText(const Config &cfg, const TransportChoice &choice);
/// The same as one JSON object (stable keys, for machines): the tables, "peers", and "derived"
/// with traffic_class, rc_timeout_s (0 when infinite), rc_timeout_infinite, transport and
/// transport_reason. No final newline.
std::string describeJson(const Config &cfg, const TransportChoice &choice);

/// The name used in the file: "auto", "verbs", "tcp".
const char *toString(TransportKind k);

/// The remote transports a node offers and picks from, best first: [fabric] transports, or
/// for `transport` auto {"verbs", "tcp"}, verbs {"verbs"}, tcp {"tcp"}.
std::vector<std::string> transportPreference(const FabricConfig &f);
/// The remote transports the config library knows by name ("tcp", "verbs").
bool isTransportName(std::string_view name);
/// The name used in the file: "busy", "adaptive", "event".
const char *toString(PollMode m);
/// The name used in the file: "dscp", "pcp".
const char *toString(TrustMode t);
/// The name used in the file: "fail", "adopt".
const char *toString(TclassOverride t);
/// The name used in the file: "warn", "fail".
const char *toString(Preflight p);
/// The name used in the file: "auto", "on", "off".
const char *toString(GdrFlush g);
/// The name used in the file: "mac", "none".
const char *toString(TcpIntegrity t);
/// The name used in the file: "static", "etcd".
const char *toString(DirectoryKind k);
/// Bytes as the file may write them: "1TiB", "512MiB", "4096".
std::string formatBytes(uint64_t bytes);

}  // namespace tensorlane::config
