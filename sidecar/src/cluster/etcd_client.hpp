// A client of etcd's v3 API through its JSON gateway (POST /v3/kv/range and friends), over
// libcurl: the keys and values, leases, and a watch stream, with per-request timeouts, failover
// over the configured endpoints, TLS and etcd's token auth (docs/directory.md says why the
// gateway and not gRPC).
//
// One client belongs to one thread: its calls block (bounded by request_timeout_ms; a watch
// until its stream ends). interrupt() is the one call another thread may make: it ends the
// running call and every later one with kConnection at once, so a stopping sidecar never waits
// for etcd.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// How to reach etcd.
struct EtcdOptions {
    /// "http://host:port" or "https://host:port", tried in turn when one does not answer.
    std::vector<std::string> endpoints;
    /// The longest one unary request (connect included) may take.
    uint32_t request_timeout_ms = 2000;
    /// TLS: CA bundle (empty: the system's), client certificate and key (both or neither).
    std::string ca_file;
    std::string cert_file;
    std::string key_file;
    /// etcd auth: user and password (empty user: none).
    std::string username;
    std::string password;
};

/// One key as etcd returns it.
struct EtcdKv {
    std::string key;
    std::string value;
    int64_t create_revision = 0;
    int64_t mod_revision = 0;
    int64_t version = 0;
    int64_t lease = 0;
};

/// One change a watch reports.
struct EtcdEvent {
    enum class Type { kPut, kDelete };
    Type type = Type::kPut;
    EtcdKv kv;  ///< for a delete: the key and its mod_revision only
};

class EtcdClient {
public:
    /// Fails (kInvalid) without endpoints, or when libcurl cannot be set up.
    static std::unique_ptr<EtcdClient> create(EtcdOptions opts, Status *error);
    ~EtcdClient();
    EtcdClient(const EtcdClient &) = delete;
    EtcdClient &operator=(const EtcdClient &) = delete;

    /// PUT `key` = `value`, attached to `lease` (0: none).
    Status put(const std::string &key, const std::string &value, int64_t lease = 0);
    /// The key, or nullopt when there is none; `revision` gets the store's revision.
    Status get(const std::string &key, std::optional<EtcdKv> *out, int64_t *revision = nullptr);
    /// Every key starting with `prefix`, in key order, and the store's revision they are of.
    Status getPrefix(const std::string &prefix, std::vector<EtcdKv> *out, int64_t *revision);
    /// Deletes `key`; `deleted` gets how many keys went (0 or 1).
    Status remove(const std::string &key, int64_t *deleted = nullptr);
    /// Deletes every key under `prefix`.
    Status removePrefix(const std::string &prefix, int64_t *deleted = nullptr);

    /// A new lease of `ttl_s` seconds; `granted_ttl_s` is what etcd gave (it rounds up to its
    /// minimum).
    Status grantLease(int64_t ttl_s, int64_t *id, int64_t *granted_ttl_s);
    /// One keep-alive of `id`; kNotFound when etcd no longer has the lease (it expired).
    Status keepAlive(int64_t id, int64_t *ttl_s);
    /// Ends the lease now: its keys are deleted.
    Status revokeLease(int64_t id);

    /// Called with each batch of events of a watch, and the revision of its header; returning
    /// false ends the watch (watchPrefix returns ok).
    using WatchHandler = std::function<bool(const std::vector<EtcdEvent> &, int64_t revision)>;
    /// Watches the keys under `prefix` from `start_revision` until the stream ends: an error
    /// (kPeer: etcd went away), kNotFound when `start_revision` was compacted (list again), kOk
    /// when `on_events` said stop. `on_created` runs once etcd confirmed the watch.
    Status watchPrefix(const std::string &prefix, int64_t start_revision,
                       const WatchHandler &on_events, const std::function<void()> &on_created);

    /// Thread-safe: the running call and every later one return kConnection at once.
    void interrupt();
    bool interrupted() const { return interrupted_.load(std::memory_order_acquire); }

    /// The endpoint the last request went to.
    const std::string &endpoint() const { return opts_.endpoints[current_]; }

private:
    explicit EtcdClient(EtcdOptions opts);
    struct Curl;

    /// POSTs `body` to `path` at the current endpoint, failing over to the next ones when it
    /// cannot be reached; the JSON answer in `*reply`. A stream (`sink` set) gets the bytes as
    /// they come instead, with no total timeout.
    Status call(const std::string &path, const std::string &body, std::string *reply,
                const std::function<bool(const char *, size_t)> *sink = nullptr);
    Status callOnce(const std::string &endpoint, const std::string &path, const std::string &body,
                    std::string *reply, const std::function<bool(const char *, size_t)> *sink,
                    bool *unreachable);
    Status authenticate(const std::string &endpoint);
    Status range(const std::string &key, const std::string &range_end, std::vector<EtcdKv> *out,
                 int64_t *revision);

    EtcdOptions opts_;
    std::unique_ptr<Curl> curl_;
    size_t current_ = 0;
    std::string token_;
    std::atomic<bool> interrupted_{false};
};

/// The range end that makes a range request cover every key starting with `prefix` (etcd's
/// "prefix + 1").
std::string etcdPrefixEnd(const std::string &prefix);

}  // namespace tensorlane::sidecar
