#include "client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "cuda_probe.hpp"
#include "tensorlane/ipc/doorbell.hpp"
#include "tensorlane/ipc/socket.hpp"

namespace tensorlane::shim {
namespace {

thread_local std::string t_last_error;

/// How long a control call waits for its reply. Lookups may connect to a peer first.
constexpr int kControlTimeoutMs = 60000;

ipc::MsgHeader header(ipc::MsgType type) {
    return ipc::MsgHeader{ipc::kControlMagic, ipc::kControlVersion, static_cast<uint16_t>(type), 0};
}

/// tl_wait's and tl_test's detail for a write that failed with `st`.
std::string writeFailure(int32_t st) {
    const Code c = static_cast<Code>(st);
    if (c == Code::kPermission) {
        return "write refused (TL_EPERM): the target's owner does not let this uid write it; "
               "the owner names who may with tl_expose_access";
    }
    return std::string("write failed: ") + ipc::codeName(c);
}

}  // namespace

const char *lastError() {
    return t_last_error.c_str();
}

tl_status fail(Code code, std::string message) {
    t_last_error = std::move(message);
    return toStatus(code);
}

std::string lastErrorText() {
    return t_last_error;
}

void setLastErrorText(std::string text) {
    t_last_error = std::move(text);
}

Client::~Client() {
    // The keeper first (it uses the socket and the rings), then every stream still waiting on
    // us is released; mappings and fds close in reverse order of declaration; closing the
    // socket is what tells the sidecar to release everything of ours.
    if (keeper_.joinable()) {
        ipc::ring(keeper_stop_.get());
        keeper_.join();
    }
    streams_.reset();
    for (auto &[base, buf] : buffers_) {
        if (buf.pinned) {
            unpinHostForCuda(buf.mapping->data());
        }
    }
}

Code Client::connect(const std::string &path) {
    if (int rc = ipc::connectSeqpacket(path, &sock_)) {
        t_last_error = "cannot connect to the sidecar at " + path + ": " + std::strerror(rc);
        return (rc == EACCES || rc == EPERM) ? Code::kPermission : Code::kConnection;
    }
    pollfd p{sock_.get(), POLLIN, 0};
    if (::poll(&p, 1, kControlTimeoutMs) <= 0) {
        t_last_error = "the sidecar at " + path + " did not greet us";
        return Code::kConnection;
    }
    ipc::HelloMsg hello{};
    ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
    size_t bytes = 0, nfds = 0;
    int rc = ipc::receiveMessage(sock_.get(), &hello, sizeof(hello), &bytes, fds, &nfds);
    if (rc || bytes != sizeof(hello) || hello.h.magic != ipc::kControlMagic ||
        hello.h.version != ipc::kControlVersion ||
        hello.h.type != static_cast<uint16_t>(ipc::MsgType::kHello)) {
        t_last_error = "bad greeting from the sidecar at " + path +
                       (rc ? std::string(": ") + std::strerror(rc) : std::string());
        return Code::kConnection;
    }
    hello.error[sizeof(hello.error) - 1] = '\0';
    hello.node_name[sizeof(hello.node_name) - 1] = '\0';
    if (hello.status != 0) {
        t_last_error = std::string("the sidecar refused us: ") + hello.error;
        return ipc::sanitizeCode(hello.status);
    }
    if (nfds != 3) {
        t_last_error = "the sidecar's greeting carried " + std::to_string(nfds) + " fds, not 3";
        return Code::kConnection;
    }
    uint64_t size = ipc::segmentSize(fds[0].get());
    if (size < hello.segment_bytes || hello.segment_bytes == 0) {
        t_last_error = "session segment smaller than announced";
        return Code::kConnection;
    }
    if (int mrc = ipc::mapSegment(fds[0].get(), hello.segment_bytes, &segment_)) {
        t_last_error = std::string("mmap of the session segment: ") + std::strerror(mrc);
        return Code::kNoMemory;
    }
    ipc::SegmentGeometry g;
    if (!ipc::validateSegment(segment_.data(), segment_.size(), &g)) {
        t_last_error = "session segment has a bad magic, version or geometry";
        return Code::kConnection;
    }
    view_ = ipc::SegmentView::at(segment_.data(), g);
    requests_ = ipc::RingProducer<ipc::Request>(view_.request_ctl, view_.requests, g.request_depth);
    completions_ = ipc::RingConsumer<ipc::Completion>(view_.completion_ctl, view_.completions,
                                                      g.completion_depth);
    notifications_ = ipc::RingConsumer<ipc::Notification>(
        view_.notification_ctl, view_.notifications, g.notification_depth);
    to_sidecar_ = std::move(fds[1]);
    to_client_ = std::move(fds[2]);
    node_name_ = hello.node_name;
    poll_mode_ = hello.poll_mode;
    spin_us_ = hello.spin_us;
    spin_window_us_ = spin_us_;
    depth_ = g.request_depth;
    tickets_ = TicketTable(depth_);
    return Code::kOk;
}

Code Client::call(void *msg, size_t bytes, ipc::ReplyMsg *reply, ipc::UniqueFd *fd_out,
                  std::string *text_out, int send_fd) {
    std::lock_guard lock(ctl_mu_);
    if (dead_.load(std::memory_order_acquire)) {
        t_last_error = "sidecar connection lost: " + dead_reason_;
        return Code::kConnection;
    }
    auto *h = static_cast<ipc::MsgHeader *>(msg);
    h->seq = ctl_seq_++;
    const int out_fds[1] = {send_fd};
    if (int rc = ipc::sendMessage(
            sock_.get(), msg, bytes,
            send_fd >= 0 ? std::span<const int>(out_fds, 1) : std::span<const int>())) {
        markDead(std::string("send: ") + std::strerror(rc));
        t_last_error = "sidecar connection lost: " + dead_reason_;
        return Code::kConnection;
    }
    std::string buf(ipc::kMaxControlMessage, '\0');
    for (;;) {
        pollfd p{sock_.get(), POLLIN, 0};
        int n = ::poll(&p, 1, kControlTimeoutMs);
        if (n == 0) {
            t_last_error = "the sidecar did not answer in time";
            return Code::kTimedOut;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        size_t got = 0, nfds = 0;
        ipc::UniqueFd fds[ipc::kMaxFdsPerMessage];
        int rc = ipc::receiveMessage(sock_.get(), buf.data(), buf.size(), &got, fds, &nfds);
        if (rc) {
            markDead(rc == ECONNRESET ? "the sidecar closed the connection"
                                      : std::string("receive: ") + std::strerror(rc));
            t_last_error = "sidecar connection lost: " + dead_reason_;
            return Code::kConnection;
        }
        if (got < sizeof(ipc::ReplyMsg)) {
            continue;  // not a reply; ignore
        }
        std::memcpy(reply, buf.data(), sizeof(*reply));
        if (reply->h.magic != ipc::kControlMagic ||
            reply->h.type != static_cast<uint16_t>(ipc::MsgType::kReply) ||
            reply->h.seq != h->seq) {
            continue;  // a stale reply (an earlier call timed out); ours follows
        }
        reply->error[sizeof(reply->error) - 1] = '\0';
        if (fd_out && nfds > 0) {
            *fd_out = std::move(fds[0]);
        }
        if (text_out) {
            size_t len = std::min<size_t>(reply->value0, got - sizeof(ipc::ReplyMsg));
            text_out->assign(buf.data() + sizeof(ipc::ReplyMsg), len);
        }
        Code c = ipc::sanitizeCode(reply->status);
        if (c != Code::kOk) {
            t_last_error = reply->error;
        }
        return c;
    }
}

tl_status Client::allocHost(size_t bytes, void **ptr, tl_region *out) {
    if (bytes == 0) {
        return fail(Code::kInvalid, "tl_alloc_host: zero bytes");
    }
    ipc::AllocHostMsg m{header(ipc::MsgType::kAllocHost), bytes};
    ipc::ReplyMsg reply{};
    ipc::UniqueFd fd;
    Code c = call(&m, sizeof(m), &reply, &fd);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    auto mapping = std::make_unique<ipc::Mapping>();
    if (!fd || ipc::segmentSize(fd.get()) < reply.value1) {
        return fail(Code::kInternal, "tl_alloc_host: the sidecar sent no usable buffer");
    }
    if (int rc = ipc::mapSegment(fd.get(), reply.value1, mapping.get())) {
        ipc::DeregisterMsg d{header(ipc::MsgType::kDeregister), reply.value0};
        ipc::ReplyMsg ignored{};
        (void)call(&d, sizeof(d), &ignored, nullptr);
        return fail(Code::kNoMemory, std::string("tl_alloc_host: mmap: ") + std::strerror(rc));
    }
    auto *base = static_cast<unsigned char *>(mapping->data());
    // Page-locked for CUDA when this process uses it, so its own copies between this buffer
    // and the GPU are DMA, not staged by the driver.
    const bool pinned = pinHostForCuda(mapping->data(), mapping->size());
    {
        std::unique_lock lock(reg_mu_);
        regions_[reply.value0] = LocalRegion{base, bytes, 0};
        buffers_[reinterpret_cast<uintptr_t>(base)] =
            HostBuffer{reply.value0, std::move(mapping), pinned};
    }
    *ptr = base;
    *out = reply.value0;
    return TL_OK;
}

tl_status Client::registerMemory(void *ptr, size_t bytes, tl_region *out) {
    if (!ptr || bytes == 0) {
        return fail(Code::kInvalid, "tl_register: null pointer or zero bytes");
    }
    const auto addr = reinterpret_cast<uintptr_t>(ptr);
    tl_region parent = 0;
    uint64_t offset = 0;
    {
        std::shared_lock lock(reg_mu_);
        auto it = buffers_.upper_bound(addr);
        if (it != buffers_.begin()) {
            --it;
            const uint64_t size = it->second.mapping->size();
            const uint64_t off = addr - it->first;
            if (off < size && bytes <= size - off) {
                parent = it->second.region;
                offset = off;
            }
        }
    }
    if (parent == 0) {
#ifdef TENSORLANE_HAVE_CUDA
        return registerCuda(ptr, bytes, out);
#else
        if (probePointer(ptr) == PointerKind::kCudaDevice) {
            return fail(Code::kCuda,
                        "tl_register: CUDA device memory needs a libtensorlane built with the "
                        "CUDA toolkit; use tl_alloc_host buffers");
        }
        return fail(Code::kInvalid,
                    "tl_register: host memory must lie inside a buffer from tl_alloc_host");
#endif
    }
    ipc::RegisterMsg m{};
    m.h = header(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kHost);
    m.parent = parent;
    m.offset = offset;
    m.bytes = bytes;
    m.address = addr;
    ipc::ReplyMsg reply{};
    Code c = call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    {
        std::unique_lock lock(reg_mu_);
        regions_[reply.value0] = LocalRegion{static_cast<unsigned char *>(ptr), bytes, parent};
    }
    *out = reply.value0;
    return TL_OK;
}

tl_status Client::deregister(tl_region r) {
    {
        std::shared_lock lock(reg_mu_);
        if (!regions_.count(r)) {
            return fail(Code::kNotFound, "tl_deregister: no region " + std::to_string(r));
        }
    }
    ipc::DeregisterMsg m{header(ipc::MsgType::kDeregister), r};
    ipc::ReplyMsg reply{};
    Code c = call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    {
        std::lock_guard lock(comp_mu_);
        if (streams_) {
            streams_->dropRegion(r);  // the sidecar released the streams waiting on it
        }
    }
    std::unique_lock lock(reg_mu_);
    auto it = regions_.find(r);
    if (it != regions_.end() && it->second.cuda) {
        std::lock_guard cl(cuda_mu_);
        cuda_exports_.dropRegion(it->second.cuda_key);
    } else if (it != regions_.end() && it->second.parent == 0) {
        // A tl_alloc_host buffer: its ranges went with it at the sidecar; unmap it here too.
        for (auto ri = regions_.begin(); ri != regions_.end();) {
            ri = ri->second.parent == r ? regions_.erase(ri) : std::next(ri);
        }
        auto bi = buffers_.find(reinterpret_cast<uintptr_t>(it->second.base));
        if (bi != buffers_.end()) {
            if (bi->second.pinned) {
                unpinHostForCuda(bi->second.mapping->data());
            }
            buffers_.erase(bi);
        }
    }
    regions_.erase(r);
    return TL_OK;
}

tl_status Client::expose(tl_region r, const char *name) {
    return exposeAccess(r, name, nullptr);
}

tl_status Client::exposeAccess(tl_region r, const char *name, const tl_access *access) {
    const char *what = access ? "tl_expose_access" : "tl_expose";
    if (!name || !*name || std::strlen(name) >= ipc::kRegionNameBytes) {
        return fail(Code::kInvalid, std::string(what) + ": a name is 1-63 bytes");
    }
    ipc::ReplyMsg reply{};
    if (!access) {
        ipc::ExposeMsg m{};
        m.h = header(ipc::MsgType::kExpose);
        m.region = r;
        ipc::copyName(m.name, sizeof(m.name), name);
        return toStatus(call(&m, sizeof(m), &reply, nullptr));
    }
    static_assert(TL_ACCESS_PEERS == ipc::kAccessPeers &&
                  TL_ACCESS_LOCAL_ANY == ipc::kAccessLocalAny);
    static_assert(TL_ACCESS_MAX_IDS == ipc::kMaxAccessIds);
    if ((access->flags & ~ipc::kAccessFlagMask) != 0) {
        return fail(Code::kInvalid, "tl_expose_access: unknown flags " +
                                        std::to_string(access->flags) +
                                        " (TL_ACCESS_PEERS | TL_ACCESS_LOCAL_ANY)");
    }
    if (access->n_uids > ipc::kMaxAccessIds || access->n_gids > ipc::kMaxAccessIds) {
        return fail(Code::kInvalid, "tl_expose_access: at most " +
                                        std::to_string(ipc::kMaxAccessIds) + " uids and " +
                                        std::to_string(ipc::kMaxAccessIds) + " gids (got " +
                                        std::to_string(access->n_uids) + " and " +
                                        std::to_string(access->n_gids) + ")");
    }
    if ((access->n_uids != 0 && !access->uids) || (access->n_gids != 0 && !access->gids)) {
        return fail(Code::kInvalid, "tl_expose_access: uids or gids is NULL with a count");
    }
    ipc::ExposeAccessMsg m{};
    m.h = header(ipc::MsgType::kExposeAccess);
    m.region = r;
    ipc::copyName(m.name, sizeof(m.name), name);
    m.flags = access->flags;
    m.n_uids = access->n_uids;
    m.n_gids = access->n_gids;
    std::copy_n(access->uids, access->n_uids, m.uids);
    std::copy_n(access->gids, access->n_gids, m.gids);
    return toStatus(call(&m, sizeof(m), &reply, nullptr));
}

tl_status Client::lookup(const char *peer, const char *name, tl_remote *out, uint64_t *bytes) {
    if (!peer || !*peer || std::strlen(peer) >= ipc::kPeerNameBytes || !name || !*name ||
        std::strlen(name) >= ipc::kRegionNameBytes || !out) {
        return fail(Code::kInvalid, "tl_lookup: peer and name are 1-63 bytes; out is required");
    }
    ipc::LookupMsg m{};
    m.h = header(ipc::MsgType::kLookup);
    ipc::copyName(m.peer, sizeof(m.peer), peer);
    ipc::copyName(m.name, sizeof(m.name), name);
    ipc::ReplyMsg reply{};
    Code c = call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    {
        std::unique_lock lock(reg_mu_);
        remotes_[reply.value0] = reply.value1;
    }
    *out = reply.value0;
    if (bytes) {
        *bytes = reply.value1;
    }
    return TL_OK;
}

tl_status Client::sidecarStatus(std::string *json) {
    ipc::StatusMsg m{header(ipc::MsgType::kStatus), 0, 0};
    ipc::ReplyMsg reply{};
    return toStatus(call(&m, sizeof(m), &reply, nullptr, json));
}

bool Client::validWrite(const tl_write_desc &w, std::string *why) const {
    if (w.bytes == 0) {
        *why = "zero bytes";
        return false;
    }
    auto s = regions_.find(w.src);
    if (s == regions_.end()) {
        *why = "unknown source region " + std::to_string(w.src);
        return false;
    }
    if (w.src_off > s->second.bytes || w.bytes > s->second.bytes - w.src_off) {
        *why = "source offset + bytes past the region's end";
        return false;
    }
    auto d = remotes_.find(w.dst);
    if (d == remotes_.end()) {
        *why = "unknown remote " + std::to_string(w.dst) + " (not from tl_lookup)";
        return false;
    }
    if (w.dst_off > d->second || w.bytes > d->second - w.dst_off) {
        *why = "target offset + bytes past the region's end";
        return false;
    }
    return true;
}

tl_status Client::write(const tl_write_desc *w, size_t n, tl_ticket *out, size_t *submitted) {
    if (!w || !out || n == 0) {
        return fail(Code::kInvalid, "tl_write: no writes or no ticket pointer");
    }
    std::vector<ipc::Request> reqs(n);
    {
        // Wrong on its face fails here (DESIGN.md), and then none of the batch is submitted;
        // the sidecar checks everything again.
        std::shared_lock lock(reg_mu_);
        std::string why;
        for (size_t i = 0; i < n; ++i) {
            if (!validWrite(w[i], &why)) {
                return fail(Code::kInvalid,
                            n == 1 ? "tl_write: " + why
                                   : "tl_write_batch: entry " + std::to_string(i) + ": " + why);
            }
            ipc::Request &r = reqs[i];
            r.op = static_cast<uint8_t>(ipc::Op::kWrite);
            r.imm = w[i].imm;
            r.src_region = w[i].src;
            r.src_offset = w[i].src_off;
            r.dst_remote = w[i].dst;
            r.dst_offset = w[i].dst_off;
            r.bytes = w[i].bytes;
        }
    }
    return submit(reqs.data(), n, out, submitted);
}

tl_status Client::nop(size_t n, tl_ticket *out, size_t *submitted) {
    if (!out || n == 0) {
        return fail(Code::kInvalid, "tl_nop: no ticket pointer");
    }
    ipc::Request r{};
    r.op = static_cast<uint8_t>(ipc::Op::kNop);
    if (n == 1) {
        return submit(&r, 1, out, submitted);
    }
    std::vector<ipc::Request> reqs(n, r);
    return submit(reqs.data(), n, out, submitted);
}

tl_status Client::submit(ipc::Request *reqs, size_t n, tl_ticket *out, size_t *submitted) {
    size_t k = 0;
    bool corrupt = false;
    {
        std::lock_guard lock(comp_mu_);
        if (dead_.load(std::memory_order_acquire)) {
            return fail(Code::kConnection, "sidecar connection lost: " + dead_reason_);
        }
        // At most `depth` tickets outstanding, so the sidecar's completion ring never has to
        // hold more than it can.
        if (tickets_.pending() + n > depth_) {
            drainLocked();
        }
        size_t room = depth_ > tickets_.pending() ? depth_ - tickets_.pending() : 0;
        k = std::min<size_t>(
            {n, room, requests_.freeSlots(static_cast<uint32_t>(std::min<size_t>(n, depth_)))});
        for (size_t i = 0; i < k; ++i) {
            reqs[i].ticket = next_ticket_;
            out[i] = next_ticket_;
            uint16_t slot = 0;
            // Once the client has a stream segment every write gets a slot, so that
            // tl_stream_wait_ticket works on any ticket (the sidecar stores the ticket there
            // when the write ends). Without a free slot it goes without one.
            if (streams_ && reqs[i].op == static_cast<uint8_t>(ipc::Op::kWrite) &&
                streams_->takeSlot(next_ticket_, false, &slot)) {
                reqs[i].flags = ipc::kRequestHasSlot;
                reqs[i].slot = slot;
            }
            (void)requests_.push(reqs[i]);  // freeSlots() said there is room
            tickets_.addPending(next_ticket_++);
        }
        if (k > 0) {
            requests_.publish();  // under the lock: it publishes every entry pushed so far
        }
        corrupt = requests_.corrupt();
    }
    if (submitted) {
        *submitted = k;
    }
    if (k > 0) {
        ringSidecar();
    }
    if (k < n) {
        if (corrupt) {
            return fail(Code::kConnection, "request ring corrupted");
        }
        return fail(Code::kAgain,
                    std::to_string(depth_) + " requests outstanding; wait on a ticket and retry");
    }
    return TL_OK;
}

void Client::ringSidecar() {
    // SYNC POINT: seq_cst fence between publishing the slots and reading sidecar_sleeping;
    // pairs with the fence in the sidecar's armSleep() (Dekker): one of us sees the other.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (view_.header->sidecar_sleeping.value.load(std::memory_order_relaxed) != 0) {
        ipc::ring(to_sidecar_.get());
    }
}

void Client::drainLocked(bool all) {
    uint32_t released = 0;
    uint32_t n = completions_.available();
    for (uint32_t i = 0; i < n; ++i) {
        ipc::Completion c = completions_.read(i);
        tickets_.complete(c.ticket, static_cast<int32_t>(ipc::sanitizeCode(c.status)));
        if (streams_) {
            streams_->ticketEnded(c.ticket);
        }
    }
    if (n) {
        completions_.release(n);
        released += n;
    }
    // Notifications are kept here until tl_wait_notification takes them, but only so many:
    // beyond that they stay in the ring, the ring fills, and the sidecar's bounded backlog
    // for this client takes over (past [limits] notification_backlog it drops notifications
    // and counts them in the next one delivered: tl_notification_ex.dropped). The process
    // never grows without bound because its code forgot to wait for notifications.
    n = notifications_.available();
    if (!all && notes_.size() + n > maxNotes()) {
        n = notes_.size() < maxNotes() ? static_cast<uint32_t>(maxNotes() - notes_.size()) : 0;
    }
    for (uint32_t i = 0; i < n; ++i) {
        ipc::Notification in = notifications_.read(i);
        tl_notification_ex out{};
        out.n.region = in.region;
        out.n.imm = in.imm;
        out.n.offset = in.offset;
        out.n.bytes = in.bytes;
        std::memcpy(out.n.peer, in.peer, sizeof(out.n.peer));
        out.n.peer[sizeof(out.n.peer) - 1] = '\0';
        out.writer_uid = in.writer_uid;
        // The sidecar's count of notifications it dropped for this client before this one
        // (h-engine names the field `dropped`; reserved2[0] until that rename is merged).
        out.dropped = in.reserved2[0];
        notes_.push_back(out);
    }
    if (n) {
        notifications_.release(n);
        released += n;
    }
    if (released != 0) {
        // SYNC POINT: seq_cst fence between releasing slots and reading sidecar_sleeping; pairs
        // with the fence in the sidecar's armSleep(), which raises the flag and then looks at
        // our heads for room for a backlog it holds (Dekker). Without this ring a sidecar with
        // a backlog for us would sleep until its idle tick although we made room.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (view_.header->sidecar_sleeping.value.load(std::memory_order_relaxed) != 0) {
            ipc::ring(to_sidecar_.get());
        }
    }
}

bool Client::ringsChanged() const {
    // Only the slots' sequence words, never the cursors: reading a word the sidecar has not
    // written since is a hit in our cache, so the spin costs the sidecar nothing.
    auto changed = [](const auto &ring, const SlotWatch &w) {
        const uint64_t now = ring.sequenceAt(w.pos);
        return now != w.word || now == w.pos + 1;
    };
    return changed(completions_, comp_watch_) || changed(notifications_, notif_watch_);
}

bool Client::sidecarHungUp() {
    pollfd p{sock_.get(), POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLRDHUP | POLLERR));
}

void Client::markDead(const std::string &why) {
    // Called with comp_mu_ held or from a control call; dead_ is atomic, the reason is written
    // once before it is set.
    if (!dead_.exchange(true)) {
        dead_reason_ = why;
    }
}

bool Client::sidecarGone() {
    if (dead_.load(std::memory_order_acquire)) {
        return true;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - last_hangup_check_ < std::chrono::milliseconds(1)) {
        return false;
    }
    last_hangup_check_ = now;
    if (sidecarHungUp()) {
        markDead("the sidecar went away");
        return true;
    }
    return false;
}

void Client::adaptSpin(std::chrono::steady_clock::duration slept, bool woke_with_news) {
    // Adaptive mode's spin window, like KVM's halt polling: a sleep that ended soon with news
    // means spinning a little longer would have caught it without a wake-up (which costs tens
    // to hundreds of microseconds on a busy or virtual machine), so the window grows toward
    // twice that sleep; a long or empty sleep means the client is idle, so it falls back to
    // spin_us and the idle cost stays what the configuration says.
    constexpr int64_t kMaxWindowUs = 1000;
    constexpr int64_t kShortSleepUs = 2000;
    const int64_t us = std::chrono::duration_cast<std::chrono::microseconds>(slept).count();
    if (woke_with_news && us < kShortSleepUs) {
        int64_t grown = std::max<int64_t>(2 * spin_window_us_, 2 * us);
        spin_window_us_ = static_cast<uint32_t>(std::min<int64_t>(grown, kMaxWindowUs));
    } else {
        spin_window_us_ = spin_us_;
    }
}

bool Client::waitForActivity(std::chrono::steady_clock::time_point deadline) {
    using Clock = std::chrono::steady_clock;
    // Spin first (busy: until the deadline; adaptive: the current window; event: not at all).
    // The clock is read once per 64 looks at the slots, and first after the first 64: a look
    // is a cache hit until the sidecar writes, and on a virtual machine a clock read can cost
    // as much as a third of a whole no-op round trip.
    Clock::time_point spin_until{};
    uint32_t turns = 0;
    while (poll_mode_ != 2) {
        for (int i = 0; i < 64; ++i) {
            if (ringsChanged()) {
                return false;
            }
        }
        const auto now = Clock::now();
        if (turns == 0) {
            spin_until =
                poll_mode_ == 0 ? deadline : now + std::chrono::microseconds(spin_window_us_);
        }
        if (now >= spin_until) {
            break;
        }
        if ((++turns & 0x3f) == 0 && sidecarHungUp()) {
            return true;
        }
    }
    if (poll_mode_ == 0) {
        return false;
    }
    bool hung_up = false;
    view_.header->client_waiting.value.store(1, std::memory_order_relaxed);
    // SYNC POINT: seq_cst fence between raising client_waiting and re-reading the slots; pairs
    // with the fence in the sidecar's Session::publish() (Dekker).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (!ringsChanged()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
        int timeout = static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, 1000));
        pollfd p[2] = {{to_client_.get(), POLLIN, 0}, {sock_.get(), POLLRDHUP, 0}};
        auto slept_from = Clock::now();
        ::poll(p, 2, timeout);
        if (p[0].revents & POLLIN) {
            ipc::drain(to_client_.get());
        }
        hung_up = (p[1].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0;
        if (poll_mode_ == 1) {
            adaptSpin(Clock::now() - slept_from, ringsChanged());
        }
    }
    view_.header->client_waiting.value.store(0, std::memory_order_relaxed);
    return hung_up;
}

void Client::waitTurn(std::unique_lock<std::mutex> &lock,
                      std::chrono::steady_clock::time_point deadline) {
    using Clock = std::chrono::steady_clock;
    if (polling_) {
        // Another thread sleeps on the doorbell; it wakes us when it has drained news.
        comp_cv_.wait_until(lock,
                            std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
        return;
    }
    polling_ = true;
    comp_watch_.pos = completions_.head();
    comp_watch_.word = completions_.sequenceAt(comp_watch_.pos);
    notif_watch_.pos = notifications_.head();
    notif_watch_.word = notifications_.sequenceAt(notif_watch_.pos);
    lock.unlock();
    bool hung_up = waitForActivity(deadline);
    lock.lock();
    if (hung_up) {
        markDead("the sidecar went away");
    }
    polling_ = false;
    comp_cv_.notify_all();
}

tl_status Client::wait(tl_ticket t, int timeout_ms) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock lock(comp_mu_);
    bool first = true;
    for (;;) {
        // The table first: after one drain, a batch's other tickets are already there and
        // need no look at shared memory.
        int32_t st = tickets_.state(t);
        if (st == TicketTable::kPending) {
            drainLocked();
            st = tickets_.state(t);
        }
        if (st == TicketTable::kUnknown) {
            return fail(Code::kNotFound, "tl_wait: unknown ticket " + std::to_string(t) +
                                             " (never issued, or already waited for)");
        }
        if (st != TicketTable::kPending) {
            tickets_.erase(t);
            return st == 0 ? TL_OK : fail(static_cast<Code>(st), writeFailure(st));
        }
        // An endless wait skips this before its first turn: the polling thread watches the
        // socket too, and the clock read in sidecarGone() would sit between submitting and
        // looking for the completion. A wait with a timeout (a tl_wait(t, 0) poll loop) must
        // see a dead sidecar on every call.
        if ((!first || timeout_ms >= 0) && sidecarGone()) {
            tickets_.failPending(static_cast<int32_t>(Code::kConnection));
            continue;
        }
        first = false;
        if (deadline != Clock::time_point::max() && Clock::now() >= deadline) {
            return fail(Code::kTimedOut, "tl_wait: ticket " + std::to_string(t) + " pending");
        }
        waitTurn(lock, deadline);
    }
}

tl_status Client::test(tl_ticket t, int *done) {
    if (!done) {
        return fail(Code::kInvalid, "tl_test: done is NULL");
    }
    std::unique_lock lock(comp_mu_);
    int32_t st = tickets_.state(t);
    if (st == TicketTable::kPending) {
        drainLocked();
        st = tickets_.state(t);
    }
    if (st == TicketTable::kUnknown) {
        return fail(Code::kNotFound, "tl_test: unknown ticket " + std::to_string(t));
    }
    if (st == TicketTable::kPending) {
        if (sidecarGone()) {
            tickets_.failPending(static_cast<int32_t>(Code::kConnection));
            st = static_cast<int32_t>(Code::kConnection);
        } else {
            *done = 0;
            return TL_OK;
        }
    }
    tickets_.erase(t);
    *done = 1;
    return st == 0 ? TL_OK : fail(static_cast<Code>(st), writeFailure(st));
}

tl_status Client::waitNotification(tl_notification *out, int timeout_ms) {
    if (!out) {
        return fail(Code::kInvalid, "tl_wait_notification: out is NULL");
    }
    tl_notification_ex ex{};
    tl_status st = waitNotificationEx(&ex, timeout_ms, "tl_wait_notification");
    if (st == TL_OK) {
        *out = ex.n;
    }
    return st;
}

tl_status Client::waitNotificationEx(tl_notification_ex *out, int timeout_ms) {
    return waitNotificationEx(out, timeout_ms, "tl_wait_notification_ex");
}

tl_status Client::waitNotificationEx(tl_notification_ex *out, int timeout_ms, const char *what) {
    using Clock = std::chrono::steady_clock;
    if (!out) {
        return fail(Code::kInvalid, std::string(what) + ": out is NULL");
    }
    const auto deadline = timeout_ms < 0 ? Clock::time_point::max()
                                         : Clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_lock lock(comp_mu_);
    for (;;) {
        drainLocked();
        if (!notes_.empty()) {
            *out = notes_.front();
            notes_.pop_front();
            return TL_OK;
        }
        if (sidecarGone()) {
            return fail(Code::kConnection, "sidecar connection lost: " + dead_reason_);
        }
        if (Clock::now() >= deadline) {
            return fail(Code::kTimedOut, std::string(what) + ": nothing arrived");
        }
        waitTurn(lock, deadline);
    }
}

}  // namespace tensorlane::shim
