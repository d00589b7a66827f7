#include "client.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <vector>

#include "cuda_probe.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::shim {

Client::~Client() {
    // The keeper first (it uses the socket and the rings), then every stream still waiting on
    // us is released; the parts go in reverse order of declaration (the host buffers are
    // unpinned before they are unmapped); closing the socket is what tells the sidecar to
    // release everything of ours.
    if (keeper_.joinable()) {
        ipc::ring(keeper_stop_.get());
        keeper_.join();
    }
    rings_.resetStreams();
}

Code Client::connect(const std::string &path) {
    ControlChannel::Greeting g;
    if (Code c = control_.connect(path, &g); c != Code::kOk) {
        return c;
    }
    if (Code c = rings_.open(std::move(g.segment), g.hello.segment_bytes, std::move(g.to_sidecar));
        c != Code::kOk) {
        return c;
    }
    waiter_.configure(g.hello.poll_mode, g.hello.spin_us, std::move(g.to_client));
    node_name_ = g.hello.node_name;
    return Code::kOk;
}

tl_status Client::allocHost(size_t bytes, void **ptr, tl_region *out) {
    if (bytes == 0) {
        return fail(Code::kInvalid, "tl_alloc_host: zero bytes");
    }
    ipc::AllocHostMsg m{messageHeader(ipc::MsgType::kAllocHost), bytes};
    ipc::ReplyMsg reply{};
    ipc::UniqueFd fd;
    Code c = control_.call(&m, sizeof(m), &reply, &fd);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    auto mapping = std::make_unique<ipc::Mapping>();
    if (!fd || ipc::segmentSize(fd.get()) < reply.value1) {
        return fail(Code::kInternal, "tl_alloc_host: the sidecar sent no usable buffer");
    }
    if (int rc = ipc::mapSegment(fd.get(), reply.value1, mapping.get())) {
        ipc::DeregisterMsg d{messageHeader(ipc::MsgType::kDeregister), reply.value0};
        ipc::ReplyMsg ignored{};
        (void)control_.call(&d, sizeof(d), &ignored, nullptr);
        return fail(Code::kNoMemory, std::string("tl_alloc_host: mmap: ") + std::strerror(rc));
    }
    auto *base = static_cast<unsigned char *>(mapping->data());
    // Page-locked for CUDA when this process uses it, so its own copies between this buffer
    // and the GPU are DMA, not staged by the driver.
    const bool pinned = pinHostForCuda(mapping->data(), mapping->size());
    regions_.addHostBuffer(reply.value0, bytes, std::move(mapping), pinned);
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
    if (!regions_.findHostBuffer(addr, bytes, &parent, &offset)) {
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
    m.h = messageHeader(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kHost);
    m.parent = parent;
    m.offset = offset;
    m.bytes = bytes;
    m.address = addr;
    ipc::ReplyMsg reply{};
    Code c = control_.call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    regions_.addRange(reply.value0, ptr, bytes, parent);
    *out = reply.value0;
    return TL_OK;
}

tl_status Client::registerDmabuf(int fd, uint64_t offset, uint64_t bytes, tl_region *out) {
    if (fd < 0 || bytes == 0) {
        return fail(Code::kInvalid, "tl_register_dmabuf: a negative fd or zero bytes");
    }
    if (offset > UINT64_MAX - bytes) {
        return fail(Code::kInvalid, "tl_register_dmabuf: offset + bytes overflows");
    }
    ipc::RegisterMsg m{};
    m.h = messageHeader(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
    m.flags = ipc::kRegisterDmabufOnly | ipc::kRegisterDmabuf;
    m.offset = offset;
    m.bytes = bytes;
    m.device_ordinal = -1;  // the sidecar takes the size from the fd; no device is known
    ipc::ReplyMsg reply{};
    {
        std::lock_guard lock(cuda_mu_);
        m.parent = kVmmKeyBit | next_vmm_key_++;
        // SCM_RIGHTS gives the sidecar its own reference: the caller may close `fd` after this.
        if (Code c = control_.call(&m, sizeof(m), &reply, nullptr, nullptr,
                                   std::span<const int>(&fd, 1));
            c != Code::kOk) {
            return toStatus(c);
        }
    }
    regions_.addCuda(reply.value0, nullptr, bytes, m.parent);
    *out = reply.value0;
    return TL_OK;
}

tl_status Client::deregister(tl_region r) {
    if (!regions_.contains(r)) {
        return fail(Code::kNotFound, "tl_deregister: no region " + std::to_string(r));
    }
    ipc::DeregisterMsg m{messageHeader(ipc::MsgType::kDeregister), r};
    ipc::ReplyMsg reply{};
    Code c = control_.call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    {
        std::lock_guard lock(rings_.mutex());
        if (ClientStreams *streams = rings_.streams()) {
            streams->dropRegion(r);  // the sidecar released the streams waiting on it
        }
    }
    regions_.erase(r, [this](uint64_t cuda_key) {
        std::lock_guard cl(cuda_mu_);
        cuda_exports_.dropRegion(cuda_key);
    });
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
        m.h = messageHeader(ipc::MsgType::kExpose);
        m.region = r;
        ipc::copyName(m.name, sizeof(m.name), name);
        return toStatus(control_.call(&m, sizeof(m), &reply, nullptr));
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
    m.h = messageHeader(ipc::MsgType::kExposeAccess);
    m.region = r;
    ipc::copyName(m.name, sizeof(m.name), name);
    m.flags = access->flags;
    m.n_uids = access->n_uids;
    m.n_gids = access->n_gids;
    std::copy_n(access->uids, access->n_uids, m.uids);
    std::copy_n(access->gids, access->n_gids, m.gids);
    return toStatus(control_.call(&m, sizeof(m), &reply, nullptr));
}

tl_status Client::lookup(const char *peer, const char *name, tl_remote *out, uint64_t *bytes) {
    if (!peer || !*peer || std::strlen(peer) >= ipc::kPeerNameBytes || !name || !*name ||
        std::strlen(name) >= ipc::kRegionNameBytes || !out) {
        return fail(Code::kInvalid, "tl_lookup: peer and name are 1-63 bytes; out is required");
    }
    ipc::LookupMsg m{};
    m.h = messageHeader(ipc::MsgType::kLookup);
    ipc::copyName(m.peer, sizeof(m.peer), peer);
    ipc::copyName(m.name, sizeof(m.name), name);
    ipc::ReplyMsg reply{};
    Code c = control_.call(&m, sizeof(m), &reply, nullptr);
    if (c != Code::kOk) {
        return toStatus(c);
    }
    regions_.addRemote(reply.value0, reply.value1);
    *out = reply.value0;
    if (bytes) {
        *bytes = reply.value1;
    }
    return TL_OK;
}

tl_status Client::sidecarStatus(std::string *json) {
    // Page by page (ipc::StatusMsg): a sidecar with hundreds of peers has more than one
    // control message of status; one that does not page answers value1 = 0 (one page).
    json->clear();
    for (uint32_t page = 0;; ++page) {
        ipc::StatusMsg m{messageHeader(ipc::MsgType::kStatus), 0, page};
        ipc::ReplyMsg reply{};
        std::string part;
        if (Code c = control_.call(&m, sizeof(m), &reply, nullptr, &part); c != Code::kOk) {
            return toStatus(c);
        }
        json->append(part);
        if (part.empty() || json->size() >= reply.value1 || page >= kMaxStatusPages) {
            return TL_OK;
        }
    }
}

tl_status Client::write(const tl_write_desc *w, size_t n, tl_ticket *out, size_t *submitted) {
    if (!w || !out || n == 0) {
        return fail(Code::kInvalid, "tl_write: no writes or no ticket pointer");
    }
    // Wrong on its face fails here (DESIGN.md), and then none of the batch is submitted; the
    // sidecar checks everything again.
    size_t bad = 0;
    std::string why;
    if (!regions_.checkWrites(w, n, &bad, &why)) {
        return fail(Code::kInvalid,
                    n == 1 ? "tl_write: " + why
                           : "tl_write_batch: entry " + std::to_string(bad) + ": " + why);
    }
    std::vector<ipc::Request> reqs(n);
    for (size_t i = 0; i < n; ++i) {
        ipc::Request &r = reqs[i];
        r.op = static_cast<uint8_t>(ipc::Op::kWrite);
        r.imm = w[i].imm;
        r.src_region = w[i].src;
        r.src_offset = w[i].src_off;
        r.dst_remote = w[i].dst;
        r.dst_offset = w[i].dst_off;
        r.bytes = w[i].bytes;
    }
    return rings_.submit(reqs.data(), n, out, submitted);
}

tl_status Client::nop(size_t n, tl_ticket *out, size_t *submitted) {
    if (!out || n == 0) {
        return fail(Code::kInvalid, "tl_nop: no ticket pointer");
    }
    ipc::Request r{};
    r.op = static_cast<uint8_t>(ipc::Op::kNop);
    if (n == 1) {
        return rings_.submit(&r, 1, out, submitted);
    }
    std::vector<ipc::Request> reqs(n, r);
    return rings_.submit(reqs.data(), n, out, submitted);
}

}  // namespace tensorlane::shim
