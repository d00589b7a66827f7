#include "net.hpp"

#include <sched.h>
#include <sys/random.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

namespace tensorlane::nccl {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a comm waits with nothing from its peer before it probes the peer's mailbox, and
/// how often a connect() that found no listener yet tries again.
constexpr auto kProbeAfter = std::chrono::milliseconds(500);
constexpr auto kConnectRetry = std::chrono::milliseconds(20);
constexpr size_t kMailboxBytes = 4096;
/// How long a send bigger than an eager slot waits for its CTS before it asks with RTS.
constexpr auto kRtsAfter = std::chrono::milliseconds(2);
/// Shadow copies from this size on are spread over the copy pool (NCCL's Simple steps are
/// 512 KiB; its LL and LL128 ones, and the eager slots, are at most 64 KiB).
constexpr size_t kSplitCopyBytes = 256 << 10;

uint64_t nanosSince(Clock::time_point from, Clock::time_point to) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

/// The mean of a comm's timed sends or entries, in microseconds (0 with none).
double meanMicros(const Comm::Counts &k) {
    return k.timed == 0 ? 0.0
                        : static_cast<double>(k.timed_ns) / 1e3 / static_cast<double>(k.timed);
}

uint64_t randomNonce() {
    uint64_t n = 0;
    while (n == 0) {
        if (::getrandom(&n, sizeof(n), 0) != static_cast<ssize_t>(sizeof(n))) {
            n = static_cast<uint64_t>(::getpid()) << 32 ^
                static_cast<uint64_t>(Clock::now().time_since_epoch().count());
        }
    }
    return n;
}

/// Ring slot states of a receive comm's eager ring.
constexpr uint8_t kEagerEmpty = 0;  ///< nothing in it (or not yet arrived)
constexpr uint8_t kEagerHeld = 1;   ///< an eager send's bytes, not yet copied out
constexpr uint8_t kEagerFreed = 2;  ///< copied out, not yet counted as a credit

/// a before b in a wrapping sequence of 32-bit numbers.
bool seqBefore(uint32_t a, uint32_t b) {
    return static_cast<int32_t>(a - b) < 0;
}

/// An unsigned environment variable within [lo, hi], else `fallback`.
uint32_t envNumber(const char *name, uint32_t fallback, uint32_t lo, uint32_t hi) {
    const char *v = std::getenv(name);
    if (v == nullptr || *v == '\0') {
        return fallback;
    }
    char *end = nullptr;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*end != '\0' || n < lo || n > hi) {
        std::fprintf(stderr, "NET/tensorlane : %s=%s is not a number in [%u, %u]; using %u\n", name,
                     v, lo, hi, fallback);
        return fallback;
    }
    return static_cast<uint32_t>(n);
}

/// The copy helpers a process gets by default: 2, but none where it may run on fewer than 4
/// CPUs and 1 below 8 (there they would take CPU time from the sidecar and NCCL's own threads:
/// on a 2-CPU machine the stream of nccl_plugin_bench measured 0.6-0.73x of tl_write's with 2
/// helpers against 0.76-0.82x with none).
uint32_t defaultCopyThreads() {
    cpu_set_t set;
    CPU_ZERO(&set);
    const int cpus = ::sched_getaffinity(0, sizeof(set), &set) == 0
                         ? CPU_COUNT(&set)
                         : static_cast<int>(std::thread::hardware_concurrency());
    return cpus >= 8 ? 2 : cpus >= 4 ? 1 : 0;
}

/// A status of a write that says the other end is gone (its region, process or sidecar).
bool peerGone(tl_status s) {
    return s == TL_ENOENT || s == TL_EPEER || s == TL_ECONN || s == TL_EDEADLINE;
}

/// The sidecar's status JSON ("" when it cannot be read).
std::string sidecarStatus(tl_client *c) {
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    for (int i = 0; i < 2; ++i) {
        if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
            return {};
        }
        if (len < buf.size()) {
            buf.resize(len);
            return buf;
        }
        buf.assign(len + 1, '\0');
    }
    return {};
}

/// The device's speed for NCCL's tuner, in Mb/s: TENSORLANE_NCCL_SPEED_MBPS, else the
/// sidecar's link rate (the verbs port's, `link_mbps` in its status), else 10 Gb/s (what NCCL's
/// Socket transport assumes when it cannot read a speed; the tcp transport has no port rate).
int linkSpeed(const std::string &status) {
    if (const char *env = std::getenv("TENSORLANE_NCCL_SPEED_MBPS")) {
        char *end = nullptr;
        const long v = std::strtol(env, &end, 10);
        if (end != env && *end == '\0' && v > 0 && v <= 100'000'000) {
            return static_cast<int>(v);
        }
    }
    const char *key = std::strstr(status.c_str(), "\"link_mbps\":");
    if (key == nullptr) {
        return 10000;
    }
    const unsigned long long v = std::strtoull(key + std::strlen("\"link_mbps\":"), nullptr, 10);
    return v > 0 && v <= 100'000'000 ? static_cast<int>(v) : 10000;
}

/// Whether `path`'s last component is a PCI address ("0000:03:00.0").
bool endsInPciAddress(const std::string &path) {
    const size_t at = path.rfind('/');
    const std::string last = at == std::string::npos ? path : path.substr(at + 1);
    if (last.size() != 12 || last[4] != ':' || last[7] != ':' || last[10] != '.') {
        return false;
    }
    for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9, 11}) {
        if (std::isxdigit(static_cast<unsigned char>(last[i])) == 0) {
            return false;
        }
    }
    return true;
}

/// The NIC's PCI function for NCCL's topology (`pciPath`): TENSORLANE_NCCL_PCI_PATH (empty:
/// none), else the sidecar's verbs NIC (`nic_pci_path` in its status); kept only where this
/// process sees it in its own /sys (a container may not) and it ends in a PCI address, since
/// NCCL reads the path to place the NIC. Empty: NCCL puts the device at system distance and
/// stages GPU data through host memory.
std::string nicPciPath(const std::string &status) {
    std::string path;
    if (const char *env = std::getenv("TENSORLANE_NCCL_PCI_PATH")) {
        path = env;
    } else {
        const std::string key = "\"nic_pci_path\":";
        size_t from = status.find(key);
        if (from == std::string::npos) {
            return {};
        }
        from += key.size();
        while (from < status.size() && std::isspace(static_cast<unsigned char>(status[from]))) {
            ++from;
        }
        if (from >= status.size() || status[from] != '"') {
            return {};
        }
        ++from;
        const size_t to = status.find('"', from);
        if (to == std::string::npos) {
            return {};
        }
        path = status.substr(from, to - from);
        if (path.find('\\') != std::string::npos) {
            return {};  // (an escaped character: no sysfs path of a PCI function has one)
        }
    }
    if (path.empty()) {
        return {};
    }
    char real[PATH_MAX];
    if (::realpath(path.c_str(), real) == nullptr || !endsInPciAddress(real)) {
        return {};
    }
    return real;
}

}  // namespace

std::string regionName(uint64_t nonce, char kind, uint64_t id) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "ncl.%016llx.%c%llu", static_cast<unsigned long long>(nonce),
                  kind, static_cast<unsigned long long>(id));
    return buf;
}

Net::Guard::Guard(Net &net, const char *site) : net_(net) {
    net_.lock_waiters_.fetch_add(1, std::memory_order_relaxed);
    net_.mu_.lock();
    net_.lock_waiters_.fetch_sub(1, std::memory_order_relaxed);
    net_.lock_site_.store(site, std::memory_order_relaxed);
    net_.lock_since_ns_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
}

Net::Guard::~Guard() {
    std::vector<tl_region> doomed;
    doomed.swap(net_.doomed_);
    net_.held_ns_ += static_cast<uint64_t>(Clock::now().time_since_epoch().count() -
                                           net_.lock_since_ns_.load(std::memory_order_relaxed));
    ++net_.held_calls_;
    net_.lock_site_.store(nullptr, std::memory_order_relaxed);
    net_.mu_.unlock();
    // Outside the lock: deregistering a pinned host buffer waits for this process's GPU work
    // (cuMemHostUnregister), and NCCL kernels still running on other comms need their proxies'
    // calls to get through. (NCCL closes one comm while another's collective is in flight;
    // without MPS such a collective takes milliseconds, and this wait was a deadlock.)
    for (tl_region r : doomed) {
        tl_deregister(net_.client_, r);
    }
}

void Net::watchdog() {
    // Lock-free reads only: a watchdog that took mu_ would hang with what it watches.
    for (;;) {
        std::this_thread::sleep_for(std::chrono::seconds(1));
        const char *site = lock_site_.load(std::memory_order_relaxed);
        const int64_t since = lock_since_ns_.load(std::memory_order_relaxed);
        const double held =
            static_cast<double>(Clock::now().time_since_epoch().count() - since) / 1e9;
        if (site != nullptr && held > 2.0) {
            log(NCCL_LOG_INFO, "trace: the plugin's lock is held by %s for %.1f s, %d waiting",
                site, held, lock_waiters_.load(std::memory_order_relaxed));
        }
    }
}

Net &Net::get() {
    // Leaked: NCCL may call in from its threads until the process exits.
    static Net *net = new Net();
    return *net;
}

void Net::log(ncclDebugLogLevel level, const char *fmt, ...) const {
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (logger_ != nullptr) {
        logger_(level, NCCL_LOG_SUBSYS_NET | NCCL_LOG_SUBSYS_INIT, __FILE__, __LINE__,
                "NET/tensorlane : %s", text);
    } else if (level == NCCL_LOG_WARN) {
        std::fprintf(stderr, "NET/tensorlane : %s\n", text);
    }
}

void Net::trace(const char *fmt, ...) const {
    va_list ap;
    va_start(ap, fmt);
    if (trace_lines_ != nullptr) {
        trace_lines_->add(fmt, ap);
    } else {
        char text[1024];
        std::vsnprintf(text, sizeof(text), fmt, ap);
        log(NCCL_LOG_INFO, "trace: %s", text);
    }
    va_end(ap);
}

ncclResult_t Net::init(ncclDebugLogger_t logger) {
    Guard lock(*this, __func__);
    logger_ = logger;
    if (client_ != nullptr) {
        return ncclSuccess;
    }
    // TENSORLANE_SOCKET, else the default path: the shim's rule.
    tl_client *c = nullptr;
    if (tl_status s = tl_connect(nullptr, &c); s != TL_OK) {
        const char *path = std::getenv("TENSORLANE_SOCKET");
        log(NCCL_LOG_WARN,
            "cannot reach the tensorlane sidecar at %s: %s (%s); set "
            "TENSORLANE_SOCKET to its socket, or start it",
            path ? path : "/run/tensorlane/sidecar.sock", tl_status_str(s), tl_last_error());
        return ncclSystemError;
    }
    client_ = c;
    init_time_ = Clock::now();
    node_ = tl_node_name(c);
    nonce_ = randomNonce();
    const std::string status = sidecarStatus(c);
    speed_mbps_ = linkSpeed(status);
    pci_path_ = nicPciPath(status);
    const char *trace = std::getenv("TENSORLANE_NCCL_TRACE");
    trace_ = trace != nullptr && std::strcmp(trace, "1") == 0;
    const char *trace_file = std::getenv("TENSORLANE_NCCL_TRACE_FILE");
    if (trace_file != nullptr && *trace_file != '\0' && trace_lines_ == nullptr) {
        trace_ = true;
        trace_lines_ = new ipc::TraceLines(trace_file);
        // The library stays mapped (-z nodelete), so this runs at exit even after NCCL closed it.
        std::atexit([] { Net::get().trace_lines_->write("NET/tensorlane"); });
        // Whose sidecar's trace to join (tests/nccl/trace_steps.py).
        this->trace("plugin node %s", node_.c_str());
    }
    eager_bytes_ = envNumber("TENSORLANE_NCCL_EAGER_BYTES", 64 << 10, 0, 4 << 20);
    eager_slots_ = envNumber("TENSORLANE_NCCL_EAGER_SLOTS", 16, 1, 256);
    const char *prefer = std::getenv("TENSORLANE_NCCL_EAGER_PREFER");
    eager_prefer_ = prefer != nullptr && std::strcmp(prefer, "1") == 0;
    host_direct_ = envNumber("TENSORLANE_NCCL_HOST_DIRECT", 1, 0, 1) != 0;
    // Helpers that take parts of the shadow copies (0: NCCL's proxy thread copies alone).
    pool_ = std::make_unique<CopyPool>(
        envNumber("TENSORLANE_NCCL_COPY_THREADS", defaultCopyThreads(), 0, 16), kSplitCopyBytes,
        64 << 10);
    if (trace_) {
        std::thread([this] { watchdog(); }).detach();
    }
    log(NCCL_LOG_INFO,
        "using the sidecar of node %s (process nonce %016llx), speed %d Mb/s, NIC at %s, eager "
        "ring %u x %u bytes, %u copy helpers",
        node_.c_str(), static_cast<unsigned long long>(nonce_), speed_mbps_,
        pci_path_.empty() ? "no PCI path" : pci_path_.c_str(), eager_bytes_ == 0 ? 0 : eager_slots_,
        eager_bytes_, pool_->threads());
    return ncclSuccess;
}

ncclResult_t Net::properties(int dev, ncclNetProperties_v8_t *p) {
    if (dev != 0 || p == nullptr) {
        return ncclInvalidArgument;
    }
    Guard lock(*this, __func__);
    static std::string name;
    name = "tensorlane-" + node_;
    std::memset(p, 0, sizeof(*p));
    p->name = name.data();
    p->pciPath = pci_path_.empty() ? nullptr : pci_path_.data();
    uint64_t guid = 1469598103934665603ull;  // FNV-1a of the node name: one NIC per sidecar
    for (unsigned char ch : node_) {
        guid = (guid ^ ch) * 1099511628211ull;
    }
    p->guid = guid;
    // TENSORLANE_NCCL_GDR=0: host memory only, so NCCL stages GPU data through its own host
    // buffers (a measure of the GPU path's cost, or a way round a sidecar without CUDA).
    const char *gdr = std::getenv("TENSORLANE_NCCL_GDR");
    const bool host_only = gdr != nullptr && std::strcmp(gdr, "0") == 0;
    p->ptrSupport = host_only ? NCCL_PTR_HOST : NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF;
    p->regIsGlobal = 0;
    p->speed = speed_mbps_;
    p->port = 1;
    p->latency = 0;
    p->maxComms = 1 << 16;
    p->maxRecvs = kMaxRecvs;
    p->netDeviceType = NCCL_NET_DEVICE_HOST;
    p->netDeviceVersion = 0;
    return ncclSuccess;
}

Comm *Net::newComm(char kind) {
    auto *c = new Comm();
    c->kind = kind;
    c->id = next_id_++;
    c->requests.resize(NCCL_NET_MAX_REQUESTS);
    for (size_t i = 0; i < c->requests.size(); ++i) {
        c->requests[i].comm = c;
        c->requests[i].slot = static_cast<uint32_t>(i);
        c->requests[i].send = kind == 'S';
    }
    comms_[c->id] = c;
    return c;
}

ncclResult_t Net::exposeMailbox(Comm *c) {
    const std::string name = regionName(nonce_, c->kind, c->id);
    if (tl_alloc_host(client_, kMailboxBytes, &c->mailbox_ptr, &c->mailbox) != TL_OK ||
        tl_expose(client_, c->mailbox, name.c_str()) != TL_OK) {
        log(NCCL_LOG_WARN, "cannot expose the mailbox %s: %s", name.c_str(), tl_last_error());
        return ncclSystemError;
    }
    return ncclSuccess;
}

void Net::release(Comm *c) {
    if (c->kind == 'S' && c->connected) {
        log(NCCL_LOG_INFO,
            "send comm %llu to %s closed: %llu sends eager, %llu into a CTS, %llu RTS, %llu "
            "CTS crossed by an eager send; %llu sends waited %.3f ms in all; copied %.1f MiB "
            "in %.3f ms; %llu writes of 128 KiB and more took %.1f us on average from tl_write "
            "to their end",
            static_cast<unsigned long long>(c->id), c->peer_node.c_str(),
            static_cast<unsigned long long>(c->counts.eager),
            static_cast<unsigned long long>(c->counts.direct),
            static_cast<unsigned long long>(c->counts.rts),
            static_cast<unsigned long long>(c->counts.crossed),
            static_cast<unsigned long long>(c->counts.waited),
            static_cast<double>(c->counts.wait_ns) / 1e6,
            static_cast<double>(c->counts.copy_bytes) / (1 << 20),
            static_cast<double>(c->counts.copy_ns) / 1e6,
            static_cast<unsigned long long>(c->counts.timed), meanMicros(c->counts));
    } else if (c->kind == 'R') {
        log(NCCL_LOG_INFO,
            "recv comm %llu from %s closed: %llu eager messages (%llu kept for a later receive, "
            "%llu crossing a CTS, %llu copied into GPU memory), %llu entries sent a CTS (%llu "
            "on an RTS); copied %.1f MiB in %.3f ms; %llu entries of 128 KiB and more landed "
            "%.1f us on average after their CTS",
            static_cast<unsigned long long>(c->id), c->peer_node.c_str(),
            static_cast<unsigned long long>(c->counts.eager),
            static_cast<unsigned long long>(c->counts.kept),
            static_cast<unsigned long long>(c->counts.crossed),
            static_cast<unsigned long long>(c->counts.gpu_copies),
            static_cast<unsigned long long>(c->counts.direct),
            static_cast<unsigned long long>(c->counts.rts),
            static_cast<double>(c->counts.copy_bytes) / (1 << 20),
            static_cast<double>(c->counts.copy_ns) / 1e6,
            static_cast<unsigned long long>(c->counts.timed), meanMicros(c->counts));
    }
    if (c->kind != 'L') {
        // Where NCCL's proxy thread goes: the plugin's calls hold the lock for all their work.
        log(NCCL_LOG_INFO,
            "process totals: the plugin's lock held %.3f ms in %llu calls over %.3f s since init; "
            "copy helpers took %llu parts; host buffers registered in place %llu, shadowed %llu",
            static_cast<double>(held_ns_) / 1e6, static_cast<unsigned long long>(held_calls_),
            std::chrono::duration<double>(Clock::now() - init_time_).count(),
            static_cast<unsigned long long>(pool_ ? pool_->helperParts() : 0),
            static_cast<unsigned long long>(host_direct_mrs_),
            static_cast<unsigned long long>(host_shadow_mrs_));
    }
    if (c->probe != 0) {
        unwaited_.push_back({c->probe, 0});
    }
    for (const Request &r : c->requests) {
        if (!r.free && r.send) {
            unwaited_.push_back({r.ticket, 0});  // closed with the send in flight
        }
    }
    for (auto &[id, mr] : c->mrs) {
        recv_regions_.erase(mr->region);
        doomed_.push_back(mr->region);
    }
    if (c->mailbox != 0) {
        doomed_.push_back(c->mailbox);
    }
    if (c->eager_region != 0) {
        doomed_.push_back(c->eager_region);  // (a local copy from it still running just fails)
    }
    comms_.erase(c->id);
    delete c;
}

ncclResult_t Net::fail(Comm *c, const std::string &why) {
    if (c->error.empty()) {
        c->error = why;
        log(NCCL_LOG_WARN, "%s comm %llu to %s failed: %s", c->kind == 'S' ? "send" : "recv",
            static_cast<unsigned long long>(c->id), c->peer_node.c_str(), why.c_str());
    }
    return ncclRemoteError;
}

tl_status Net::postMessage(const Comm *c, Wire type, uint8_t count, uint64_t to_comm,
                           const void *body, size_t bytes, tl_remote to, tl_ticket *t) {
    unsigned char payload[TL_MAX_PAYLOAD];
    const WireHeader h{kWireMagic, static_cast<uint8_t>(type), count, 0, to_comm, c->id, nonce_};
    std::memcpy(payload, &h, sizeof(h));
    if (bytes != 0) {
        std::memcpy(payload + sizeof(h), body, bytes);  // (body may be null when bytes is 0)
    }
    tl_send_opts o{};
    o.payload = payload;
    o.payload_bytes = static_cast<uint32_t>(sizeof(h) + bytes);
    return tl_write_msg(client_, 0, 0, to, 0, 0, &o, t);
}

ncclResult_t Net::send(Comm *c, Wire type, uint8_t count, const void *body, size_t bytes,
                       tl_remote to, tl_ticket *ticket) {
    tl_ticket t = 0;
    const tl_status s =
        postMessage(c, type, count, type == Wire::kConnect ? c->target.listener : c->peer_comm,
                    body, bytes, to, &t);
    if (s != TL_OK) {
        return fail(
            c, std::string("message to the peer: ") + tl_status_str(s) + ": " + tl_last_error());
    }
    if (ticket != nullptr) {
        *ticket = t;
    } else {
        unwaited_.push_back({t, c->id});  // progress() takes its end
    }
    return ncclSuccess;
}

ncclResult_t Net::listen(int dev, void *handle, void **listen_comm) {
    if (dev != 0 || handle == nullptr || listen_comm == nullptr) {
        return ncclInvalidArgument;
    }
    Guard lock(*this, __func__);
    if (client_ == nullptr) {
        return ncclSystemError;
    }
    Comm *l = newComm('L');
    if (ncclResult_t r = exposeMailbox(l); r != ncclSuccess) {
        release(l);
        return r;
    }
    Handle h{};
    h.magic = kWireMagic;
    h.version = kWireVersion;
    h.nonce = nonce_;
    h.listener = l->id;
    std::snprintf(h.node, sizeof(h.node), "%s", node_.c_str());
    std::memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    std::memcpy(handle, &h, sizeof(h));
    *listen_comm = l;
    return ncclSuccess;
}

ncclResult_t Net::connect(int dev, void *handle, void **send_comm) {
    if (dev != 0 || handle == nullptr || send_comm == nullptr) {
        return ncclInvalidArgument;
    }
    *send_comm = nullptr;
    Handle h{};
    std::memcpy(&h, handle, sizeof(h));
    if (h.magic != kWireMagic || h.version != kWireVersion) {
        log(NCCL_LOG_WARN,
            "connect: the handle is not a tensorlane plugin's (magic %#x, "
            "version %u; want %#x, %u)",
            h.magic, h.version, kWireMagic, kWireVersion);
        return ncclInvalidUsage;
    }
    h.node[sizeof(h.node) - 1] = '\0';
    Guard lock(*this, __func__);
    if (client_ == nullptr) {
        return ncclSystemError;
    }
    // NCCL calls again with the same handle until a comm comes back: the comm in the making is
    // kept by handle (listener and nonce) between calls.
    Comm *c = nullptr;
    for (auto &[id, x] : comms_) {
        if (x->kind == 'S' && !x->connected && x->target.nonce == h.nonce &&
            x->target.listener == h.listener && std::strcmp(x->target.node, h.node) == 0) {
            c = x;
            break;
        }
    }
    if (c == nullptr) {
        c = newComm('S');
        c->target = h;
        c->peer_node = h.node;
        c->peer_nonce = h.nonce;
        if (ncclResult_t r = exposeMailbox(c); r != ncclSuccess) {
            release(c);
            return r;
        }
    }
    if (Clock::now() < c->next_try) {
        return ncclSuccess;
    }
    const std::string name = regionName(h.nonce, 'L', h.listener);
    tl_remote listener = 0;
    const tl_status s = tl_lookup(client_, h.node, name.c_str(), &listener, nullptr);
    if (s == TL_ENOENT || s == TL_EPEER || s == TL_ETIMEDOUT) {
        c->next_try = Clock::now() + kConnectRetry;  // not there yet: NCCL calls again
        return ncclSuccess;
    }
    if (s != TL_OK) {
        log(NCCL_LOG_WARN, "connect to %s on %s: %s: %s", name.c_str(), h.node, tl_status_str(s),
            tl_last_error());
        release(c);
        return ncclSystemError;
    }
    c->peer_mailbox = listener;  // until the first CTS names the receiver's own
    if (ncclResult_t r = send(c, Wire::kConnect, 0, nullptr, 0, listener, nullptr);
        r != ncclSuccess) {
        release(c);
        return r;
    }
    c->connected = true;
    c->last_progress = Clock::now();
    *send_comm = c;
    return ncclSuccess;
}

ncclResult_t Net::accept(void *listen_comm, void **recv_comm) {
    auto *l = static_cast<Comm *>(listen_comm);
    if (l == nullptr || recv_comm == nullptr || l->kind != 'L') {
        return ncclInvalidArgument;
    }
    *recv_comm = nullptr;
    Guard lock(*this, __func__);
    progress();
    if (l->pending.empty()) {
        return ncclSuccess;
    }
    const Comm::Pending p = l->pending.front();
    Comm *c = newComm('R');
    c->peer_node = p.node;
    c->peer_nonce = p.nonce;
    c->peer_comm = p.comm;
    const std::string name = regionName(p.nonce, 'S', p.comm);
    tl_status s = tl_lookup(client_, p.node.c_str(), name.c_str(), &c->peer_mailbox, nullptr);
    if (s == TL_ENOENT || s == TL_EPEER || s == TL_ETIMEDOUT) {
        release(c);
        return ncclSuccess;  // the sender's mailbox is not visible yet: NCCL calls again
    }
    if (s != TL_OK) {
        log(NCCL_LOG_WARN, "accept: the sender's mailbox %s on %s: %s: %s", name.c_str(),
            p.node.c_str(), tl_status_str(s), tl_last_error());
        l->pending.pop_front();
        release(c);
        return ncclSystemError;
    }
    if (ncclResult_t r = exposeMailbox(c); r != ncclSuccess) {
        release(c);
        return r;
    }
    CreditBody grant{0, 0, 0};
    if (eager_bytes_ != 0) {
        // The eager ring, exposed under a name with this process's random nonce, as its MRs.
        const std::string ring = regionName(nonce_, 'E', c->id);
        void *ring_ptr = nullptr;
        if (tl_alloc_host(client_, static_cast<uint64_t>(eager_slots_) * eager_bytes_, &ring_ptr,
                          &c->eager_region) != TL_OK ||
            tl_expose(client_, c->eager_region, ring.c_str()) != TL_OK) {
            log(NCCL_LOG_WARN, "the eager ring %s: %s (sends wait for their CTS instead)",
                ring.c_str(), tl_last_error());
        } else {
            c->eager_ptr = static_cast<unsigned char *>(ring_ptr);
            c->eager_state.assign(eager_slots_, kEagerEmpty);
            grant = CreditBody{0, eager_slots_, eager_bytes_};
        }
    }
    l->pending.pop_front();
    c->connected = true;
    c->last_progress = Clock::now();
    // The sender learns this comm (and its mailbox, for its probes) and the eager grant from
    // this first message.
    if (ncclResult_t r = send(c, Wire::kPing, 0, &grant, sizeof(grant), c->peer_mailbox, nullptr);
        r != ncclSuccess) {
        release(c);
        return r;
    }
    *recv_comm = c;
    return ncclSuccess;
}

ncclResult_t Net::regMr(void *comm, void *data, size_t size, int type, void **mhandle) {
    auto *c = static_cast<Comm *>(comm);
    if (c == nullptr || mhandle == nullptr || (size != 0 && data == nullptr)) {
        return ncclInvalidArgument;
    }
    Guard lock(*this, __func__);
    auto mr = std::make_unique<Mr>();
    mr->id = next_mr_++;
    mr->user = static_cast<unsigned char *>(data);
    mr->size = size == 0 ? 1 : size;
    tl_status s = TL_OK;
    if (type == NCCL_PTR_HOST) {
        mr->host = true;
        // NCCL's host buffers are cuMem host allocations (NCCL_CUMEM_HOST_ENABLE, on by default
        // since 2.23 with a recent driver) that the shim shares with the sidecar: registered in
        // place, no copies. Others (cudaHostAlloc, older NCCL) get a shadow the sidecar can
        // reach, copied at each end.
        if (host_direct_ && tl_register(client_, data, mr->size, &mr->region) == TL_OK) {
            ++host_direct_mrs_;
        } else {
            if (host_direct_) {
                // The first one's reason at INFO (why NCCL's buffers are not used in place),
                // the rest at TRACE.
                log(host_shadow_mrs_ == 0 ? NCCL_LOG_INFO : NCCL_LOG_TRACE,
                    "host buffer %p (%zu bytes) is not shared with the sidecar, so it gets a "
                    "shadow: %s",
                    data, size, tl_last_error());
            }
            void *p = nullptr;
            s = tl_alloc_host(client_, mr->size, &p, &mr->region);
            mr->shadow = static_cast<unsigned char *>(p);
            ++host_shadow_mrs_;
        }
    } else {
        s = tl_register(client_, data, mr->size, &mr->region);
    }
    if (s != TL_OK) {
        log(NCCL_LOG_WARN, "regMr of %zu bytes of %s memory at %p: %s: %s", size,
            type == NCCL_PTR_HOST ? "host" : "CUDA", data, tl_status_str(s), tl_last_error());
        return ncclSystemError;
    }
    if (c->kind == 'R') {
        const std::string name = regionName(nonce_, 'M', mr->id);
        if (tl_expose(client_, mr->region, name.c_str()) != TL_OK) {
            log(NCCL_LOG_WARN, "expose %s: %s", name.c_str(), tl_last_error());
            tl_deregister(client_, mr->region);
            return ncclSystemError;
        }
        mr->exposed = true;
        recv_regions_[mr->region] = c->id;
    }
    *mhandle = mr.get();
    c->mrs[mr->id] = std::move(mr);
    return ncclSuccess;
}

ncclResult_t Net::regMrDmaBuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                              int fd, void **mhandle) {
    if (type != NCCL_PTR_CUDA) {
        return regMr(comm, data, size, type, mhandle);
    }
    // The pointer first: a region the sidecar maps works on every transport; a dma-buf alone
    // only on verbs.
    if (regMr(comm, data, size, type, mhandle) == ncclSuccess) {
        return ncclSuccess;
    }
    auto *c = static_cast<Comm *>(comm);
    Guard lock(*this, __func__);
    auto mr = std::make_unique<Mr>();
    mr->id = next_mr_++;
    mr->user = static_cast<unsigned char *>(data);
    mr->size = size;
    if (tl_status s = tl_register_dmabuf(client_, fd, offset, size, &mr->region); s != TL_OK) {
        log(NCCL_LOG_WARN, "regMrDmaBuf of %zu bytes (fd %d, offset %llu): %s: %s", size, fd,
            static_cast<unsigned long long>(offset), tl_status_str(s), tl_last_error());
        return ncclSystemError;
    }
    mr->dmabuf_only = true;
    if (c->kind == 'R') {
        const std::string name = regionName(nonce_, 'M', mr->id);
        if (tl_expose(client_, mr->region, name.c_str()) != TL_OK) {
            tl_deregister(client_, mr->region);
            return ncclSystemError;
        }
        mr->exposed = true;
        recv_regions_[mr->region] = c->id;
        if (c->eager_region != 0 && !c->eager_revoked) {
            // No local write reaches a dma-buf-only buffer, so no eager copy can: the grant is
            // taken back (NCCL registers its buffers before it posts receives, so nothing was
            // sent eagerly yet; one that was fails this comm with the reason).
            c->eager_revoked = true;
            sendCredit(c);
            sendQuietCts(c);
        }
    }
    *mhandle = mr.get();
    c->mrs[mr->id] = std::move(mr);
    return ncclSuccess;
}

ncclResult_t Net::deregMr(void *comm, void *mhandle) {
    auto *c = static_cast<Comm *>(comm);
    auto *mr = static_cast<Mr *>(mhandle);
    if (c == nullptr || mr == nullptr) {
        return ncclInvalidArgument;
    }
    Guard lock(*this, __func__);
    auto it = c->mrs.find(mr->id);
    if (it == c->mrs.end() || it->second.get() != mr) {
        return ncclInvalidArgument;
    }
    if (trace_) {
        trace("deregMr comm %c%llu mr %u", c->kind, static_cast<unsigned long long>(c->id), mr->id);
    }
    recv_regions_.erase(mr->region);
    doomed_.push_back(mr->region);  // deregistered once the lock is let go (Guard)
    c->mrs.erase(it);
    return ncclSuccess;
}

ncclResult_t Net::irecv(void *recv_comm, int n, void **data, const uint64_t *sizes, const int *tags,
                        void **mhandles, void **request) {
    auto *c = static_cast<Comm *>(recv_comm);
    if (c == nullptr || c->kind != 'R' || request == nullptr || n < 1 || n > kMaxRecvs) {
        return ncclInvalidArgument;
    }
    *request = nullptr;
    Guard lock(*this, __func__);
    progress();
    if (!c->error.empty()) {
        return ncclRemoteError;
    }
    Request *r = nullptr;
    for (Request &x : c->requests) {
        if (x.free) {
            r = &x;
            break;
        }
    }
    if (r == nullptr) {
        return ncclSuccess;  // NCCL_NET_MAX_REQUESTS in flight: NCCL tries again
    }
    // Check every buffer before anything changes.
    for (int i = 0; i < n; ++i) {
        auto *mr = static_cast<Mr *>(mhandles[i]);
        auto *p = static_cast<unsigned char *>(data[i]);
        if (mr == nullptr ||
            (sizes[i] != 0 && (p < mr->user || p + sizes[i] > mr->user + mr->size))) {
            log(NCCL_LOG_WARN, "irecv: buffer %d (%p, %llu bytes) is outside its MR", i, data[i],
                static_cast<unsigned long long>(sizes[i]));
            return ncclInvalidArgument;
        }
    }
    ++r->generation;
    r->free = false;
    r->n = n;
    r->done = 0;
    // Each entry takes its tag's next sequence number; one whose send came eagerly already is
    // copied below. The others wait for their message: an entry a slot holds quietly (its send
    // comes eagerly, or asks with RTS), a bigger one with a CTS to the sender.
    const bool quiet_ok = c->eager_region != 0 && !c->eager_revoked;
    uint32_t wanted[kMaxRecvs];
    int nwanted = 0;
    std::pair<int, Comm::Arrival> ready[kMaxRecvs];
    int nready = 0;
    for (int i = 0; i < n; ++i) {
        auto *mr = static_cast<Mr *>(mhandles[i]);
        auto *p = static_cast<unsigned char *>(data[i]);
        const uint64_t off = mr->user != nullptr ? static_cast<uint64_t>(p - mr->user) : 0;
        const uint32_t seq = c->next_seq[tags[i]]++;
        r->mrs[i] = mr;
        r->data[i] = p;
        r->offsets[i] = off;
        r->posted[i] = sizes[i];
        r->sizes[i] = 0;
        r->landed[i] = false;
        r->cts_at[i] = {};
        r->tags[i] = tags[i];
        r->seqs[i] = seq;
        const Comm::Key key{tags[i], seq};
        if (auto e = c->early.find(key); e != c->early.end()) {
            ready[nready++] = {i, e->second};
            c->early.erase(e);
            continue;
        }
        const bool asked = c->rts_early.erase(key) != 0;
        const bool cts = !quiet_ok || sizes[i] > eager_bytes_ || asked;
        c->awaiting[key] = Comm::Awaiting{r->slot, static_cast<uint32_t>(i), cts};
        if (cts) {
            wanted[nwanted++] = static_cast<uint32_t>(i);
            ++c->counts.direct;
            if (static_cast<uint64_t>(sizes[i]) >= kTimedFrom) {
                r->cts_at[i] = Clock::now();
            }
        }
    }
    if (nwanted > 0 && !sendCts(c, *r, wanted, nwanted)) {
        r->free = true;
        return ncclRemoteError;
    }
    for (int k = 0; k < nready; ++k) {
        if (!eagerConsume(c, *r, static_cast<uint32_t>(ready[k].first), ready[k].second.slot,
                          ready[k].second.size)) {
            r->free = true;
            return ncclRemoteError;
        }
    }
    if (trace_) {
        r->since = Clock::now();
        r->stall_told = false;
        trace(
            "comm R%llu irecv slot %u gen %u n %d size0 %llu tag0 %d seq0 %u (%d already "
            "here eagerly)",
            static_cast<unsigned long long>(c->id), r->slot, r->generation, n,
            static_cast<unsigned long long>(sizes[0]), tags[0], r->seqs[0], nready);
    }
    *request = r;
    return ncclSuccess;
}

ncclResult_t Net::isend(void *send_comm, void *data, uint64_t size, int tag, void *mhandle,
                        void **request) {
    auto *c = static_cast<Comm *>(send_comm);
    auto *mr = static_cast<Mr *>(mhandle);
    if (c == nullptr || c->kind != 'S' || request == nullptr || mr == nullptr) {
        return ncclInvalidArgument;
    }
    *request = nullptr;
    Guard lock(*this, __func__);
    progress();
    if (!c->error.empty()) {
        return ncclRemoteError;
    }
    const uint32_t seq = c->next_seq[tag];
    auto cts = c->cts.find(Comm::Key{tag, seq});
    const bool have_cts = cts != c->cts.end();
    // Eager: no CTS for this send yet (or the test hook prefers it), and a slot it fits.
    const bool eager = (!have_cts || eager_prefer_) && eagerFits(c, size);
    if (!have_cts && !eager) {
        // Its receive may be one the receiver holds quietly for an eager send: ask for its CTS
        // (once). Only a receive of at most a slot is held so, so a send that fits a slot asks
        // at once (it found no free slot), a bigger one only after kRtsAfter (its receive is too
        // small for it: the CTS then tells the truncation).
        const Comm::Key key{tag, seq};
        const auto now = Clock::now();
        const auto since = c->waiting_since.try_emplace(key, now).first->second;
        bool ask = c->eager_slots != 0 && c->peer_comm != 0 && c->error.empty() &&
                   c->rts_sent.count(key) == 0;
        if (ask && size > c->eager_bytes) {
            ask = now - since >= kRtsAfter;
        }
        if (ask) {
            const RtsBody rts{tag, seq};
            if (send(c, Wire::kRts, 1, &rts, sizeof(rts), c->peer_mailbox, nullptr) !=
                ncclSuccess) {
                return ncclRemoteError;
            }
            c->rts_sent.insert(key);
            ++c->counts.rts;
        }
        checkAlive(c);
        traceStall(c, "isend waits for its CTS");
        return c->error.empty() ? ncclSuccess : ncclRemoteError;
    }
    auto *p = static_cast<unsigned char *>(data);
    if (size != 0 && (p < mr->user || p + size > mr->user + mr->size)) {
        log(NCCL_LOG_WARN, "isend: %p + %llu is outside its MR", data,
            static_cast<unsigned long long>(size));
        return ncclInvalidArgument;
    }
    Request *r = nullptr;
    for (Request &x : c->requests) {
        if (x.free) {
            r = &x;
            break;
        }
    }
    if (r == nullptr) {
        return ncclSuccess;
    }
    const uint64_t off = static_cast<uint64_t>(p - mr->user);
    tl_ticket t = 0;
    tl_status s = TL_OK;
    uint32_t eager_slot = 0;
    // Into a CTS: its receive must hold the message, and its buffer is looked up once.
    const Comm::Cts *slot = eager ? nullptr : &cts->second;
    tl_remote dst = c->eager_remote;
    if (slot != nullptr) {
        const CtsEntry &entry = slot->entry;
        if (size > entry.size) {
            return fail(c, "a send of " + std::to_string(size) + " bytes (tag " +
                               std::to_string(tag) + ") into a receive of " +
                               std::to_string(entry.size) + ": message truncated");
        }
        if (auto it = c->remote_mrs.find(entry.mr); it != c->remote_mrs.end()) {
            dst = it->second;
        } else {
            const std::string name = regionName(c->peer_nonce, 'M', entry.mr);
            if (tl_status ls =
                    tl_lookup(client_, c->peer_node.c_str(), name.c_str(), &dst, nullptr);
                ls != TL_OK) {
                return fail(c, "the receiver's buffer " + name + ": " + tl_status_str(ls) + ": " +
                                   tl_last_error());
            }
            c->remote_mrs[entry.mr] = dst;
        }
    }
    if (mr->shadow != nullptr && size != 0) {
        copy(c, mr->shadow + off, p, size);  // NCCL's host buffer into the sidecar's reach
    }
    if (eager) {
        eager_slot = static_cast<uint32_t>(c->eager_sent % c->eager_slots);
        const EagerBody body{eager_slot, tag, seq, 0, size};
        unsigned char payload[sizeof(WireHeader) + sizeof(EagerBody)];
        const WireHeader h{
            kWireMagic, static_cast<uint8_t>(Wire::kEager), 1, 0, c->peer_comm, c->id, nonce_};
        std::memcpy(payload, &h, sizeof(h));
        std::memcpy(payload + sizeof(h), &body, sizeof(body));
        tl_send_opts o{};
        o.payload = payload;
        o.payload_bytes = sizeof(payload);
        // Zero bytes: a message of the payload alone, at the slot (it takes a slot all the same,
        // so the ring bounds what the sender may run ahead).
        s = tl_write_msg(client_, mr->region, off, dst,
                         static_cast<uint64_t>(eager_slot) * c->eager_bytes, size, &o, &t);
    } else if (size != 0) {
        // The bytes with an immediate naming the receiver's request and entry.
        s = tl_write(client_, mr->region, off, dst, slot->entry.offset, size,
                     dataImm(slot->request, slot->generation, slot->entry.index), &t);
    } else {
        // No bytes to write: a DATA message says the entry is done.
        const DataBody body{slot->request, slot->generation, slot->entry.index, 0, 0};
        s = postMessage(c, Wire::kData, 1, slot->from, &body, sizeof(body), dst, &t);
    }
    if (s == TL_EAGAIN) {
        traceStall(c, "the ring is full");
        return ncclSuccess;  // the ring is full: NCCL tries again
    }
    if (s != TL_OK) {
        return fail(c, std::string(eager ? "eager write: " : "write: ") + tl_status_str(s) + ": " +
                           tl_last_error());
    }
    ++c->next_seq[tag];
    c->rts_sent.erase(Comm::Key{tag, seq});
    if (auto w = c->waiting_since.find(Comm::Key{tag, seq}); w != c->waiting_since.end()) {
        ++c->counts.waited;
        c->counts.wait_ns += nanosSince(w->second, Clock::now());
        c->waiting_since.erase(w);
    }
    const uint32_t entry_index = have_cts ? cts->second.entry.index : 0;
    if (have_cts) {
        c->cts.erase(cts);  // used, or (eager) stale: the receiver copies from the ring
    }
    if (eager) {
        ++c->eager_sent;
        ++c->counts.eager;
    } else {
        ++c->counts.direct;
    }
    r->free = false;
    r->ticket = t;
    r->size = size;
    r->written = !eager && size >= kTimedFrom ? Clock::now() : Clock::time_point{};
    ++r->generation;
    if (trace_) {
        r->since = Clock::now();
        r->stall_told = false;
        trace("comm S%llu isend slot %u size %llu tag %d seq %u %s %u ticket %llu",
              static_cast<unsigned long long>(c->id), r->slot,
              static_cast<unsigned long long>(size), tag, seq,
              eager ? "eagerly into ring slot" : "into its CTS, entry",
              eager ? eager_slot : entry_index, static_cast<unsigned long long>(t));
    }
    *request = r;
    return ncclSuccess;
}

ncclResult_t Net::test(void *request, int *done, int *sizes) {
    auto *r = static_cast<Request *>(request);
    if (r == nullptr || done == nullptr || r->free) {
        return ncclInvalidArgument;
    }
    *done = 0;
    Guard lock(*this, __func__);
    Comm *c = r->comm;
    if (r->send) {
        int finished = 0;
        const tl_status s = tl_test(client_, r->ticket, &finished);
        if (s == TL_OK && finished == 0) {
            traceRequest(*r, "send's ticket not ended");
            return c->error.empty() ? ncclSuccess : ncclRemoteError;
        }
        if (s != TL_OK) {
            r->free = true;
            return fail(c, std::string("send of ") + std::to_string(r->size) +
                               " bytes: " + tl_status_str(s) + ": " + tl_last_error());
        }
        *done = 1;
        if (sizes != nullptr) {
            *sizes = static_cast<int>(r->size);
        }
        if (trace_) {
            trace("comm S%llu send done slot %u ticket %llu",
                  static_cast<unsigned long long>(c->id), r->slot,
                  static_cast<unsigned long long>(r->ticket));
        }
        c->last_progress = Clock::now();
        if (r->written != Clock::time_point{}) {
            ++c->counts.timed;
            c->counts.timed_ns += nanosSince(r->written, c->last_progress);
        }
        r->free = true;
        return ncclSuccess;
    }
    progress();
    if (r->done < r->n) {
        traceRequest(*r, "receive not landed");
        checkAlive(c);
        if (!c->error.empty()) {
            r->free = true;
            return ncclRemoteError;
        }
        return ncclSuccess;
    }
    *done = 1;
    for (int i = 0; i < r->n; ++i) {
        if (sizes != nullptr) {
            sizes[i] = static_cast<int>(r->sizes[i]);
        }
    }
    if (trace_) {
        trace("comm R%llu recv done slot %u gen %u", static_cast<unsigned long long>(c->id),
              r->slot, r->generation);
    }
    r->free = true;
    return ncclSuccess;
}

void Net::checkAlive(Comm *c) {
    if (!c->error.empty() || c->peer_mailbox == 0 || c->peer_comm == 0) {
        return;  // (a send comm learns its receiver from accept()'s first message)
    }
    if (c->probe != 0) {
        int finished = 0;
        const tl_status s = tl_test(client_, c->probe, &finished);
        if (s == TL_OK && finished == 0) {
            return;
        }
        c->probe = 0;
        if (s != TL_OK && peerGone(s)) {
            fail(c, std::string("the peer does not answer (") + tl_status_str(s) + ": " +
                        tl_last_error() + ")");
            return;
        }
        c->last_progress = Clock::now();
        return;
    }
    if (Clock::now() - c->last_progress < kProbeAfter) {
        return;
    }
    // A message into the peer's mailbox: it fails once the peer's process (its region) or its
    // sidecar is gone.
    (void)send(c, Wire::kPing, 0, nullptr, 0, c->peer_mailbox, &c->probe);
}

void Net::traceRequest(Request &r, const char *what) {
    if (!trace_ || r.stall_told || Clock::now() - r.since < std::chrono::seconds(2)) {
        return;
    }
    r.stall_told = true;
    log(NCCL_LOG_INFO, "trace: comm %c%llu slot %u: %s after 2 s (done %d of %d, ticket %llu)",
        r.comm->kind, static_cast<unsigned long long>(r.comm->id), r.slot, what, r.done, r.n,
        static_cast<unsigned long long>(r.ticket));
}

void Net::traceStall(Comm *c, const char *what) {
    if (!trace_) {
        return;
    }
    const auto now = Clock::now();
    if (now - c->last_stall_told < std::chrono::seconds(2)) {
        return;
    }
    c->last_stall_told = now;
    log(NCCL_LOG_INFO,
        "trace: comm S%llu: %s (%zu CTS queued, first tag %d seq %u; eager %llu sent, %llu "
        "given back, %u slots)",
        static_cast<unsigned long long>(c->id), what, c->cts.size(),
        c->cts.empty() ? -1 : c->cts.begin()->first.first,
        c->cts.empty() ? 0u : c->cts.begin()->first.second,
        static_cast<unsigned long long>(c->eager_sent),
        static_cast<unsigned long long>(c->eager_credit), c->eager_slots);
}

void Net::learnReceiver(Comm *c, const WireHeader &h) {
    if (c->peer_comm == h.from) {
        return;
    }
    // The receiver's own comm: its mailbox is where this comm's probes go from now on.
    c->peer_comm = h.from;
    const std::string name = regionName(h.nonce, 'R', h.from);
    tl_remote mb = 0;
    if (tl_lookup(client_, c->peer_node.c_str(), name.c_str(), &mb, nullptr) == TL_OK) {
        c->peer_mailbox = mb;
    }
}

void Net::progress() {
    // The messages nobody waits for: a failed one means the peer is gone.
    for (size_t i = 0; i < unwaited_.size();) {
        int finished = 0;
        const tl_status s = tl_test(client_, unwaited_[i].first, &finished);
        if (s == TL_OK && finished == 0) {
            ++i;
            continue;
        }
        if (s != TL_OK) {
            if (auto it = comms_.find(unwaited_[i].second); it != comms_.end()) {
                fail(it->second, std::string("a message to the peer failed: ") + tl_status_str(s) +
                                     ": " + tl_last_error());
            }
        }
        unwaited_[i] = unwaited_.back();
        unwaited_.pop_back();
    }
    // Local writes from an eager slot into a GPU buffer: once ended the slot is free (the
    // entry itself lands on the write's notification, as a CTS write's does).
    for (size_t i = 0; i < eager_copies_.size();) {
        int finished = 0;
        const tl_status s = tl_test(client_, eager_copies_[i].ticket, &finished);
        if (s == TL_OK && finished == 0) {
            ++i;
            continue;
        }
        if (auto it = comms_.find(eager_copies_[i].comm); it != comms_.end()) {
            if (s != TL_OK) {
                fail(it->second, std::string("copying an eager message into its GPU buffer: ") +
                                     tl_status_str(s) + ": " + tl_last_error());
            } else {
                eagerFree(it->second, eager_copies_[i].slot);
            }
        }
        eager_copies_[i] = eager_copies_.back();
        eager_copies_.pop_back();
    }
    tl_message m{};
    for (int i = 0; i < 1024; ++i) {
        if (tl_wait_message(client_, &m, 0) != TL_OK) {
            return;
        }
        dispatch(m);
    }
}

void Net::dispatch(const tl_message &m) {
    if (m.kind == TL_NOTIFY_WRITE && m.payload_bytes == 0 && (m.ex.n.imm & kDataImmFlag) != 0) {
        // A data write into a receive comm's MR: which comm by the region, which request and
        // entry by the immediate.
        auto r = recv_regions_.find(m.ex.n.region);
        if (r == recv_regions_.end()) {
            if (trace_) {
                trace("a data write into region %llu of no receive comm",
                      static_cast<unsigned long long>(m.ex.n.region));
            }
            return;  // an MR deregistered meanwhile
        }
        auto it = comms_.find(r->second);
        if (it == comms_.end() || it->second->kind != 'R') {
            return;
        }
        const uint32_t imm = m.ex.n.imm;
        landed(it->second, imm >> 3 & 31u, imm >> 8 & 0xfffffu, imm & 7u, m.ex.n.bytes, m.status);
        return;
    }
    WireHeader h{};
    if (m.payload_bytes < sizeof(h)) {
        return;  // not the plugin's
    }
    std::memcpy(&h, m.payload, sizeof(h));
    if (h.magic != kWireMagic) {
        return;
    }
    auto it = comms_.find(h.to);
    if (it == comms_.end()) {
        return;  // a comm closed meanwhile
    }
    Comm *c = it->second;
    if (c->kind != 'L') {
        // A connected comm takes words from its other end only: that process (its nonce: the
        // sender's is known to nobody but its receiver) on that node, and that comm once known.
        // Anything else is dropped, and the comm goes on.
        const bool from_peer =
            h.nonce == c->peer_nonce &&
            std::strncmp(m.ex.n.peer, c->peer_node.c_str(), sizeof(m.ex.n.peer)) == 0 &&
            (c->peer_comm == 0 || h.from == c->peer_comm);
        if (!from_peer) {
            log(NCCL_LOG_INFO,
                "%s comm %llu: dropped a payload (kind %u) from %.64s (comm %llu), not its peer",
                c->kind == 'S' ? "send" : "recv", static_cast<unsigned long long>(c->id), h.type,
                m.ex.n.peer, static_cast<unsigned long long>(h.from));
            return;
        }
    }
    const unsigned char *body = m.payload + sizeof(h);
    const size_t body_bytes = m.payload_bytes - sizeof(h);
    switch (static_cast<Wire>(h.type)) {
        case Wire::kConnect:
            if (c->kind == 'L') {
                c->pending.push_back({m.ex.n.peer, h.nonce, h.from});
            }
            return;
        case Wire::kCts: {
            if (c->kind != 'S' || h.count < 1 || h.count > kCtsPerMessage ||
                body_bytes < offsetof(CtsBody, entries) + sizeof(CtsEntry) * h.count) {
                return;
            }
            CtsBody cb{};
            std::memcpy(&cb, body, offsetof(CtsBody, entries) + sizeof(CtsEntry) * h.count);
            learnReceiver(c, h);
            if (cb.credit > c->eager_credit && cb.credit <= c->eager_sent) {
                c->eager_credit = cb.credit;
            }
            int stale = 0;
            for (int i = 0; i < h.count; ++i) {
                const CtsEntry &e = cb.entries[i];
                auto next = c->next_seq.find(e.tag);
                if (e.index >= kMaxRecvs ||
                    (next != c->next_seq.end() && seqBefore(e.seq, next->second))) {
                    ++stale;  // sent eagerly before this CTS came: the receiver has it
                    ++c->counts.crossed;
                    continue;
                }
                c->cts[Comm::Key{e.tag, e.seq}] = Comm::Cts{h.from, cb.request, cb.generation, e};
            }
            if (trace_) {
                trace(
                    "comm S%llu CTS from R%llu slot %u gen %u n %d (%d stale) size0 %llu "
                    "tag0 %d seq0 %u credit %llu",
                    static_cast<unsigned long long>(c->id), static_cast<unsigned long long>(h.from),
                    cb.request, cb.generation, h.count, stale,
                    static_cast<unsigned long long>(cb.entries[0].size), cb.entries[0].tag,
                    cb.entries[0].seq, static_cast<unsigned long long>(cb.credit));
            }
            c->last_progress = Clock::now();
            return;
        }
        case Wire::kEager: {
            EagerBody e{};
            if (c->kind != 'R' || body_bytes < sizeof(e)) {
                return;
            }
            std::memcpy(&e, body, sizeof(e));
            eagerArrived(c, e, m);
            return;
        }
        case Wire::kRts: {
            RtsBody rts{};
            if (c->kind != 'R' || body_bytes < sizeof(rts)) {
                return;
            }
            std::memcpy(&rts, body, sizeof(rts));
            const Comm::Key key{rts.tag, rts.seq};
            auto w = c->awaiting.find(key);
            if (w == c->awaiting.end()) {
                auto next = c->next_seq.find(rts.tag);
                const bool posted_already =
                    next != c->next_seq.end() && seqBefore(rts.seq, next->second);
                if (!posted_already && c->rts_early.size() < 4096) {
                    c->rts_early.insert(key);  // its CTS goes when it is posted
                }
                return;  // (posted and served already: a stale RTS)
            }
            if (!w->second.cts_sent) {
                w->second.cts_sent = true;
                ++c->counts.rts;
                const uint32_t index = w->second.index;
                sendCts(c, c->requests[w->second.request], &index, 1);
            }
            c->last_progress = Clock::now();
            return;
        }
        case Wire::kCredit: {
            CreditBody cr{};
            if (c->kind != 'S' || body_bytes < sizeof(cr)) {
                return;
            }
            std::memcpy(&cr, body, sizeof(cr));
            if (cr.credit > c->eager_credit && cr.credit <= c->eager_sent) {
                c->eager_credit = cr.credit;
            }
            if (cr.slots == 0 && c->eager_slots != 0) {
                log(NCCL_LOG_INFO, "send comm %llu: the receiver took its eager grant back",
                    static_cast<unsigned long long>(c->id));
                c->eager_slots = 0;
            }
            c->last_progress = Clock::now();
            return;
        }
        case Wire::kData: {
            DataBody d{};
            if (c->kind != 'R' || body_bytes < sizeof(d)) {
                return;
            }
            std::memcpy(&d, body, sizeof(d));
            landed(c, d.request, d.generation, d.index, d.size, m.status);
            return;
        }
        case Wire::kPing:
            if (c->kind == 'S') {
                learnReceiver(c, h);  // accept()'s first word: the receiver's comm
                CreditBody grant{};
                if (body_bytes >= sizeof(grant) && c->eager_sent == 0 && c->eager_slots == 0) {
                    std::memcpy(&grant, body, sizeof(grant));
                    // (Bounded: the ring is the receiver's; these only size what we send.)
                    if (grant.slots > 0 && grant.slots <= 4096 && grant.slot_bytes > 0) {
                        c->eager_slots = grant.slots;
                        c->eager_bytes = grant.slot_bytes;
                    }
                }
            }
            c->last_progress = Clock::now();
            return;
    }
}

void Net::landed(Comm *c, uint32_t slot, uint32_t generation, uint32_t index, uint64_t size,
                 tl_status status) {
    if (slot >= c->requests.size() || index >= kMaxRecvs) {
        return;
    }
    Request &r = c->requests[slot];
    // (A data write's immediate carries 20 bits of the generation: a request is reused a
    // million times before a stale write could match it.)
    constexpr uint32_t kMask = 0xfffffu;
    if (r.free || r.send || (r.generation & kMask) != (generation & kMask) ||
        static_cast<int>(index) >= r.n || r.landed[index] || size > r.posted[index]) {
        if (trace_) {
            trace(
                "comm R%llu dropped a landing: slot %u gen %u (has %u, free %d) entry %u "
                "size %llu",
                static_cast<unsigned long long>(c->id), slot, generation, r.generation,
                r.free ? 1 : 0, index, static_cast<unsigned long long>(size));
        }
        return;
    }
    if (status != TL_OK) {
        fail(c, std::string("a write into a posted receive failed: ") + tl_status_str(status));
        return;
    }
    if (r.cts_at[index] != Clock::time_point{}) {
        ++c->counts.timed;
        c->counts.timed_ns += nanosSince(r.cts_at[index], Clock::now());
    }
    Mr *mr = r.mrs[index];
    if (mr->shadow != nullptr && size != 0) {
        copy(c, r.data[index], mr->shadow + r.offsets[index], size);
    }
    markLanded(c, r, index, size);
}

void Net::copy(Comm *c, void *to, const void *from, uint64_t bytes) {
    const auto t0 = Clock::now();
    pool_->copy(to, from, bytes);  // (made by init(), before any comm that copies exists)
    c->counts.copy_ns += nanosSince(t0, Clock::now());
    c->counts.copy_bytes += bytes;
}

void Net::markLanded(Comm *c, Request &r, uint32_t index, uint64_t size) {
    c->awaiting.erase(Comm::Key{r.tags[index], r.seqs[index]});
    r.sizes[index] = size;
    r.landed[index] = true;
    ++r.done;
    if (trace_) {
        trace("comm R%llu slot %u entry %u landed %llu bytes",
              static_cast<unsigned long long>(c->id), r.slot, index,
              static_cast<unsigned long long>(size));
    }
    c->last_progress = Clock::now();
}

bool Net::eagerFits(Comm *c, uint64_t size) {
    if (c->eager_slots == 0 || size > c->eager_bytes || c->peer_comm == 0 ||
        c->eager_sent - c->eager_credit >= c->eager_slots) {
        return false;
    }
    if (c->eager_remote == 0) {
        // Once per comm: the receiver's ring, by the name its grant implies.
        const std::string name = regionName(c->peer_nonce, 'E', c->peer_comm);
        if (tl_status s =
                tl_lookup(client_, c->peer_node.c_str(), name.c_str(), &c->eager_remote, nullptr);
            s != TL_OK) {
            log(NCCL_LOG_INFO, "send comm %llu: no eager ring %s (%s: %s); sends wait for CTS",
                static_cast<unsigned long long>(c->id), name.c_str(), tl_status_str(s),
                tl_last_error());
            c->eager_slots = 0;
            return false;
        }
    }
    return true;
}

void Net::eagerArrived(Comm *c, const EagerBody &e, const tl_message &m) {
    // What a sender of this comm may have sent: a granted slot not in use, at most a slot's
    // bytes, written where the slot is. Anything else is a broken or hostile peer: the comm
    // fails with the reason (no byte is copied anywhere).
    const uint64_t at = static_cast<uint64_t>(e.slot) * eager_bytes_;
    const bool written = m.kind == TL_NOTIFY_WRITE || m.kind == TL_NOTIFY_MESSAGE;
    std::string bad;
    if (c->eager_region == 0) {
        bad = "but this comm has no eager ring";
    } else if (e.slot >= c->eager_state.size()) {
        bad =
            "into slot " + std::to_string(e.slot) + " of " + std::to_string(c->eager_state.size());
    } else if (c->eager_state[e.slot] != kEagerEmpty) {
        bad = "into slot " + std::to_string(e.slot) + ", which was not given back yet";
    } else if (e.size > eager_bytes_) {
        bad = "of " + std::to_string(e.size) + " bytes (a slot holds " +
              std::to_string(eager_bytes_) + ")";
    } else if (!written || m.status != TL_OK || m.ex.n.region != c->eager_region ||
               m.ex.n.offset != at || m.ex.n.bytes != e.size ||
               (e.size == 0) != (m.kind == TL_NOTIFY_MESSAGE)) {
        bad = "whose write does not match it (" + std::to_string(m.ex.n.bytes) + " bytes at " +
              std::to_string(m.ex.n.offset) + ", status " + tl_status_str(m.status) + ")";
    }
    const Comm::Key key{e.tag, e.seq};
    if (bad.empty() && c->early.count(key) != 0) {
        bad = "repeating tag " + std::to_string(e.tag) + " seq " + std::to_string(e.seq);
    }
    if (!bad.empty()) {
        fail(c, "an eager send " + bad);
        return;
    }
    c->eager_state[e.slot] = kEagerHeld;
    c->last_progress = Clock::now();
    ++c->counts.eager;
    if (auto w = c->awaiting.find(key); w != c->awaiting.end()) {
        // Its receive is posted (its CTS crossed this send on the way): straight in.
        Request &r = c->requests[w->second.request];
        const uint32_t index = w->second.index;
        if (w->second.cts_sent) {
            ++c->counts.crossed;
        }
        if (trace_) {
            trace("comm R%llu eager slot %u tag %d seq %u into slot %u entry %u",
                  static_cast<unsigned long long>(c->id), e.slot, e.tag, e.seq, r.slot, index);
        }
        eagerConsume(c, r, index, e.slot, e.size);
        return;
    }
    auto next = c->next_seq.find(e.tag);
    if (next != c->next_seq.end() && seqBefore(e.seq, next->second)) {
        fail(c, "an eager send for tag " + std::to_string(e.tag) + " seq " + std::to_string(e.seq) +
                    ", a receive that was served already");
        return;
    }
    if (trace_) {
        trace("comm R%llu eager slot %u tag %d seq %u kept (%llu bytes)",
              static_cast<unsigned long long>(c->id), e.slot, e.tag, e.seq,
              static_cast<unsigned long long>(e.size));
    }
    c->early[key] = Comm::Arrival{e.slot, e.size};
    ++c->counts.kept;
}

bool Net::eagerConsume(Comm *c, Request &r, uint32_t index, uint32_t slot, uint64_t size) {
    if (size > r.posted[index]) {
        fail(c, "an eager send of " + std::to_string(size) + " bytes (tag " +
                    std::to_string(r.tags[index]) + ") into a receive of " +
                    std::to_string(r.posted[index]) + ": message truncated");
        return false;
    }
    Mr *mr = r.mrs[index];
    const unsigned char *from = c->eager_ptr + static_cast<uint64_t>(slot) * eager_bytes_;
    if (size == 0 || mr->host) {
        // Host memory (NCCL's own buffer; a shadow is not involved): one memcpy.
        if (size != 0) {
            copy(c, r.data[index], from, size);
        }
        markLanded(c, r, index, size);
        eagerFree(c, slot);
        return true;
    }
    // GPU memory: a local write from the ring into the buffer's region, whose notification
    // lands the entry as a CTS write's would; the slot is free once the write ended.
    if (mr->dmabuf_only) {
        fail(c,
             "an eager send for a receive buffer registered by its dma-buf alone (no local "
             "copy reaches it; TENSORLANE_NCCL_EAGER_BYTES=0 turns the eager path off)");
        return false;
    }
    if (mr->self == 0) {
        const std::string name = regionName(nonce_, 'M', mr->id);
        if (tl_status s = tl_lookup(client_, node_.c_str(), name.c_str(), &mr->self, nullptr);
            s != TL_OK) {
            fail(c, "our own receive buffer " + name + ": " + tl_status_str(s) + ": " +
                        tl_last_error());
            return false;
        }
    }
    tl_ticket t = 0;
    const tl_status s =
        tl_write(client_, c->eager_region, static_cast<uint64_t>(slot) * eager_bytes_, mr->self,
                 r.offsets[index], size, dataImm(r.slot, r.generation, index), &t);
    if (s != TL_OK) {
        fail(c, std::string("copying an eager message into its GPU buffer: ") + tl_status_str(s) +
                    ": " + tl_last_error());
        return false;
    }
    eager_copies_.push_back(EagerCopy{t, c->id, slot});
    ++c->counts.gpu_copies;
    return true;
}

void Net::eagerFree(Comm *c, uint32_t slot) {
    if (slot >= c->eager_state.size()) {
        return;
    }
    c->eager_state[slot] = kEagerFreed;
    const uint64_t slots = c->eager_state.size();
    while (c->eager_state[c->credit_upto % slots] == kEagerFreed) {
        c->eager_state[c->credit_upto % slots] = kEagerEmpty;
        ++c->credit_upto;
    }
    if (c->credit_upto - c->credit_told >= std::max<uint64_t>(1, slots / 2)) {
        sendCredit(c);
    }
}

bool Net::sendCts(Comm *c, const Request &r, const uint32_t *idx, int n) {
    for (int first = 0; first < n; first += kCtsPerMessage) {
        const int count = std::min(kCtsPerMessage, n - first);
        CtsBody body{};
        body.credit = c->credit_upto;
        body.request = r.slot;
        body.generation = r.generation;
        for (int k = 0; k < count; ++k) {
            const uint32_t i = idx[first + k];
            body.entries[k] =
                CtsEntry{r.mrs[i]->id, r.tags[i], r.seqs[i], i, r.offsets[i], r.posted[i]};
        }
        const size_t bytes =
            offsetof(CtsBody, entries) + sizeof(CtsEntry) * static_cast<size_t>(count);
        if (send(c, Wire::kCts, static_cast<uint8_t>(count), &body, bytes, c->peer_mailbox,
                 nullptr) != ncclSuccess) {
            return false;
        }
        c->credit_told = body.credit;
    }
    return true;
}

void Net::sendQuietCts(Comm *c) {
    for (auto &[key, w] : c->awaiting) {
        if (!w.cts_sent) {
            w.cts_sent = true;
            const uint32_t index = w.index;
            if (!sendCts(c, c->requests[w.request], &index, 1)) {
                return;
            }
        }
    }
}

void Net::sendCredit(Comm *c) {
    if (!c->error.empty()) {
        return;
    }
    const CreditBody body{c->credit_upto,
                          c->eager_revoked ? 0u : static_cast<uint32_t>(c->eager_state.size()),
                          eager_bytes_};
    // Not a word the receive needs answered: a sender that has closed since (its last data is
    // in the ring already) fails this message and nothing else, so its ticket is nobody's.
    tl_ticket t = 0;
    if (postMessage(c, Wire::kCredit, 0, c->peer_comm, &body, sizeof(body), c->peer_mailbox, &t) ==
        TL_OK) {
        unwaited_.push_back({t, 0});
        c->credit_told = c->credit_upto;
    }
}

ncclResult_t Net::close(void *comm) {
    auto *c = static_cast<Comm *>(comm);
    if (c == nullptr) {
        return ncclSuccess;
    }
    Guard lock(*this, __func__);
    if (comms_.count(c->id) == 0) {
        return ncclInvalidArgument;
    }
    if (trace_) {
        trace("close comm %c%llu", c->kind, static_cast<unsigned long long>(c->id));
    }
    release(c);
    return ncclSuccess;
}

}  // namespace tensorlane::nccl
