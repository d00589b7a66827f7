#include "cluster/membership.hpp"

#include <pthread.h>
#include <sodium.h>

#include <algorithm>
#include <chrono>
#include <fstream>

#include "logging.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::sidecar {

namespace {

int64_t steadyMs() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

spdlog::logger &clusterLog() {
    static const std::shared_ptr<spdlog::logger> logger = sidecarLogger("cluster");
    return *logger;
}

}  // namespace

Membership::Membership(const config::DirectoryConfig &cfg, NodeRecord self, std::string password)
    : cfg_(cfg),
      self_(std::move(self)),
      value_(encodeNodeRecord(self_)),
      password_(std::move(password)),
      nodes_prefix_(cfg.prefix() + "nodes/") {}

Membership::~Membership() {
    stop(false);
}

EtcdOptions Membership::options() const {
    EtcdOptions o;
    o.endpoints = cfg_.endpoints;
    o.request_timeout_ms = cfg_.request_timeout_ms;
    o.ca_file = cfg_.ca_file;
    o.cert_file = cfg_.cert_file;
    o.key_file = cfg_.key_file;
    o.username = cfg_.username;
    o.password = password_;
    return o;
}

std::unique_ptr<Membership> Membership::start(const config::DirectoryConfig &cfg, NodeRecord self,
                                              std::string password, Status *error) {
    std::unique_ptr<Membership> m(new Membership(cfg, std::move(self), std::move(password)));
    if (int rc = ipc::makeEventFd(&m->event_fd_); rc != 0) {
        *error = {Code::kInternal, "eventfd: " + std::to_string(rc)};
        return nullptr;
    }
    m->registrar_client_ = EtcdClient::create(m->options(), error);
    m->watcher_client_ = m->registrar_client_ ? EtcdClient::create(m->options(), error) : nullptr;
    if (!m->watcher_client_) {
        return nullptr;
    }
    m->report_.endpoint = cfg.endpoints.front();
    m->report_.down_since_ms = steadyMs();
    clusterLog().info("directory: etcd at {}, cluster '{}', this node at {} (lease TTL {} ms)",
                      cfg.endpoints.front(), cfg.cluster, m->keyOf(m->self_.name),
                      cfg.lease_ttl_ms);
    m->registrar_ = std::thread([p = m.get()] {
        pthread_setname_np(pthread_self(), "tl-etcd-lease");
        p->registrarLoop();
    });
    m->watcher_ = std::thread([p = m.get()] {
        pthread_setname_np(pthread_self(), "tl-etcd-watch");
        p->watcherLoop();
    });
    return m;
}

void Membership::stop(bool deregister) {
    {
        std::lock_guard lock(mu_);
        if (stopping_) {
            return;
        }
        stopping_ = true;
        // SYNC POINT: the watcher swaps its client under mu_ (after checking stopping_), so the
        // one interrupted here is the one it uses.
        if (registrar_client_) {
            registrar_client_->interrupt();
        }
        if (watcher_client_) {
            watcher_client_->interrupt();
        }
    }
    cv_.notify_all();
    if (registrar_.joinable()) {
        registrar_.join();
    }
    if (watcher_.joinable()) {
        watcher_.join();
    }
    if (deregister) {
        // A fresh client: the threads' ones are interrupted. Deleting the key tells the peers at
        // once; revoking the lease frees it in etcd (and deletes the key too, if the first went
        // missing).
        Status st;
        auto c = EtcdClient::create(options(), &st);
        if (c) {
            int64_t deleted = 0;
            st = c->remove(keyOf(self_.name), &deleted);
            if (st.isOk() && lease_ != 0) {
                st = c->revokeLease(lease_);
            }
        }
        if (st.isOk()) {
            clusterLog().info("directory: {} deleted (clean stop)", keyOf(self_.name));
        } else {
            clusterLog().warn(
                "directory: could not delete {} at stop ({}); it goes when its lease "
                "expires",
                keyOf(self_.name), st.message());
        }
    }
    std::lock_guard lock(mu_);
    report_.state = "stopped";
    report_.registered = false;
}

std::vector<MembershipEvent> Membership::take() {
    ipc::drain(event_fd_.get());
    std::lock_guard lock(mu_);
    return std::exchange(queue_, {});
}

MembershipReport Membership::report() const {
    std::lock_guard lock(mu_);
    return report_;
}

void Membership::emit(MembershipEvent e) {
    {
        std::lock_guard lock(mu_);
        ++report_.events;
        queue_.push_back(std::move(e));
    }
    ipc::ring(event_fd_.get());
}

bool Membership::pause(int64_t ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(ms), [this] { return stopping_ || reput_; });
    return !stopping_;
}

int64_t Membership::nextBackoff(int64_t *b) const {
    const int64_t cur = *b;
    *b = std::min<int64_t>(cur * 2, cfg_.reconnect_max_ms);
    return cur / 2 + static_cast<int64_t>(randombytes_uniform(static_cast<uint32_t>(cur / 2 + 1)));
}

void Membership::setWatchUp(bool up, const std::string &reason) {
    bool changed = false;
    {
        std::lock_guard lock(mu_);
        changed = watch_up_ != up;
        watch_up_ = up;
        report_.endpoint = watcher_client_->endpoint();
        if (up) {
            report_.state = "up";
            report_.down_since_ms = 0;
        } else {
            if (report_.state == "up") {
                ++report_.reconnects;
            }
            if (report_.down_since_ms == 0) {
                report_.down_since_ms = steadyMs();
            }
            report_.state = "down";
            report_.last_error = reason;
        }
    }
    if (changed) {
        if (up) {
            clusterLog().info("directory: etcd at {} is up", watcher_client_->endpoint());
        } else {
            clusterLog().warn(
                "directory: etcd is down ({}); peers learned before go on, "
                "reconnecting with backoff",
                reason);
        }
        MembershipEvent e;
        e.kind = MembershipEvent::Kind::kState;
        e.up = up;
        e.reason = reason;
        e.at_ms = steadyMs();
        emit(std::move(e));
    }
}

void Membership::registrarLoop() {
    const int64_t ttl_s = (cfg_.lease_ttl_ms + 999) / 1000;
    const std::string key = keyOf(self_.name);
    int64_t backoff = cfg_.reconnect_min_ms;
    int64_t lease = 0;
    int64_t granted = 0;
    bool put_done = false;
    const auto fail = [&](const Status &s) {
        {
            std::lock_guard lock(mu_);
            report_.last_error = s.message();
            ++report_.keepalive_failures;
        }
        clusterLog().warn("directory: registering {}: {}", key, s.message());
    };
    while (!registrar_client_->interrupted()) {
        if (lease == 0) {
            Status s = registrar_client_->grantLease(ttl_s, &lease, &granted);
            if (!s.isOk()) {
                if (s.code() != Code::kConnection) {
                    fail(s);
                }
                lease = 0;
                if (!pause(nextBackoff(&backoff))) {
                    break;
                }
                continue;
            }
            put_done = false;
            std::lock_guard lock(mu_);
            lease_ = lease;
            report_.lease = lease;
            report_.lease_ttl_s = granted;
        }
        bool reput = false;
        {
            std::lock_guard lock(mu_);
            reput = std::exchange(reput_, false);
        }
        if (!put_done || reput) {
            Status s = registrar_client_->put(key, value_, lease);
            if (!s.isOk()) {
                if (s.code() != Code::kConnection) {
                    fail(s);
                }
                if (s.code() == Code::kNotFound) {
                    lease = 0;  // the lease expired meanwhile
                }
                if (!pause(nextBackoff(&backoff))) {
                    break;
                }
                continue;
            }
            put_done = true;
            backoff = cfg_.reconnect_min_ms;
            {
                std::lock_guard lock(mu_);
                report_.registered = true;
            }
            clusterLog().info("directory: registered {} (lease {:x}, TTL {} s)", key, lease,
                              granted);
        }
        // Three keep-alives per TTL: one lost request (a timeout) still leaves two.
        if (!pause(std::max<int64_t>(200, granted * 1000 / 3))) {
            break;
        }
        int64_t left = 0;
        Status s = registrar_client_->keepAlive(lease, &left);
        if (s.code() == Code::kConnection) {
            break;
        }
        if (s.code() == Code::kNotFound) {
            clusterLog().warn(
                "directory: the lease of {} expired (etcd was out of reach longer "
                "than its TTL): registering again",
                key);
            std::lock_guard lock(mu_);
            report_.registered = false;
            lease = 0;
            continue;
        }
        if (!s.isOk()) {
            fail(s);
            // etcd does not answer: the watch may hang on a half-open connection; end it so
            // the watcher lists again once etcd is back.
            std::lock_guard lock(mu_);
            watcher_client_->interrupt();
        }
    }
}

NodeRecord Membership::parseKv(const EtcdKv &kv, bool *ok, std::string *name,
                               std::string *why) const {
    NodeRecord r;
    *name = kv.key.substr(nodes_prefix_.size());
    *ok = decodeNodeRecord(*name, kv.value, &r, why);
    r.mod_revision = kv.mod_revision;
    r.lease = kv.lease;
    return r;
}

void Membership::watcherLoop() {
    int64_t backoff = cfg_.reconnect_min_ms;
    while (true) {
        {
            std::lock_guard lock(mu_);
            if (stopping_) {
                break;
            }
        }
        // An interrupt from the registrar (etcd hung) ends one watch, not the watcher.
        if (watcher_client_->interrupted()) {
            auto fresh = EtcdClient::create(options(), nullptr);
            std::lock_guard lock(mu_);
            if (stopping_ || !fresh) {
                break;
            }
            watcher_client_ = std::move(fresh);
        }
        std::vector<EtcdKv> kvs;
        int64_t revision = 0;
        Status s = watcher_client_->getPrefix(nodes_prefix_, &kvs, &revision);
        if (s.isOk()) {
            MembershipEvent snap;
            snap.kind = MembershipEvent::Kind::kSnapshot;
            snap.revision = revision;
            snap.at_ms = steadyMs();
            for (const EtcdKv &kv : kvs) {
                bool ok = false;
                std::string name;
                std::string why;
                NodeRecord r = parseKv(kv, &ok, &name, &why);
                if (name == self_.name) {
                    continue;
                }
                if (ok) {
                    snap.nodes.push_back(std::move(r));
                } else {
                    snap.rejected.emplace_back(name, why);
                }
            }
            {
                std::lock_guard lock(mu_);
                report_.revision = revision;
                report_.rejected += snap.rejected.size();
            }
            emit(std::move(snap));
            const auto on_events = [this](const std::vector<EtcdEvent> &evs, int64_t rev) {
                for (const EtcdEvent &ev : evs) {
                    MembershipEvent e;
                    e.revision = ev.kv.mod_revision;
                    e.at_ms = steadyMs();
                    e.name = ev.kv.key.substr(nodes_prefix_.size());
                    if (e.name == self_.name) {
                        if (ev.type == EtcdEvent::Type::kDelete) {
                            // Someone deleted our key (etcdctl del): put it back.
                            std::lock_guard lock(mu_);
                            reput_ = true;
                            cv_.notify_all();
                        }
                        continue;
                    }
                    if (ev.type == EtcdEvent::Type::kDelete) {
                        e.kind = MembershipEvent::Kind::kDelete;
                    } else {
                        bool ok = false;
                        std::string why;
                        NodeRecord r = parseKv(ev.kv, &ok, &e.name, &why);
                        if (ok) {
                            e.kind = MembershipEvent::Kind::kPut;
                            e.nodes.push_back(std::move(r));
                        } else {
                            e.kind = MembershipEvent::Kind::kRejected;
                            e.reason = why;
                            std::lock_guard lock(mu_);
                            ++report_.rejected;
                        }
                    }
                    emit(std::move(e));
                }
                std::lock_guard lock(mu_);
                report_.revision = rev;
                return true;
            };
            s = watcher_client_->watchPrefix(nodes_prefix_, revision + 1, on_events, [&] {
                backoff = cfg_.reconnect_min_ms;
                setWatchUp(true, "");
            });
        }
        {
            std::lock_guard lock(mu_);
            if (stopping_) {
                break;
            }
        }
        if (s.code() == Code::kConnection) {
            s = {Code::kPeer, "etcd stopped answering keep-alives"};
        }
        setWatchUp(false, s.message());
        if (!pause(nextBackoff(&backoff))) {
            break;
        }
    }
}

}  // namespace tensorlane::sidecar
