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
/// Ring poll mode in [ipc] poll_mode.
enum class PollMode { kBusy, kAdaptive, kEvent };
/// Switch trust mode in [fabric] trust.
enum class TrustMode { kDscp, kPcp };

/// A host:port pair as written in the file; names are resolved when connecting, not parsing.
struct Endpoint {
    std::string host;    ///< "0.0.0.0", "10.0.0.2", "node-b.example", "::1"
    uint16_t port = 0;   ///< 1-65535
    std::string text() const;  ///< "host:port" ("[v6]:port" for IPv6 literals)
};

struct NodeConfig {
    std::string name = "node-a";
    Endpoint listen{"0.0.0.0", 18515};
    std::string socket = "/run/tensorlane/sidecar.sock";
    bool connect_eagerly = false;   ///< connect every peer at start (default: on first use)
};

struct FabricConfig {
    TransportKind transport = TransportKind::kAuto;
    std::string device = "auto";
    uint8_t port = 1;                    ///< 1-255
    std::string netdev = "auto";
    std::optional<uint8_t> gid_index;    ///< nullopt means "auto"
    uint8_t dscp = 26;                   ///< 0-63
    bool ecn = true;
    uint8_t pfc_priority = 3;            ///< 0-7
    TrustMode trust = TrustMode::kDscp;
    uint32_t mtu = 4096;                 ///< 256 | 512 | 1024 | 2048 | 4096
    uint8_t timeout = 18;                ///< 0-31
    uint8_t retry_cnt = 7;               ///< 0-7
    uint8_t rnr_retry = 7;               ///< 0-7
    uint8_t min_rnr_timer = 12;          ///< 0-31
    uint32_t qps_per_peer = 2;           ///< 1-64
};

struct TcpConfig {
    uint32_t connections_per_peer = 2;   ///< 1-16 data connections per peer
    uint32_t chunk_bytes = 1u << 20;     ///< pipelining chunk, 4 KiB - 64 MiB
    uint32_t keepalive_ms = 1000;        ///< probe interval when a connection is idle
    uint32_t peer_timeout_ms = 5000;     ///< in-flight writes fail with TL_EPEER after this
    uint32_t connect_timeout_ms = 2000;
    uint32_t reconnect_min_ms = 100;     ///< backoff start (jittered, doubling)
    uint32_t reconnect_max_ms = 5000;    ///< backoff cap
};

struct IpcConfig {
    uint32_t ring_depth = 1024;          ///< power of two, 16-65536
    PollMode poll_mode = PollMode::kAdaptive;
    uint32_t spin_us = 50;               ///< adaptive: spin this long before sleeping, 0-10000
};

struct SecurityConfig {
    std::vector<uint32_t> allowed_uids;  ///< empty: root and the sidecar's own uid
    std::vector<uint32_t> allowed_gids;
    std::string peer_key_file = "/etc/tensorlane/peer.key";
};

struct PeerConfig {
    std::string name;
    Endpoint address;
};

struct Config {
    std::string source;   ///< the file it came from ("<string>" when parsed from memory)
    NodeConfig node;
    FabricConfig fabric;
    TcpConfig tcp;
    IpcConfig ipc;
    SecurityConfig security;
    std::vector<PeerConfig> peers;

    /// DSCP << 2 | (ecn ? 2 : 0): DSCP 26 with ECN gives 106.
    uint8_t trafficClass() const;
    /// The RC local ACK timeout in seconds: 4.096 us * 2^timeout (0 means infinite).
    double rcTimeoutSeconds() const;
    /// Finds a peer by name, nullptr when there is none.
    const PeerConfig *findPeer(std::string_view name) const;
};

/// One problem found in a file. `text()` is the one-line form printed to users:
/// "FILE:LINE:COL: key 'fabric.dscp': expected an integer 0-63, found 64".
struct Error {
    std::string file;
    uint32_t line = 0;     ///< 1-based; 0 when the error has no position (a missing key file)
    uint32_t column = 0;
    std::string key;       ///< dotted path, e.g. "peers[1].address"
    std::string expected;
    std::string found;
    std::string text() const;
};

/// The outcome of parsing: a Config, or every error found (never just the first).
struct ParseResult {
    std::optional<Config> config;
    std::vector<Error> errors;
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
    TransportKind kind = TransportKind::kTcp;   ///< never kAuto
    std::string reason;                          ///< e.g. "no RDMA device with an ACTIVE port"
};
/// Resolves the transport by looking at <sysfs_root>/class/infiniband/*/ports/*/state.
TransportChoice resolveTransport(const Config &cfg, const std::string &sysfs_root = "/sys");

/// The resolved configuration with derived values, as text for people.
std::string describeText(const Config &cfg, const TransportChoice &choice);
/// The same as one JSON object (stable keys, for machines).
std::string describeJson(const Config &cfg, const TransportChoice &choice);

const char *toString(TransportKind k);
const char *toString(PollMode m);
const char *toString(TrustMode t);

}  // namespace tensorlane::config
