// This node's membership in an etcd directory (docs/directory.md), on two threads of its own so
// the engine never waits for etcd:
//   the registrar   grants a lease, puts nodes/<name> under it, keeps it alive (every TTL/3),
//                   grants and puts again when the lease was lost, deletes the key at a clean
//                   stop;
//   the watcher     lists nodes/ and watches it from the listing's revision; every change, and
//                   a fresh listing after each reconnect, is handed to the engine as events.
// Both reconnect with jittered exponential backoff. Events go through a queue and an eventfd
// the engine polls (fd(), take()), never by touching the engine's state.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/etcd_client.hpp"
#include "cluster/node_record.hpp"
#include "tensorlane/config/config.hpp"
#include "tensorlane/ipc/fd.hpp"
#include "tensorlane/sidecar/status.hpp"

namespace tensorlane::sidecar {

/// What the directory told the engine.
struct MembershipEvent {
    enum class Kind {
        kSnapshot,  ///< a full listing (`nodes`, `rejected`): anything not in it is gone
        kPut,       ///< `nodes[0]` registered or changed
        kDelete,    ///< `name`'s key was deleted (a clean stop) or its lease expired
        kRejected,  ///< `name`'s value is not a valid record (`reason`)
        kState,     ///< the directory's reachability changed (`up`, `reason`)
    };
    Kind kind = Kind::kState;
    std::vector<NodeRecord> nodes;
    std::vector<std::pair<std::string, std::string>> rejected;  ///< snapshot: (name, reason)
    std::string name;
    std::string reason;
    bool up = false;
    int64_t revision = 0;
    int64_t at_ms = 0;  ///< steady clock, when the watcher saw it
};

/// The directory's state for status and metrics.
struct MembershipReport {
    std::string state = "connecting";  ///< connecting | up | down | stopped
    std::string endpoint;              ///< the etcd endpoint in use
    std::string last_error;
    bool registered = false;  ///< our key is in etcd under a live lease
    int64_t lease = 0;
    int64_t lease_ttl_s = 0;
    int64_t revision = 0;  ///< the last revision the watch saw
    uint64_t reconnects = 0;
    uint64_t keepalive_failures = 0;
    uint64_t events = 0;
    uint64_t rejected = 0;
    int64_t down_since_ms = 0;  ///< steady clock; 0 while up
};

class Membership {
public:
    /// Starts both threads. `self` is this node's record; `password` etcd auth's (read by the
    /// caller from [directory] password_file).
    static std::unique_ptr<Membership> start(const config::DirectoryConfig &cfg, NodeRecord self,
                                             std::string password, Status *error);
    ~Membership();
    Membership(const Membership &) = delete;
    Membership &operator=(const Membership &) = delete;

    /// Readable while events wait in take().
    int fd() const { return event_fd_.get(); }
    /// The events since the last call, in order.
    std::vector<MembershipEvent> take();
    /// Stops both threads; with `deregister`, deletes our key and revokes the lease first
    /// (bounded by request_timeout_ms). Idempotent.
    void stop(bool deregister);
    MembershipReport report() const;
    /// The key of a node: <prefix>nodes/<name>.
    std::string keyOf(const std::string &name) const { return nodes_prefix_ + name; }

private:
    Membership(const config::DirectoryConfig &cfg, NodeRecord self, std::string password);
    EtcdOptions options() const;
    void registrarLoop();
    void watcherLoop();
    /// Sleeps up to `ms` or until stop; false once stopping.
    bool pause(int64_t ms);
    /// The next backoff delay (jittered in [b/2, b]) and doubles b up to the cap.
    int64_t nextBackoff(int64_t *b) const;
    void emit(MembershipEvent e);
    void setWatchUp(bool up, const std::string &reason);
    NodeRecord parseKv(const EtcdKv &kv, bool *ok, std::string *name, std::string *why) const;

    const config::DirectoryConfig cfg_;
    const NodeRecord self_;
    const std::string value_;
    const std::string password_;
    const std::string nodes_prefix_;
    ipc::UniqueFd event_fd_;

    std::unique_ptr<EtcdClient> registrar_client_;
    std::unique_ptr<EtcdClient> watcher_client_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    bool stopping_ = false;
    bool reput_ = false;  ///< the watcher saw our own key deleted
    std::vector<MembershipEvent> queue_;
    MembershipReport report_;
    bool watch_up_ = false;
    int64_t lease_ = 0;

    std::thread registrar_;
    std::thread watcher_;
};

}  // namespace tensorlane::sidecar
