#include "net.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tensorlane::nccl {
namespace {

using Clock = std::chrono::steady_clock;

/// How long a comm waits with nothing from its peer before it probes the peer's mailbox, and
/// how often a connect() that found no listener yet tries again.
constexpr auto kProbeAfter = std::chrono::milliseconds(500);
constexpr auto kConnectRetry = std::chrono::milliseconds(20);
constexpr size_t kMailboxBytes = 4096;

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

/// A status of a write that says the other end is gone (its region, process or sidecar).
bool peerGone(tl_status s) {
    return s == TL_ENOENT || s == TL_EPEER || s == TL_ECONN || s == TL_EDEADLINE;
}

/// The device's speed for NCCL's tuner, in Mb/s: TENSORLANE_NCCL_SPEED_MBPS, else the
/// sidecar's link rate (the verbs port's, `link_mbps` in its status), else 10 Gb/s (what NCCL's
/// Socket transport assumes when it cannot read a speed; the tcp transport has no port rate).
int linkSpeed(tl_client *c) {
    if (const char *env = std::getenv("TENSORLANE_NCCL_SPEED_MBPS")) {
        char *end = nullptr;
        const long v = std::strtol(env, &end, 10);
        if (end != env && *end == '\0' && v > 0 && v <= 100'000'000) {
            return static_cast<int>(v);
        }
    }
    std::string buf(1 << 16, '\0');
    size_t len = 0;
    for (int i = 0; i < 2; ++i) {
        if (tl_sidecar_status(c, buf.data(), buf.size(), &len) != TL_OK) {
            return 10000;
        }
        if (len < buf.size()) {
            break;
        }
        buf.assign(len + 1, '\0');
    }
    const char *key = std::strstr(buf.c_str(), "\"link_mbps\":");
    if (key == nullptr) {
        return 10000;
    }
    const unsigned long long v = std::strtoull(key + std::strlen("\"link_mbps\":"), nullptr, 10);
    return v > 0 && v <= 100'000'000 ? static_cast<int>(v) : 10000;
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
    node_ = tl_node_name(c);
    nonce_ = randomNonce();
    speed_mbps_ = linkSpeed(c);
    const char *trace = std::getenv("TENSORLANE_NCCL_TRACE");
    trace_ = trace != nullptr && std::strcmp(trace, "1") == 0;
    if (trace_) {
        std::thread([this] { watchdog(); }).detach();
    }
    log(NCCL_LOG_INFO, "using the sidecar of node %s (process nonce %016llx), speed %d Mb/s",
        node_.c_str(), static_cast<unsigned long long>(nonce_), speed_mbps_);
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
    std::memcpy(payload + sizeof(h), body, bytes);
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
    l->pending.pop_front();
    c->connected = true;
    c->last_progress = Clock::now();
    // The sender learns this comm (and its mailbox, for its probes) from this first message.
    if (ncclResult_t r = send(c, Wire::kPing, 0, nullptr, 0, c->peer_mailbox, nullptr);
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
        // NCCL's host buffers are its own (cudaHostAlloc): a shadow the sidecar can reach.
        void *p = nullptr;
        s = tl_alloc_host(client_, mr->size, &p, &mr->region);
        mr->shadow = static_cast<unsigned char *>(p);
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
    if (c->kind == 'R') {
        const std::string name = regionName(nonce_, 'M', mr->id);
        if (tl_expose(client_, mr->region, name.c_str()) != TL_OK) {
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
        log(NCCL_LOG_INFO, "trace: deregMr comm %c%llu mr %u", c->kind,
            static_cast<unsigned long long>(c->id), mr->id);
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
    CtsBody body{};
    for (int i = 0; i < n; ++i) {
        auto *mr = static_cast<Mr *>(mhandles[i]);
        auto *p = static_cast<unsigned char *>(data[i]);
        if (mr == nullptr ||
            (sizes[i] != 0 && (p < mr->user || p + sizes[i] > mr->user + mr->size))) {
            log(NCCL_LOG_WARN, "irecv: buffer %d (%p, %llu bytes) is outside its MR", i, data[i],
                static_cast<unsigned long long>(sizes[i]));
            return ncclInvalidArgument;
        }
        const uint64_t off = mr->user != nullptr ? static_cast<uint64_t>(p - mr->user) : 0;
        body.entries[i] = CtsEntry{mr->id, tags[i], off, sizes[i]};
        r->mrs[i] = mr;
        r->data[i] = p;
        r->offsets[i] = off;
        r->posted[i] = sizes[i];
        r->sizes[i] = 0;
        r->landed[i] = false;
    }
    ++r->generation;
    body.request = r->slot;
    body.generation = r->generation;
    const size_t bytes = offsetof(CtsBody, entries) + sizeof(CtsEntry) * static_cast<size_t>(n);
    if (ncclResult_t res =
            send(c, Wire::kCts, static_cast<uint8_t>(n), &body, bytes, c->peer_mailbox, nullptr);
        res != ncclSuccess) {
        return res;
    }
    r->free = false;
    r->n = n;
    r->done = 0;
    if (trace_) {
        r->since = Clock::now();
        r->stall_told = false;
        log(NCCL_LOG_INFO, "trace: comm R%llu irecv slot %u gen %u n %d size0 %llu tag0 %d mr0 %u",
            static_cast<unsigned long long>(c->id), r->slot, r->generation, n,
            static_cast<unsigned long long>(sizes[0]), tags[0], body.entries[0].mr);
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
    if (c->cts.empty()) {
        checkAlive(c);
        traceStall(c, "isend waits for a CTS");
        return c->error.empty() ? ncclSuccess : ncclRemoteError;
    }
    Comm::Cts &slot = c->cts.front();
    int e = -1;
    for (int i = 0; i < slot.count; ++i) {
        if (!slot.used[i] && slot.body.entries[i].tag == tag) {
            e = i;
            break;
        }
    }
    if (e < 0) {
        traceStall(c, "isend's tag is not the oldest CTS's");
        return ncclSuccess;  // the oldest posted receive waits for another tag first
    }
    const CtsEntry entry = slot.body.entries[e];
    if (size > entry.size) {
        return fail(c, "a send of " + std::to_string(size) + " bytes (tag " + std::to_string(tag) +
                           ") into a receive of " + std::to_string(entry.size) +
                           ": message truncated");
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
    tl_remote dst = 0;
    if (auto it = c->remote_mrs.find(entry.mr); it != c->remote_mrs.end()) {
        dst = it->second;
    } else {
        const std::string name = regionName(c->peer_nonce, 'M', entry.mr);
        if (tl_status s = tl_lookup(client_, c->peer_node.c_str(), name.c_str(), &dst, nullptr);
            s != TL_OK) {
            return fail(c, "the receiver's buffer " + name + ": " + tl_status_str(s) + ": " +
                               tl_last_error());
        }
        c->remote_mrs[entry.mr] = dst;
    }
    const uint64_t off = static_cast<uint64_t>(p - mr->user);
    if (mr->shadow != nullptr && size != 0) {
        std::memcpy(mr->shadow + off, p, size);  // NCCL's host buffer into the sidecar's reach
    }
    tl_ticket t = 0;
    tl_status s = TL_OK;
    if (size != 0) {
        // The bytes with an immediate naming the receiver's request and entry.
        s = tl_write(client_, mr->region, off, dst, entry.offset, size,
                     dataImm(slot.body.request, slot.body.generation, static_cast<uint32_t>(e)),
                     &t);
    } else {
        // No bytes to write: a DATA message says the entry is done.
        const DataBody body{slot.body.request, slot.body.generation, static_cast<uint32_t>(e), 0,
                            0};
        s = postMessage(c, Wire::kData, 1, slot.from, &body, sizeof(body), dst, &t);
    }
    if (s == TL_EAGAIN) {
        traceStall(c, "the ring is full");
        return ncclSuccess;  // the ring is full: NCCL tries again
    }
    if (s != TL_OK) {
        return fail(c, std::string("write: ") + tl_status_str(s) + ": " + tl_last_error());
    }
    slot.used[e] = true;
    if (--slot.left == 0) {
        c->cts.pop_front();
    }
    r->free = false;
    r->ticket = t;
    r->size = size;
    ++r->generation;
    if (trace_) {
        r->since = Clock::now();
        r->stall_told = false;
        log(NCCL_LOG_INFO,
            "trace: comm S%llu isend slot %u size %llu tag %d into R%llu slot %u gen %u entry %d "
            "mr %u off %llu ticket %llu",
            static_cast<unsigned long long>(c->id), r->slot, static_cast<unsigned long long>(size),
            tag, static_cast<unsigned long long>(slot.from), slot.body.request,
            slot.body.generation, e, entry.mr, static_cast<unsigned long long>(entry.offset),
            static_cast<unsigned long long>(t));
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
        c->last_progress = Clock::now();
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
    log(NCCL_LOG_INFO, "trace: comm S%llu: %s (%zu CTS queued, oldest tag %d, %d left)",
        static_cast<unsigned long long>(c->id), what, c->cts.size(),
        c->cts.empty() ? -1 : c->cts.front().body.entries[0].tag,
        c->cts.empty() ? 0 : c->cts.front().left);
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
                log(NCCL_LOG_INFO, "trace: a data write into region %llu of no receive comm",
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
    const unsigned char *body = m.payload + sizeof(h);
    const size_t body_bytes = m.payload_bytes - sizeof(h);
    switch (static_cast<Wire>(h.type)) {
        case Wire::kConnect:
            if (c->kind == 'L') {
                c->pending.push_back({m.ex.n.peer, h.nonce, h.from});
            }
            return;
        case Wire::kCts: {
            if (c->kind != 'S' || h.count < 1 || h.count > kMaxRecvs ||
                body_bytes < offsetof(CtsBody, entries) + sizeof(CtsEntry) * h.count) {
                return;
            }
            Comm::Cts cts;
            cts.from = h.from;
            std::memcpy(&cts.body, body, offsetof(CtsBody, entries) + sizeof(CtsEntry) * h.count);
            cts.count = h.count;
            cts.left = h.count;
            learnReceiver(c, h);
            if (trace_) {
                log(NCCL_LOG_INFO,
                    "trace: comm S%llu CTS from R%llu slot %u gen %u n %d size0 %llu",
                    static_cast<unsigned long long>(c->id), static_cast<unsigned long long>(h.from),
                    cts.body.request, cts.body.generation, cts.count,
                    static_cast<unsigned long long>(cts.body.entries[0].size));
            }
            c->cts.push_back(cts);
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
            log(NCCL_LOG_INFO,
                "trace: comm R%llu dropped a landing: slot %u gen %u (has %u, free %d) entry %u "
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
    Mr *mr = r.mrs[index];
    if (mr->shadow != nullptr && size != 0) {
        std::memcpy(r.data[index], mr->shadow + r.offsets[index], size);
    }
    r.sizes[index] = size;
    r.landed[index] = true;
    ++r.done;
    if (trace_) {
        log(NCCL_LOG_INFO, "trace: comm R%llu slot %u entry %u landed %llu bytes",
            static_cast<unsigned long long>(c->id), slot, index,
            static_cast<unsigned long long>(size));
    }
    c->last_progress = Clock::now();
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
        log(NCCL_LOG_INFO, "trace: close comm %c%llu", c->kind,
            static_cast<unsigned long long>(c->id));
    }
    release(c);
    return ncclSuccess;
}

}  // namespace tensorlane::nccl
