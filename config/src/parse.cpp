// parseFile / parseString: TOML text -> validated Config, or every error found in it.
//
// toml++ does the syntax (and catches duplicate keys); everything after that is a walk over the
// tree that checks types, ranges, unknown keys and the cross rules, recording an Error for each
// problem instead of stopping at the first, so one run of --check-config shows them all.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <toml++/toml.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <span>
#include <sstream>
#include <variant>

#include "internal.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/config/key_file.hpp"

namespace tensorlane::config {
namespace {

using detail::quote;

constexpr int64_t kMaxId = 4294967295;  // uid_t and gid_t are 32-bit on Linux

/// Collects errors for one parse; positions come from toml++ source regions.
class Collector {
public:
    Collector(std::string file, bool shielded) : file_(std::move(file)), shielded_(shielded) {}

    void add(const toml::source_region &where, std::string key, std::string expected,
             std::string found) {
        Error e;
        e.file = file_;
        e.line = where.begin.line;
        e.column = where.begin.column;
        e.key = std::move(key);
        e.expected = std::move(expected);
        e.found = std::move(found);
        errors_.push_back(std::move(e));
    }

    std::vector<Error> &errors() { return errors_; }

    /// A key as the file spells it (keys are not in the unshielded string values).
    std::string keyName(std::string_view key) const {
        return shielded_ ? detail::unshieldToml(key) : std::string(key);
    }

private:
    std::string file_;
    bool shielded_ = false;
    std::vector<Error> errors_;
};

/// A value printed as toml++ would write it (floats, dates, times).
template <typename T>
std::string tomlText(const toml::value<T> &v) {
    std::ostringstream os;
    os << v;
    return os.str();
}

/// What was found, for a value of the right type but a wrong value: `64`, `"foo"`.
std::string foundValue(const toml::node &n) {
    switch (n.type()) {
        case toml::node_type::string:
            return quote(n.as_string()->get());
        case toml::node_type::integer:
            return std::to_string(n.as_integer()->get());
        case toml::node_type::boolean:
            return n.as_boolean()->get() ? "true" : "false";
        case toml::node_type::floating_point:
            return tomlText(*n.as_floating_point());
        case toml::node_type::date:
            return tomlText(*n.as_date());
        case toml::node_type::time:
            return tomlText(*n.as_time());
        case toml::node_type::date_time:
            return tomlText(*n.as_date_time());
        case toml::node_type::array:
            return "an array";
        case toml::node_type::table:
            return "a table";
        case toml::node_type::none:
            break;
    }
    return "nothing";
}

/// What was found, for a value of the wrong type: `string "x"`, `boolean true`, `a table`.
std::string foundTyped(const toml::node &n) {
    switch (n.type()) {
        case toml::node_type::string:
            return "string " + foundValue(n);
        case toml::node_type::integer:
            return "integer " + foundValue(n);
        case toml::node_type::boolean:
            return "boolean " + foundValue(n);
        case toml::node_type::floating_point:
            return "float " + foundValue(n);
        case toml::node_type::date:
            return "date " + foundValue(n);
        case toml::node_type::time:
            return "time " + foundValue(n);
        case toml::node_type::date_time:
            return "date-time " + foundValue(n);
        default:
            return foundValue(n);
    }
}

size_t editDistance(std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) {
        row[j] = j;
    }
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
            diag = up;
        }
    }
    return row[b.size()];
}

std::string joinKeys(std::span<const std::string_view> keys) {
    std::string out;
    for (const auto k : keys) {
        out += out.empty() ? "" : ", ";
        out += k;
    }
    return out;
}

/// A key as it goes into Error::key: bare keys as they are, anything else quoted the TOML way,
/// so a quoted key holding a newline or a dot cannot break the one-line error text.
std::string displayKey(std::string_view key) {
    const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '_' || ch == '-';
    });
    return bare ? std::string(key) : quote(key, 64);
}

/// One table of the file: knows its dotted path and its keys, reports the keys it does not know.
class TableReader {
public:
    TableReader(Collector &c, const toml::table &tbl, std::string path, std::string label,
                std::span<const std::string_view> known)
        : c_(c), tbl_(tbl), path_(std::move(path)) {
        for (const auto &[k, v] : tbl) {
            (void)v;
            if (std::find(known.begin(), known.end(), k.str()) != known.end()) {
                continue;
            }
            const std::string name = displayKey(c_.keyName(k.str()));
            // A typo is the usual cause; name the closest key rather than the whole list.
            std::string expected = "a key of " + label;
            const std::string_view *best = nullptr;
            size_t best_distance = 3;
            for (const auto &candidate : known) {
                const size_t d = editDistance(std::string_view(name).substr(0, 64), candidate);
                if (d < best_distance && d <= std::max<size_t>(1, candidate.size() / 3)) {
                    best = &candidate;
                    best_distance = d;
                }
            }
            if (best != nullptr) {
                expected += " (did you mean '" + keyPath(*best) + "'?)";
            } else {
                expected += ": " + joinKeys(known);
            }
            c_.add(k.source(), keyPath(name), std::move(expected), "unknown key");
        }
    }

    /// The dotted path of `key` in this table, e.g. "fabric.dscp".
    std::string keyPath(std::string_view key) const {
        if (path_.empty()) {
            return std::string(key);
        }
        return path_ + "." + std::string(key);
    }

    const toml::node *node(std::string_view key) const { return tbl_.get(key); }

    /// The key object itself (for errors that point at the key rather than its value).
    const toml::key *keyOf(std::string_view key) const {
        const auto it = tbl_.find(key);
        return it == tbl_.end() ? nullptr : &it->first;
    }

    Collector &collector() const { return c_; }

    /// An integer for which `ok` holds; records an error otherwise.
    template <typename T, typename Pred>
    bool integer(std::string_view key, const std::string &expected, Pred ok, T &out) const {
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        if (!n->is_integer()) {
            c_.add(n->source(), keyPath(key), expected, foundTyped(*n));
            return false;
        }
        const int64_t v = n->as_integer()->get();
        if (!ok(v)) {
            c_.add(n->source(), keyPath(key), expected, std::to_string(v));
            return false;
        }
        out = static_cast<T>(v);
        return true;
    }

    /// An integer in [lo, hi].
    template <typename T>
    bool range(std::string_view key, int64_t lo, int64_t hi, T &out) const {
        const std::string expected = "an integer " + std::to_string(lo) + "-" + std::to_string(hi);
        return integer(
            key, expected, [lo, hi](int64_t v) { return v >= lo && v <= hi; }, out);
    }

    /// "auto" (`out` left unset) or an integer in [lo, hi].
    template <typename T>
    bool autoOrRange(std::string_view key, int64_t lo, int64_t hi, std::optional<T> &out) const {
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        const std::string expected =
            "\"auto\" or an integer " + std::to_string(lo) + "-" + std::to_string(hi);
        if (n->is_string()) {
            if (n->as_string()->get() == "auto") {
                out.reset();
                return true;
            }
            c_.add(n->source(), keyPath(key), expected, foundTyped(*n));
            return false;
        }
        T v{};
        if (!integer(
                key, expected, [lo, hi](int64_t x) { return x >= lo && x <= hi; }, v)) {
            return false;
        }
        out = v;
        return true;
    }

    bool boolean(std::string_view key, bool &out) const {
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        if (!n->is_boolean()) {
            c_.add(n->source(), keyPath(key), "a boolean (true or false)", foundTyped(*n));
            return false;
        }
        out = n->as_boolean()->get();
        return true;
    }

    /// A string for which `ok` holds.
    template <typename Pred>
    bool string(std::string_view key, const std::string &expected, Pred ok,
                std::string &out) const {
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        if (!n->is_string()) {
            c_.add(n->source(), keyPath(key), expected, foundTyped(*n));
            return false;
        }
        const std::string &v = n->as_string()->get();
        if (!ok(std::string_view(v))) {
            c_.add(n->source(), keyPath(key), expected, quote(v));
            return false;
        }
        out = v;
        return true;
    }

    /// One of a fixed set of strings, mapped to an enumerator.
    template <typename E, size_t N>
    bool enumeration(std::string_view key, const std::array<std::pair<std::string_view, E>, N> &map,
                     E &out) const {
        std::string expected = "one of ";
        for (size_t i = 0; i < N; ++i) {
            expected += (i == 0 ? "\"" : ", \"") + std::string(map[i].first) + "\"";
        }
        std::string text;
        const auto known = [&map](std::string_view v) {
            return std::any_of(map.begin(), map.end(), [v](const auto &p) { return p.first == v; });
        };
        if (!string(key, expected, known, text)) {
            return false;
        }
        if (node(key) == nullptr) {
            return true;
        }
        for (const auto &[name, value] : map) {
            if (name == text) {
                out = value;
            }
        }
        return true;
    }

    /// A "host:port" endpoint.
    bool endpoint(std::string_view key, Endpoint &out) const {
        static const std::string kExpected =
            "a \"host:port\" address with a port 1-65535 (IPv6 as \"[::1]:18515\")";
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        if (!n->is_string()) {
            c_.add(n->source(), keyPath(key), kExpected, foundTyped(*n));
            return false;
        }
        const auto ep = detail::parseEndpoint(n->as_string()->get());
        if (!ep) {
            c_.add(n->source(), keyPath(key), kExpected, quote(n->as_string()->get()));
            return false;
        }
        out = *ep;
        return true;
    }

    /// An array of uids or gids.
    bool idList(std::string_view key, std::vector<uint32_t> &out) const {
        static const std::string kExpected = "an array of integers 0-" + std::to_string(kMaxId);
        const toml::node *n = node(key);
        if (n == nullptr) {
            return true;
        }
        const toml::array *arr = n->as_array();
        if (arr == nullptr) {
            c_.add(n->source(), keyPath(key), kExpected, foundTyped(*n));
            return false;
        }
        bool ok = true;
        std::vector<uint32_t> ids;
        for (size_t i = 0; i < arr->size(); ++i) {
            const toml::node &el = *arr->get(i);
            const std::string el_key = keyPath(key) + "[" + std::to_string(i) + "]";
            static const std::string kElement = "an integer 0-" + std::to_string(kMaxId);
            if (!el.is_integer()) {
                c_.add(el.source(), el_key, kElement, foundTyped(el));
                ok = false;
                continue;
            }
            const int64_t v = el.as_integer()->get();
            if (v < 0 || v > kMaxId) {
                c_.add(el.source(), el_key, kElement, std::to_string(v));
                ok = false;
                continue;
            }
            ids.push_back(static_cast<uint32_t>(v));
        }
        if (ok) {
            out = std::move(ids);
        }
        return ok;
    }

private:
    Collector &c_;
    const toml::table &tbl_;
    std::string path_;
};

bool hasNul(std::string_view s) {
    return s.find('\0') != std::string_view::npos;
}

bool isSimpleName(std::string_view s, size_t max_len) {
    // Names that end up in sysfs paths: no '/', and never "." or "..".
    return s != "." && s != ".." && s.size() <= max_len && detail::isValidName(s);
}

constexpr std::array<std::string_view, 4> kNodeKeys = {"name", "listen", "socket",
                                                       "connect_eagerly"};
constexpr std::array<std::string_view, 19> kFabricKeys = {
    "transport",       "transports", "device",        "port",
    "netdev",          "gid_index",  "dscp",          "ecn",
    "pfc_priority",    "trust",      "mtu",           "timeout",
    "retry_cnt",       "rnr_retry",  "min_rnr_timer", "qps_per_peer",
    "tclass_override", "preflight",  "gdr_flush"};
constexpr std::array<std::string_view, 9> kTcpKeys = {
    "connections_per_peer", "chunk_bytes",      "keepalive_ms",     "peer_timeout_ms",
    "connect_timeout_ms",   "reconnect_min_ms", "reconnect_max_ms", "window",
    "tag_threads"};
constexpr std::array<std::string_view, 3> kIpcKeys = {"ring_depth", "poll_mode", "spin_us"};
constexpr std::array<std::string_view, 8> kSecurityKeys = {
    "allowed_uids",      "allowed_gids",   "peer_key_file",        "tcp_integrity",
    "revoke_timeout_ms", "reserved_names", "allow_unlisted_peers", "verify_peer_address"};
constexpr std::array<std::string_view, 3> kReservedNameKeys = {"prefix", "uids", "gids"};
constexpr std::array<std::string_view, 9> kLimitsKeys = {
    "regions",          "registered_bytes",     "in_flight",
    "peer_regions",     "notification_backlog", "sessions_per_uid",
    "sessions_per_pid", "fd_reserve",           "node_registered_bytes"};
constexpr std::array<std::string_view, 1> kMetricsKeys = {"listen"};
constexpr std::array<std::string_view, 3> kPeerKeys = {"name", "address", "key_file"};
constexpr std::array<std::string_view, 13> kDirectoryKeys = {"kind",
                                                             "endpoints",
                                                             "cluster",
                                                             "lease_ttl_ms",
                                                             "advertise",
                                                             "ca_file",
                                                             "cert_file",
                                                             "key_file",
                                                             "username",
                                                             "password_file",
                                                             "request_timeout_ms",
                                                             "reconnect_min_ms",
                                                             "reconnect_max_ms"};
constexpr std::array<std::string_view, 9> kTopKeys = {
    "node", "fabric", "tcp", "ipc", "security", "limits", "metrics", "peers", "directory"};

constexpr std::array<std::pair<std::string_view, TransportKind>, 3> kTransports = {
    {{"auto", TransportKind::kAuto},
     {"verbs", TransportKind::kVerbs},
     {"tcp", TransportKind::kTcp}}};
constexpr std::array<std::pair<std::string_view, TrustMode>, 2> kTrustModes = {
    {{"dscp", TrustMode::kDscp}, {"pcp", TrustMode::kPcp}}};
constexpr std::array<std::pair<std::string_view, TclassOverride>, 2> kTclassOverrides = {
    {{"fail", TclassOverride::kFail}, {"adopt", TclassOverride::kAdopt}}};
constexpr std::array<std::pair<std::string_view, Preflight>, 2> kPreflights = {
    {{"warn", Preflight::kWarn}, {"fail", Preflight::kFail}}};
constexpr std::array<std::pair<std::string_view, GdrFlush>, 3> kGdrFlushes = {
    {{"auto", GdrFlush::kAuto}, {"on", GdrFlush::kOn}, {"off", GdrFlush::kOff}}};
constexpr std::array<std::pair<std::string_view, TcpIntegrity>, 2> kTcpIntegrities = {
    {{"mac", TcpIntegrity::kMac}, {"none", TcpIntegrity::kNone}}};
constexpr std::array<std::pair<std::string_view, DirectoryKind>, 2> kDirectoryKinds = {
    {{"static", DirectoryKind::kStatic}, {"etcd", DirectoryKind::kEtcd}}};
constexpr std::array<std::pair<std::string_view, PollMode>, 4> kPollModes = {
    {{"auto", PollMode::kAuto},
     {"busy", PollMode::kBusy},
     {"adaptive", PollMode::kAdaptive},
     {"event", PollMode::kEvent}}};

const std::string kNameExpected = "a name of 1-63 characters [A-Za-z0-9._-]";
const std::string kPeerKeyName = "security.peer_key_file";

/// Returns whether node.name is valid (the peer cross rules compare against it).
bool readNode(const TableReader &r, NodeConfig &out) {
    const bool name_ok = r.string("name", kNameExpected, detail::isValidName, out.name);
    r.endpoint("listen", out.listen);
    // sun_path holds 108 bytes including the terminating NUL (unix(7)).
    r.string(
        "socket", "an absolute path shorter than 108 bytes",
        [](std::string_view s) {
            return !s.empty() && s[0] == '/' && s.size() < 108 && !hasNul(s);
        },
        out.socket);
    r.boolean("connect_eagerly", out.connect_eagerly);
    return name_ok;
}

/// [fabric] transports = ["verbs", "tcp"]: remote transports by name, best first.
void readTransports(const TableReader &r, FabricConfig &out) {
    static const std::string kExpected =
        "a non-empty array of transport names (\"verbs\", \"tcp\"), each once, best first";
    const toml::node *n = r.node("transports");
    if (n == nullptr) {
        return;
    }
    Collector &c = r.collector();
    if (r.node("transport") != nullptr) {
        c.add(n->source(), r.keyPath("transports"),
              "either [fabric] transport or [fabric] transports, not both", "both set");
        return;
    }
    const toml::array *arr = n->as_array();
    if (arr == nullptr || arr->empty()) {
        c.add(n->source(), r.keyPath("transports"), kExpected,
              arr == nullptr ? foundTyped(*n) : "an empty array");
        return;
    }
    std::vector<std::string> names;
    for (size_t i = 0; i < arr->size(); ++i) {
        const toml::node &el = *arr->get(i);
        const std::string key = r.keyPath("transports") + "[" + std::to_string(i) + "]";
        const std::string *v = el.is_string() ? &el.as_string()->get() : nullptr;
        if (v == nullptr || !isTransportName(*v)) {
            c.add(el.source(), key, "\"verbs\" or \"tcp\"",
                  v == nullptr ? foundTyped(el) : quote(*v));
            return;
        }
        if (std::find(names.begin(), names.end(), *v) != names.end()) {
            c.add(el.source(), key, "a transport not listed before", quote(*v));
            return;
        }
        names.push_back(*v);
    }
    const bool verbs = std::find(names.begin(), names.end(), "verbs") != names.end();
    out.transport = !verbs              ? TransportKind::kTcp
                    : names.size() == 1 ? TransportKind::kVerbs
                                        : TransportKind::kAuto;
    out.transports = std::move(names);
}

void readFabric(const TableReader &r, FabricConfig &out) {
    r.enumeration("transport", kTransports, out.transport);
    readTransports(r, out);
    // The device name becomes a sysfs path component in resolveTransport, hence no '/' or "..".
    r.string(
        "device", "\"auto\" or an RDMA device name of 1-63 characters [A-Za-z0-9._-]",
        [](std::string_view s) { return s == "auto" || isSimpleName(s, 63); }, out.device);
    r.range("port", 1, 255, out.port);
    // IFNAMSIZ is 16 including the NUL.
    r.string(
        "netdev", "\"auto\" or an interface name of 1-15 characters [A-Za-z0-9._-]",
        [](std::string_view s) { return s == "auto" || isSimpleName(s, 15); }, out.netdev);
    r.autoOrRange("gid_index", 0, 255, out.gid_index);
    r.range("dscp", 0, 63, out.dscp);
    r.boolean("ecn", out.ecn);
    r.range("pfc_priority", 0, 7, out.pfc_priority);
    r.enumeration("trust", kTrustModes, out.trust);
    // The IB path MTU enumeration (IBV_MTU_256 .. IBV_MTU_4096) has exactly these values.
    r.integer(
        "mtu", "one of 256, 512, 1024, 2048, 4096",
        [](int64_t v) { return v == 256 || v == 512 || v == 1024 || v == 2048 || v == 4096; },
        out.mtu);
    // Widths of the fields in ibv_qp_attr / the IB spec: timeout and min_rnr_timer are 5 bits,
    // retry_cnt and rnr_retry 3 bits.
    r.range("timeout", 0, 31, out.timeout);
    r.range("retry_cnt", 0, 7, out.retry_cnt);
    r.range("rnr_retry", 0, 7, out.rnr_retry);
    r.range("min_rnr_timer", 0, 31, out.min_rnr_timer);
    r.range("qps_per_peer", 1, 64, out.qps_per_peer);
    r.enumeration("tclass_override", kTclassOverrides, out.tclass_override);
    r.enumeration("preflight", kPreflights, out.preflight);
    r.enumeration("gdr_flush", kGdrFlushes, out.gdr_flush);
}

void readTcp(const TableReader &r, TcpConfig &out) {
    r.range("connections_per_peer", 1, 16, out.connections_per_peer);
    r.range("window", 1, 4096, out.window);
    r.range("chunk_bytes", 4096, 64 << 20, out.chunk_bytes);
    r.range("keepalive_ms", 10, 60000, out.keepalive_ms);
    r.range("peer_timeout_ms", 100, 600000, out.peer_timeout_ms);
    r.range("connect_timeout_ms", 10, 60000, out.connect_timeout_ms);
    r.autoOrRange("tag_threads", 0, 16, out.tag_threads);
    const bool min_ok = r.range("reconnect_min_ms", 1, 60000, out.reconnect_min_ms);
    const bool max_ok = r.range("reconnect_max_ms", 1, 600000, out.reconnect_max_ms);
    if (!min_ok || !max_ok || out.reconnect_max_ms >= out.reconnect_min_ms) {
        return;
    }
    // Point at whichever of the two the file sets, the cap first: it is the one usually wrong.
    if (const toml::node *n = r.node("reconnect_max_ms")) {
        r.collector().add(n->source(), r.keyPath("reconnect_max_ms"),
                          "an integer >= tcp.reconnect_min_ms (" +
                              std::to_string(out.reconnect_min_ms) + ") and <= 600000",
                          std::to_string(out.reconnect_max_ms));
    } else if (const toml::node *m = r.node("reconnect_min_ms")) {
        r.collector().add(
            m->source(), r.keyPath("reconnect_min_ms"),
            "an integer <= tcp.reconnect_max_ms (" + std::to_string(out.reconnect_max_ms) + ")",
            std::to_string(out.reconnect_min_ms));
    }
}

void readIpc(const TableReader &r, IpcConfig &out) {
    // The ring indexes with a mask, so the depth must be a power of two.
    r.integer(
        "ring_depth", "a power of two 16-65536",
        [](int64_t v) { return v >= 16 && v <= 65536 && (v & (v - 1)) == 0; }, out.ring_depth);
    r.enumeration("poll_mode", kPollModes, out.poll_mode);
    r.range("spin_us", 0, 10000, out.spin_us);
}

/// A region name prefix: 1-63 characters of what tl_expose accepts in a name.
bool isNamePrefix(std::string_view s) {
    return !s.empty() && s.size() < 64 && std::all_of(s.begin(), s.end(), [](char ch) {
        return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
               ch == '.' || ch == '_' || ch == '-' || ch == '/' || ch == ':';
    });
}

/// [security] reserved_names = [{ prefix = "kv.", uids = [1000], gids = [] }, ...].
void readReservedNames(const TableReader &r, std::vector<ReservedName> &out) {
    static const std::string kEntry = "a table { prefix = \"...\", uids = [...], gids = [...] }";
    static const std::string kPrefix = "a name prefix of 1-63 characters of [A-Za-z0-9._-/:]";
    const toml::node *n = r.node("reserved_names");
    if (n == nullptr) {
        return;
    }
    Collector &c = r.collector();
    const toml::array *arr = n->as_array();
    if (arr == nullptr) {
        c.add(n->source(), r.keyPath("reserved_names"), "an array of " + kEntry, foundTyped(*n));
        return;
    }
    for (size_t i = 0; i < arr->size(); ++i) {
        const toml::node &el = *arr->get(i);
        const std::string path = r.keyPath("reserved_names") + "[" + std::to_string(i) + "]";
        const toml::table *tbl = el.as_table();
        if (tbl == nullptr) {
            c.add(el.source(), path, kEntry, foundTyped(el));
            continue;
        }
        const TableReader er(c, *tbl, path, "a reserved_names entry", kReservedNameKeys);
        ReservedName entry;
        if (er.node("prefix") == nullptr) {
            c.add(tbl->source(), er.keyPath("prefix"), kPrefix, "no prefix key");
            continue;
        }
        bool ok = er.string("prefix", kPrefix, isNamePrefix, entry.prefix);
        ok = er.idList("uids", entry.uids) && ok;
        ok = er.idList("gids", entry.gids) && ok;
        if (!ok) {
            continue;
        }
        const bool dup = std::any_of(out.begin(), out.end(), [&](const ReservedName &e) {
            return e.prefix == entry.prefix;
        });
        if (dup) {
            c.add(er.node("prefix")->source(), er.keyPath("prefix"),
                  "a prefix no other reserved_names entry has", quote(entry.prefix));
            continue;
        }
        out.push_back(std::move(entry));
    }
}

/// Returns whether peer_key_file is a usable path (the key file check needs one).
bool readSecurity(const TableReader &r, SecurityConfig &out) {
    r.idList("allowed_uids", out.allowed_uids);
    r.idList("allowed_gids", out.allowed_gids);
    readReservedNames(r, out.reserved_names);
    r.enumeration("tcp_integrity", kTcpIntegrities, out.tcp_integrity);
    r.range("revoke_timeout_ms", 10, 600000, out.revoke_timeout_ms);
    r.boolean("allow_unlisted_peers", out.allow_unlisted_peers);
    r.boolean("verify_peer_address", out.verify_peer_address);
    return r.string(
        "peer_key_file", "a non-empty file path",
        [](std::string_view s) { return !s.empty() && !hasNul(s); }, out.peer_key_file);
}

/// "1TiB", "512 MiB", "64k"-style sizes (binary units; B, KiB..PiB, also K/M/G/T/P and KB..PB
/// as binary), or a plain integer of bytes. nullopt for anything else or on overflow.
std::optional<uint64_t> parseBytes(std::string_view text) {
    size_t i = 0;
    uint64_t value = 0;
    if (text.empty() || text[0] < '0' || text[0] > '9') {
        return std::nullopt;
    }
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
        const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
        if (value > (UINT64_MAX - digit) / 10) {
            return std::nullopt;
        }
        value = value * 10 + digit;
    }
    while (i < text.size() && text[i] == ' ') {
        ++i;
    }
    std::string unit;
    for (; i < text.size(); ++i) {
        const char ch = text[i];
        unit += (ch >= 'a' && ch <= 'z') ? static_cast<char>(ch - 'a' + 'A') : ch;
    }
    static constexpr std::array<std::pair<std::string_view, int>, 16> kUnits = {{
        {"", 0},
        {"B", 0},
        {"K", 10},
        {"KB", 10},
        {"KIB", 10},
        {"M", 20},
        {"MB", 20},
        {"MIB", 20},
        {"G", 30},
        {"GB", 30},
        {"GIB", 30},
        {"T", 40},
        {"TB", 40},
        {"TIB", 40},
        {"PIB", 50},
        {"PB", 50},
    }};
    for (const auto &[name, shift] : kUnits) {
        if (unit == name) {
            if (shift > 0 && value > (UINT64_MAX >> shift)) {
                return std::nullopt;
            }
            return value << shift;
        }
    }
    return std::nullopt;
}

/// A size key of [limits]: bytes as an integer or a string with a unit, 4 KiB - 1 PiB; with
/// `allow_auto`, also "auto" (stored as 0).
void readLimitBytes(const TableReader &r, const char *key, bool allow_auto, uint64_t &out) {
    const toml::node *n = r.node(key);
    if (n == nullptr) {
        return;
    }
    const std::string expected =
        std::string("a size 4KiB-1PiB, as bytes or with a unit (\"64GiB\", \"1TiB\")") +
        (allow_auto ? ", or \"auto\"" : "");
    constexpr uint64_t kLo = 4096, kHi = uint64_t{1} << 50;
    std::optional<uint64_t> v;
    std::string found;
    if (n->is_integer()) {
        const int64_t i = n->as_integer()->get();
        found = std::to_string(i);
        if (i > 0) {
            v = static_cast<uint64_t>(i);
        }
    } else if (n->is_string()) {
        found = quote(n->as_string()->get());
        if (allow_auto && n->as_string()->get() == "auto") {
            out = 0;
            return;
        }
        v = parseBytes(n->as_string()->get());
    } else {
        found = foundTyped(*n);
    }
    if (v && *v >= kLo && *v <= kHi) {
        out = *v;
    } else {
        r.collector().add(n->source(), r.keyPath(key), expected, found);
    }
}

void readLimits(const TableReader &r, LimitsConfig &out) {
    r.range("regions", 1, 1 << 20, out.regions);
    r.range("in_flight", 1, 65536, out.in_flight);
    r.range("peer_regions", 1, 1 << 24, out.peer_regions);
    r.range("notification_backlog", 1, 1 << 20, out.notification_backlog);
    r.range("sessions_per_uid", 1, 1 << 20, out.sessions_per_uid);
    r.range("sessions_per_pid", 1, 1 << 20, out.sessions_per_pid);
    r.range("fd_reserve", 0, 65536, out.fd_reserve);
    readLimitBytes(r, "registered_bytes", false, out.registered_bytes);
    readLimitBytes(r, "node_registered_bytes", true, out.node_registered_bytes);
}

void readMetrics(const TableReader &r, MetricsConfig &out) {
    const toml::node *n = r.node("listen");
    if (n != nullptr && n->is_string() && n->as_string()->get().empty()) {
        out.listen.reset();  // "" is the documented "off"
        return;
    }
    Endpoint ep;
    if (n != nullptr && r.endpoint("listen", ep)) {
        out.listen = ep;
    }
}

/// An etcd client URL: "http://host:port" or "https://host:port", no path, query or user.
bool isEtcdUrl(std::string_view url) {
    std::string_view rest;
    if (url.starts_with("http://")) {
        rest = url.substr(7);
    } else if (url.starts_with("https://")) {
        rest = url.substr(8);
    } else {
        return false;
    }
    if (!rest.empty() && rest.back() == '/') {
        rest.remove_suffix(1);
    }
    if (rest.find_first_of("/?#@ ") != std::string_view::npos || hasNul(rest)) {
        return false;
    }
    return detail::parseEndpoint(rest).has_value();
}

/// A file path option of [directory]: non-empty, and the file readable when the files are
/// checked (a wrong path is found by --check-config, not at the first reconnect).
bool directoryFile(const TableReader &r, std::string_view key, bool check, std::string &out) {
    const toml::node *n = r.node(key);
    if (n == nullptr) {
        return true;
    }
    if (!r.string(
            key, "a non-empty file path",
            [](std::string_view s) { return !s.empty() && !hasNul(s); }, out)) {
        return false;
    }
    if (check && ::access(out.c_str(), R_OK) != 0) {
        r.collector().add(
            n->source(), r.keyPath(key), "a readable file",
            quote(out) + ": " + std::error_code(errno, std::generic_category()).message());
        return false;
    }
    return true;
}

/// [directory]. Returns where `kind` sits (for the cross rule with [[peers]]), or nullptr.
const toml::node *readDirectory(const TableReader &r, const ParseOptions &opts,
                                const NodeConfig &node, const toml::table &tbl,
                                DirectoryConfig &out) {
    Collector &c = r.collector();
    r.enumeration("kind", kDirectoryKinds, out.kind);
    if (out.kind == DirectoryKind::kStatic) {
        // Keys of an etcd directory in a static one are a mistake worth saying (a kind left out).
        for (const auto &[k, v] : tbl) {
            if (k.str() != "kind" && std::find(kDirectoryKeys.begin(), kDirectoryKeys.end(),
                                               k.str()) != kDirectoryKeys.end()) {
                c.add(v.source(), r.keyPath(k.str()), "directory.kind = \"etcd\" to use it",
                      "directory.kind = \"static\"");
            }
        }
        return r.node("kind");
    }
    static const std::string kUrls =
        "a non-empty array of etcd client URLs (\"http://host:port\" or \"https://host:port\")";
    if (const toml::node *n = r.node("endpoints")) {
        const toml::array *arr = n->as_array();
        if (arr == nullptr || arr->empty()) {
            c.add(n->source(), r.keyPath("endpoints"), kUrls,
                  arr == nullptr ? foundTyped(*n) : "an empty array");
        } else {
            for (size_t i = 0; i < arr->size(); ++i) {
                const toml::node &el = *arr->get(i);
                const std::string key = r.keyPath("endpoints") + "[" + std::to_string(i) + "]";
                const std::string *v = el.is_string() ? &el.as_string()->get() : nullptr;
                if (v == nullptr || !isEtcdUrl(*v)) {
                    c.add(el.source(), key,
                          "an etcd client URL \"http://host:port\" or \"https://host:port\"",
                          v == nullptr ? foundTyped(el) : quote(*v));
                    continue;
                }
                std::string url = *v;
                if (url.back() == '/') {
                    url.pop_back();
                }
                out.endpoints.push_back(std::move(url));
            }
        }
    } else {
        c.add(tbl.source(), r.keyPath("endpoints"), kUrls, "no endpoints key");
    }
    if (r.node("cluster") == nullptr) {
        c.add(tbl.source(), r.keyPath("cluster"), kNameExpected, "no cluster key");
    } else {
        r.string("cluster", kNameExpected, detail::isValidName, out.cluster);
    }
    r.range("lease_ttl_ms", 2000, 600000, out.lease_ttl_ms);
    r.range("request_timeout_ms", 100, 60000, out.request_timeout_ms);
    const bool min_ok = r.range("reconnect_min_ms", 10, 600000, out.reconnect_min_ms);
    const bool max_ok = r.range("reconnect_max_ms", 10, 600000, out.reconnect_max_ms);
    if (min_ok && max_ok && out.reconnect_max_ms < out.reconnect_min_ms) {
        const toml::node *n =
            r.node("reconnect_max_ms") ? r.node("reconnect_max_ms") : r.node("reconnect_min_ms");
        c.add(n->source(), r.keyPath("reconnect_max_ms"),
              "an integer >= directory.reconnect_min_ms (" + std::to_string(out.reconnect_min_ms) +
                  ")",
              std::to_string(out.reconnect_max_ms));
    }
    Endpoint advertise;
    if (r.node("advertise") != nullptr) {
        if (r.endpoint("advertise", advertise)) {
            if (advertise.host == "0.0.0.0" || advertise.host == "::") {
                c.add(r.node("advertise")->source(), r.keyPath("advertise"),
                      "an address peers can dial, not a wildcard", quote(advertise.text()));
            } else {
                out.advertise = advertise;
            }
        }
    } else if (node.listen.host == "0.0.0.0" || node.listen.host == "::") {
        c.add(tbl.source(), r.keyPath("advertise"),
              "the address peers dial (\"host:port\"), needed because node.listen = " +
                  quote(node.listen.text()) + " is a wildcard",
              "no advertise key");
    }
    const bool check = opts.check_key_file;
    directoryFile(r, "ca_file", check, out.ca_file);
    const bool cert_ok = directoryFile(r, "cert_file", check, out.cert_file);
    const bool key_ok = directoryFile(r, "key_file", check, out.key_file);
    if (cert_ok && key_ok && out.cert_file.empty() != out.key_file.empty()) {
        const char *set = out.cert_file.empty() ? "key_file" : "cert_file";
        const char *unset = out.cert_file.empty() ? "cert_file" : "key_file";
        c.add(r.node(set)->source(), r.keyPath(unset),
              std::string("directory.") + unset + " with directory." + set + " (both or neither)",
              std::string("no ") + unset + " key");
    }
    r.string(
        "username", "a non-empty user name",
        [](std::string_view s) { return !s.empty() && !hasNul(s); }, out.username);
    const bool pw_ok = directoryFile(r, "password_file", check, out.password_file);
    if (pw_ok && out.username.empty() != out.password_file.empty()) {
        const char *set = out.username.empty() ? "password_file" : "username";
        const char *unset = out.username.empty() ? "username" : "password_file";
        c.add(r.node(set)->source(), r.keyPath(unset),
              std::string("directory.") + unset + " with directory." + set + " (both or neither)",
              std::string("no ") + unset + " key");
    }
    const bool https = std::any_of(out.endpoints.begin(), out.endpoints.end(),
                                   [](const std::string &u) { return u.starts_with("https://"); });
    if (!https && (!out.ca_file.empty() || !out.cert_file.empty())) {
        const char *key = !out.ca_file.empty() ? "ca_file" : "cert_file";
        c.add(r.node(key)->source(), r.keyPath(key), "https:// endpoints to use TLS files",
              "only http:// endpoints");
    }
    return r.node("kind");
}

/// Where a peer's values sit in the file, for the cross rules after all peers are read.
struct PeerSource {
    const toml::node *name = nullptr;
    const toml::node *address = nullptr;
    const toml::node *key_file = nullptr;
    bool name_ok = false;
    bool address_ok = false;
    bool key_file_ok = false;
};

void readPeers(Collector &c, const toml::node &n, std::vector<PeerConfig> &out,
               std::vector<PeerSource> &sources) {
    const toml::array *arr = n.as_array();
    if (arr == nullptr) {
        c.add(n.source(), "peers", "an array of tables ([[peers]])", foundTyped(n));
        return;
    }
    for (size_t i = 0; i < arr->size(); ++i) {
        const toml::node &el = *arr->get(i);
        const std::string path = "peers[" + std::to_string(i) + "]";
        PeerConfig peer;
        PeerSource src;
        if (const toml::table *tbl = el.as_table()) {
            const TableReader r(c, *tbl, path, "[[peers]]", kPeerKeys);
            src.name = r.node("name");
            src.address = r.node("address");
            // A peer has no useful default: without both keys it cannot be reached or named.
            if (src.name == nullptr) {
                c.add(tbl->source(), r.keyPath("name"), kNameExpected, "no name key");
            } else {
                src.name_ok = r.string("name", kNameExpected, detail::isValidName, peer.name);
            }
            if (src.address == nullptr) {
                c.add(tbl->source(), r.keyPath("address"),
                      "a \"host:port\" address with a port 1-65535", "no address key");
            } else {
                src.address_ok = r.endpoint("address", peer.address);
            }
            src.key_file = r.node("key_file");
            if (src.key_file != nullptr) {
                src.key_file_ok = r.string(
                    "key_file", "a non-empty file path",
                    [](std::string_view s) { return !s.empty() && !hasNul(s); }, peer.key_file);
            }
        } else {
            c.add(el.source(), path, "a table with name and address", foundTyped(el));
        }
        out.push_back(std::move(peer));
        sources.push_back(src);
    }
}

std::string lowered(std::string_view s) {
    std::string out(s);
    for (char &ch : out) {
        if (ch >= 'A' && ch <= 'Z') {
            ch = static_cast<char>(ch - 'A' + 'a');
        }
    }
    return out;
}

void checkPeers(Collector &c, const Config &cfg, bool node_name_ok,
                const std::vector<PeerSource> &sources) {
    for (size_t i = 0; i < cfg.peers.size(); ++i) {
        const PeerConfig &peer = cfg.peers[i];
        const PeerSource &src = sources[i];
        const std::string path = "peers[" + std::to_string(i) + "]";
        if (src.name_ok) {
            if (node_name_ok && peer.name == cfg.node.name) {
                c.add(src.name->source(), path + ".name",
                      "a name other than this node's (node.name = " + quote(cfg.node.name) + ")",
                      quote(peer.name));
            }
            for (size_t j = 0; j < i; ++j) {
                if (sources[j].name_ok && cfg.peers[j].name == peer.name) {
                    c.add(src.name->source(), path + ".name",
                          "a name not used by another peer (peers[" + std::to_string(j) +
                              "] at line " + std::to_string(sources[j].name->source().begin.line) +
                              ")",
                          quote(peer.name));
                    break;
                }
            }
        }
        if (src.address_ok) {
            // Host names are case-insensitive (RFC 4343); "Node-B:1" and "node-b:1" are one peer.
            const std::string host = lowered(peer.address.host);
            for (size_t j = 0; j < i; ++j) {
                const PeerConfig &other = cfg.peers[j];
                if (sources[j].address_ok && other.address.port == peer.address.port &&
                    lowered(other.address.host) == host) {
                    c.add(src.address->source(), path + ".address",
                          "an address not used by another peer (peers[" + std::to_string(j) +
                              "] at line " +
                              std::to_string(sources[j].address->source().begin.line) + ")",
                          quote(src.address->as_string()->get()));
                    break;
                }
            }
        }
    }
}

void checkKeyFile(Collector &c, const std::string &path, const toml::source_region &where,
                  const std::string &key_name) {
    // The same reader as the peer layer's (key_file.hpp): --check-config and the sidecar's start
    // report a bad key file in the same words, before any peer is contacted.
    static const std::string kExpected =
        "a key file made by `tensorlane keygen FILE` (tensorlane-key-v1, mode 0600)";
    KeyBytes bytes;
    const KeyFileResult r = readKeyFile(path, &bytes);
    if (!r.ok()) {
        c.add(where, key_name, kExpected, quote(path) + ": " + r.detail);
    }
}

/// The tree walk: every check after toml++ has accepted the syntax.
ParseResult validate(const toml::table &root, const std::string &source, const ParseOptions &opts,
                     bool shielded) {
    Collector c(source, shielded);
    Config cfg;
    cfg.source = source;
    const TableReader top(c, root, "", "the file", kTopKeys);

    const auto section = [&](std::string_view name) -> const toml::table * {
        const toml::node *n = root.get(name);
        if (n == nullptr) {
            return nullptr;
        }
        if (!n->is_table()) {
            c.add(n->source(), std::string(name), "a table ([" + std::string(name) + "])",
                  foundTyped(*n));
            return nullptr;
        }
        return n->as_table();
    };

    bool node_name_ok = true;
    if (const toml::table *t = section("node")) {
        node_name_ok = readNode(TableReader(c, *t, "node", "[node]", kNodeKeys), cfg.node);
    }
    if (const toml::table *t = section("fabric")) {
        readFabric(TableReader(c, *t, "fabric", "[fabric]", kFabricKeys), cfg.fabric);
    }
    if (const toml::table *t = section("tcp")) {
        readTcp(TableReader(c, *t, "tcp", "[tcp]", kTcpKeys), cfg.tcp);
    }
    if (const toml::table *t = section("ipc")) {
        readIpc(TableReader(c, *t, "ipc", "[ipc]", kIpcKeys), cfg.ipc);
    }
    bool key_file_ok = true;
    const toml::key *key_file_key = nullptr;
    if (const toml::table *t = section("security")) {
        const TableReader r(c, *t, "security", "[security]", kSecurityKeys);
        key_file_ok = readSecurity(r, cfg.security);
        key_file_key = r.keyOf("peer_key_file");
    }
    if (const toml::table *t = section("limits")) {
        readLimits(TableReader(c, *t, "limits", "[limits]", kLimitsKeys), cfg.limits);
    }
    if (const toml::table *t = section("metrics")) {
        readMetrics(TableReader(c, *t, "metrics", "[metrics]", kMetricsKeys), cfg.metrics);
    }
    std::vector<PeerSource> peer_sources;
    if (const toml::node *n = root.get("peers")) {
        readPeers(c, *n, cfg.peers, peer_sources);
    }

    if (const toml::table *t = section("directory")) {
        const TableReader r(c, *t, "directory", "[directory]", kDirectoryKeys);
        const toml::node *kind = readDirectory(r, opts, cfg.node, *t, cfg.directory);
        if (cfg.directory.kind == DirectoryKind::kEtcd && !cfg.peers.empty()) {
            // One source of peers: a [[peers]] entry next to etcd would be a node nobody else
            // learns of, or one whose etcd entry and file entry disagree.
            c.add(kind != nullptr ? kind->source() : t->source(), "directory.kind",
                  "no [[peers]] entries with directory.kind = \"etcd\" (peers come from etcd)",
                  std::to_string(cfg.peers.size()) + " [[peers]] entries");
        }
    }

    checkPeers(c, cfg, node_name_ok, peer_sources);
    // The key authenticates peers: a node with no [[peers]] neither listens nor connects, so it
    // needs no key file (docs/peers.md).
    // The shared key is needed only when some peer has no key_file of its own (a peer whose
    // key_file is wrong has its own error, not a second one about the shared key).
    // An etcd directory's peers all use the shared key (its fingerprint is what nodes compare).
    const bool shared_key_used =
        cfg.directory.kind == DirectoryKind::kEtcd ||
        std::any_of(peer_sources.begin(), peer_sources.end(),
                    [](const PeerSource &p) { return p.key_file == nullptr; });
    if (opts.check_key_file && key_file_ok && shared_key_used) {
        checkKeyFile(c, cfg.security.peer_key_file,
                     key_file_key != nullptr ? key_file_key->source() : toml::source_region{},
                     kPeerKeyName);
    }
    for (size_t i = 0; opts.check_key_file && i < cfg.peers.size(); ++i) {
        if (peer_sources[i].key_file_ok) {
            checkKeyFile(c, cfg.peers[i].key_file, peer_sources[i].key_file->source(),
                         "peers[" + std::to_string(i) + "].key_file");
        }
    }

    ParseResult result;
    result.errors = std::move(c.errors());
    // File order reads best; position-less errors (the key file) go last.
    std::stable_sort(result.errors.begin(), result.errors.end(),
                     [](const Error &a, const Error &b) {
                         const auto rank = [](const Error &e) {
                             return std::make_tuple(e.line == 0, e.line, e.column);
                         };
                         return rank(a) < rank(b);
                     });
    if (result.errors.empty()) {
        result.config = std::move(cfg);
    }
    return result;
}

/// Puts back the code points shieldToml swapped, in every string value of the tree.
void unshieldStrings(toml::node &n) {
    if (toml::table *t = n.as_table()) {
        for (auto &&[k, v] : *t) {
            (void)k;
            unshieldStrings(v);
        }
    } else if (toml::array *a = n.as_array()) {
        for (toml::node &el : *a) {
            unshieldStrings(el);
        }
    } else if (toml::value<std::string> *s = n.as_string()) {
        s->get() = detail::unshieldToml(s->get());
    }
}

/// toml++ quotes what it saw, newlines included ("saw 'tru\n'"); an Error is one line.
std::string oneLine(std::string_view text) {
    std::string out;
    for (char ch : text) {
        const auto byte = static_cast<unsigned char>(ch);
        if (ch == '\n') {
            out += "\\n";
        } else if (ch == '\r') {
            out += "\\r";
        } else if (ch == '\t') {
            out += "\\t";
        } else if (byte < 0x20 || byte == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", byte);
            out += buf;
        } else {
            out += ch;
        }
    }
    return out;
}

ParseResult singleError(const std::string &file, std::string message, uint32_t line = 0,
                        uint32_t column = 0) {
    ParseResult result;
    Error e;
    e.file = file;
    e.line = line;
    e.column = column;
    e.message = std::move(message);
    result.errors.push_back(std::move(e));
    return result;
}

}  // namespace

ParseResult parseString(std::string_view text, const std::string &source_name,
                        const ParseOptions &opts) {
    // Nothing may escape: the sidecar and the C ABI above this are exception-free.
    try {
        auto shield = detail::shieldToml(text);
        if (const auto *unsafe = std::get_if<detail::UnsafeText>(&shield)) {
            return singleError(source_name, unsafe->message, unsafe->line, unsafe->column);
        }
        const auto &shielded = std::get<detail::ShieldedText>(shield);
        toml::table root;
        try {
            root = toml::parse(shielded.changed ? std::string_view(shielded.text) : text,
                               std::string_view(source_name));
        } catch (const toml::parse_error &e) {
            const toml::source_position &pos = e.source().begin;
            const std::string_view description = e.description();
            return singleError(
                source_name,
                "invalid TOML: " + oneLine(shielded.changed ? detail::unshieldToml(description)
                                                            : std::string(description)),
                pos.line, pos.column);
        }
        if (shielded.changed) {
            unshieldStrings(root);
        }
        return validate(root, source_name, opts, shielded.changed);
    } catch (const std::exception &e) {
        return singleError(source_name, std::string("internal error while parsing: ") + e.what());
    } catch (...) {
        return singleError(source_name, "internal error while parsing");
    }
}

ParseResult parseFile(const std::string &path, const ParseOptions &opts) {
    try {
        // A config file is small; the cap keeps a mistaken path (a disk image, /dev/zero) from
        // eating memory.
        constexpr size_t kMaxBytes = 4u << 20;
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0) {
            return singleError(
                path, "cannot open: " + std::error_code(errno, std::generic_category()).message());
        }
        struct stat st {};
        if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
            ::close(fd);
            return singleError(path, "cannot read: it is a directory");
        }
        std::string text;
        char buf[65536];
        for (;;) {
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n < 0) {
                if (errno == EINTR) {
                    continue;
                }
                const int err = errno;
                ::close(fd);
                return singleError(
                    path,
                    "cannot read: " + std::error_code(err, std::generic_category()).message());
            }
            if (n == 0) {
                break;
            }
            text.append(buf, static_cast<size_t>(n));
            if (text.size() > kMaxBytes) {
                ::close(fd);
                return singleError(path, "cannot read: larger than 4 MiB, not a config file");
            }
        }
        ::close(fd);
        return parseString(text, path, opts);
    } catch (const std::exception &e) {
        return singleError(path, std::string("internal error while reading: ") + e.what());
    } catch (...) {
        return singleError(path, "internal error while reading");
    }
}

}  // namespace tensorlane::config
