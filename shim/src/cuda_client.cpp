// The Client's CUDA calls: tl_register of device memory and the stream-ordered calls
// (DESIGN.md, "Stream-ordered calls"; docs/gpu.md).
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "client.hpp"
#include "cuda_context.hpp"
#include "tensorlane/ipc/doorbell.hpp"

namespace tensorlane::shim {

#ifdef TENSORLANE_HAVE_CUDA

tl_status Client::registerCuda(void *ptr, size_t bytes, tl_region *out) {
    CudaAllocation a;
    std::string why;
    switch (probeCudaPointer(ptr, &a, &why)) {
        case CudaPointer::kNotCuda:
            return fail(Code::kInvalid,
                        "tl_register: host memory must lie inside a buffer from tl_alloc_host");
        case CudaPointer::kRefused:
            return fail(Code::kCuda, why);
        case CudaPointer::kVmm:
            return registerVmm(ptr, bytes, a, out, false);
        case CudaPointer::kVmmHost:
            return registerVmm(ptr, bytes, a, out, true);
        case CudaPointer::kDevice:
            break;
    }
    const auto addr = reinterpret_cast<uint64_t>(ptr);
    const uint64_t offset = addr - a.base;
    if (addr < a.base || offset > a.bytes || bytes > a.bytes - offset) {
        return fail(Code::kInvalid,
                    "tl_register: [" + hexAddress(addr) + ", +" + std::to_string(bytes) +
                        ") runs past the end of its CUDA "
                        "allocation (" +
                        std::to_string(a.bytes) + " bytes at " + hexAddress(a.base) + ")");
    }
    ipc::RegisterMsg m{};
    m.h = messageHeader(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
    m.parent = a.buffer_id;
    m.offset = offset;
    m.bytes = bytes;
    m.address = addr;
    m.alloc_bytes = a.bytes;
    m.alloc_address = a.base;
    std::memcpy(m.device_uuid, a.uuid.data(), sizeof(m.device_uuid));
    m.device_ordinal = a.ordinal;
    ipc::ReplyMsg reply{};
    Code c = Code::kNotFound;
    {
        // One registration of CUDA memory at a time: two threads registering pieces of one new
        // allocation must not both export it.
        std::lock_guard lock(cuda_mu_);
        if (cuda_exports_.known(a.buffer_id)) {
            // A second tensor in an allocation already exported: no export, one round trip.
            m.flags = ipc::kRegisterReuse;
            c = control_.call(&m, sizeof(m), &reply, nullptr);
            if (c == Code::kNotFound) {
                cuda_exports_.forget(a.buffer_id);
            }
        }
        if (c == Code::kNotFound) {
            CudaExport ex;
            if (Code ec = exportCudaAllocation(a, &ex, &why); ec != Code::kOk) {
                return fail(ec, why);
            }
            std::memcpy(m.cuda_ipc_handle, ex.ipc_handle.data(), sizeof(m.cuda_ipc_handle));
            m.flags = ex.dmabuf ? static_cast<uint32_t>(ipc::kRegisterDmabuf) : 0u;
            m.dmabuf_error = ex.dmabuf_error;
            // The fd goes to the sidecar; ours closes when `ex` goes (the sidecar's copy keeps
            // the memory's dma-buf alive for as long as it needs it).
            const int fd = ex.dmabuf.get();
            c = control_.call(&m, sizeof(m), &reply, nullptr, nullptr,
                              fd >= 0 ? std::span<const int>(&fd, 1) : std::span<const int>());
        }
        if (c != Code::kOk) {
            return toStatus(c);
        }
        cuda_exports_.addRegion(a.buffer_id);
    }
    regions_.addCuda(reply.value0, ptr, bytes, a.buffer_id);
    *out = reply.value0;
    // This process uses CUDA: from now on its writes carry stream slots, so tl_stream_wait_ticket
    // works on any ticket. A failure here is not this call's (the stream calls report it).
    if (!streams_ready_.load(std::memory_order_acquire)) {
        const std::string saved = lastErrorText();
        (void)ensureStreams();
        setLastErrorText(saved);
    }
    return TL_OK;
}

tl_status Client::registerVmm(void *ptr, size_t bytes, const CudaAllocation &a, tl_region *out,
                              bool host) {
    const auto addr = reinterpret_cast<uint64_t>(ptr);
    VmmExport ex;
    std::string why;
    if (Code c = exportVmmRange(a, addr, bytes, &ex, &why); c != Code::kOk) {
        return fail(c, why);
    }
    if (host && ex.fds.empty()) {
        return fail(Code::kCuda,
                    "tl_register: this VMM host memory cannot be shared: " + ex.no_fd_reason);
    }
    ipc::RegisterMsg m{};
    m.h = messageHeader(ipc::MsgType::kRegister);
    m.kind = static_cast<uint32_t>(ipc::RegionKind::kCuda);
    m.offset = addr - ex.base;
    m.bytes = bytes;
    m.address = addr;
    m.alloc_bytes = ex.bytes;
    m.alloc_address = ex.base;
    std::memcpy(m.device_uuid, a.uuid.data(), sizeof(m.device_uuid));
    m.device_ordinal = a.ordinal;
    m.dmabuf_error = ex.dmabuf_error;
    m.flags = ex.dmabuf ? static_cast<uint32_t>(ipc::kRegisterDmabuf) : 0u;
    ipc::ReplyMsg reply{};
    {
        std::lock_guard lock(cuda_mu_);
        // Each VMM registration exports its pieces afresh (no reuse record): its key only
        // ties the staged pieces to the registration, and never meets a CUDA buffer id.
        m.parent = kVmmKeyBit | next_vmm_key_++;
        if (ex.fds.empty()) {
            // No shareable handle: the span's dma-buf alone (the verbs transport can reach it).
            m.flags |= ipc::kRegisterDmabufOnly;
        } else {
            m.flags |= ipc::kRegisterVmm | (host ? ipc::kRegisterVmmHost : 0u);
            for (size_t first = 0; first < ex.pieces.size();
                 first += ipc::kMaxVmmPiecesPerMessage) {
                ipc::VmmPiecesMsg pm{};
                pm.h = messageHeader(ipc::MsgType::kVmmPieces);
                pm.key = m.parent;
                pm.first = static_cast<uint32_t>(first);
                pm.count = static_cast<uint32_t>(
                    std::min<size_t>(ipc::kMaxVmmPiecesPerMessage, ex.pieces.size() - first));
                int fds[ipc::kMaxVmmPiecesPerMessage];
                for (uint32_t i = 0; i < pm.count; ++i) {
                    pm.pieces[i] = ex.pieces[first + i];
                    fds[i] = ex.fds[first + i].get();
                }
                if (Code c = control_.call(&pm, sizeof(pm), &reply, nullptr, nullptr,
                                           std::span<const int>(fds, pm.count));
                    c != Code::kOk) {
                    return toStatus(c);  // the sidecar dropped what it had staged
                }
            }
        }
        const int dmabuf = ex.dmabuf.get();
        if (Code c = control_.call(
                &m, sizeof(m), &reply, nullptr, nullptr,
                dmabuf >= 0 ? std::span<const int>(&dmabuf, 1) : std::span<const int>());
            c != Code::kOk) {
            return toStatus(c);
        }
    }
    // Our fds close with `ex`: the sidecar's copies (and its mapping) keep the memory.
    regions_.addCuda(reply.value0, ptr, bytes, m.parent);
    *out = reply.value0;
    if (!streams_ready_.load(std::memory_order_acquire)) {
        const std::string saved = lastErrorText();
        (void)ensureStreams();
        setLastErrorText(saved);
    }
    return TL_OK;
}

tl_status Client::ensureStreams() {
    if (streams_ready_.load(std::memory_order_acquire)) {
        return TL_OK;
    }
    std::lock_guard lock(cuda_mu_);
    if (streams_ready_.load(std::memory_order_relaxed)) {
        return TL_OK;
    }
    if (!cudaInUse()) {
        return fail(Code::kCuda, "the stream-ordered calls need CUDA in use in this process");
    }
    ipc::MsgHeader m = messageHeader(ipc::MsgType::kStreamSetup);
    ipc::ReplyMsg reply{};
    ipc::UniqueFd fd;
    if (Code c = control_.call(&m, sizeof(m), &reply, &fd); c != Code::kOk) {
        return toStatus(c);
    }
    std::unique_ptr<ClientStreams> streams;
    std::string why;
    if (Code c = ClientStreams::open(std::move(fd), rings_.depth(), &streams, &why);
        c != Code::kOk) {
        return fail(c, why);
    }
    if (int rc = ipc::makeEventFd(&keeper_stop_)) {
        return fail(Code::kInternal, std::string("eventfd: ") + std::strerror(rc));
    }
    rings_.setStreams(std::move(streams));
    keeper_ = std::thread([this] { keepStreams(); });
    streams_ready_.store(true, std::memory_order_release);
    return TL_OK;
}

void Client::keepStreams() {
    // Sleeps until the sidecar hangs up or we stop. A sidecar that dies cannot release the
    // streams waiting on it, so this thread does: every pending ticket's `done`, and every
    // notification flag (again each time a stream consumes it) until tl_disconnect.
    pollfd p[2] = {{control_.fd(), POLLRDHUP, 0}, {keeper_stop_.get(), POLLIN, 0}};
    bool gone = false;
    for (;;) {
        const int n = ::poll(p, 2, gone ? 1 : -1);
        if (n > 0 && (p[1].revents & POLLIN) != 0) {
            return;
        }
        if (!gone && (p[0].revents & (POLLHUP | POLLRDHUP | POLLERR)) != 0) {
            gone = true;
            p[0].fd = -1;  // it stays readable; from here we only re-arm
            std::lock_guard lock(rings_.mutex());
            control_.markDead("the sidecar went away");
            rings_.failPendingLocked(static_cast<int32_t>(Code::kConnection));
            rings_.streams()->releaseAll();
            waiter_.wakeAllLocked();
            continue;
        }
        if (gone) {
            std::lock_guard lock(rings_.mutex());
            rings_.streams()->rearm();
        }
    }
}

tl_status Client::writeOnStream(const tl_write_desc &w, void *stream, tl_ticket *out) {
    if (!out) {
        return fail(Code::kInvalid, "tl_write_on_stream: out is NULL");
    }
    size_t bad = 0;
    std::string why;
    if (!regions_.checkWrites(&w, 1, &bad, &why)) {
        return fail(Code::kInvalid, "tl_write_on_stream: " + why);
    }
    ipc::Request r{};
    r.op = static_cast<uint8_t>(ipc::Op::kWrite);
    r.flags = ipc::kRequestHasSlot | ipc::kRequestGated;
    r.imm = w.imm;
    r.src_region = w.src;
    r.src_offset = w.src_off;
    r.dst_remote = w.dst;
    r.dst_offset = w.dst_off;
    r.bytes = w.bytes;
    if (tl_status st = ensureStreams(); st != TL_OK) {
        return st;
    }
    const cuda::Driver &d = cuda::driver();
    auto s = static_cast<CUstream>(stream);
    CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d.cuStreamIsCapturing(s, &capture) == CUDA_SUCCESS &&
        capture != CU_STREAM_CAPTURE_STATUS_NONE) {
        return fail(Code::kInvalid,
                    "tl_write_on_stream: the stream is being captured into a CUDA graph; the "
                    "write is submitted by this call, so a replay would not submit it again "
                    "(capture tl_stream_wait_notification / tl_stream_wait_ticket instead)");
    }
    CUcontext ctx = nullptr;
    (void)d.cuStreamGetCtx(s, &ctx);  // the legacy stream (0) answers with the current one

    // The stream stores the ticket into the gate once the work queued before has finished
    // (the store fences that work, like __threadfence_system); the sidecar starts the write
    // when it sees it. Queued first, published second (Rings::submit): a failure leaves
    // nothing behind.
    class Gate final : public StreamGate {
    public:
        Gate(const cuda::Driver &d, CUstream s, CUcontext ctx) : d_(d), s_(s), ctx_(ctx) {}
        tl_status enqueue(uint64_t gate_address, uint32_t ticket) override {
            CUresult rc;
            {
                cuda::ContextGuard g(d_, ctx_);
                rc = d_.cuStreamWriteValue32(s_, static_cast<CUdeviceptr>(gate_address),
                                             static_cast<cuuint32_t>(ticket),
                                             CU_STREAM_WRITE_VALUE_DEFAULT);
            }
            if (rc != CUDA_SUCCESS) {
                return fail(Code::kCuda,
                            "tl_write_on_stream: cuStreamWriteValue32: " + d_.errorText(rc));
            }
            return TL_OK;
        }

    private:
        const cuda::Driver &d_;
        CUstream s_;
        CUcontext ctx_;
    };
    Gate gate(d, s, ctx);
    return rings_.submit(&r, 1, out, nullptr, &gate);
}

tl_status Client::streamWaitTicket(tl_ticket t, void *stream) {
    if (tl_status st = ensureStreams(); st != TL_OK) {
        return st;
    }
    const cuda::Driver &d = cuda::driver();
    auto s = static_cast<CUstream>(stream);
    CUcontext ctx = nullptr;
    (void)d.cuStreamGetCtx(s, &ctx);
    std::lock_guard lock(rings_.mutex());
    int32_t st = rings_.tickets().state(t);
    if (st == TicketTable::kPending) {
        rings_.drainLocked();
        st = rings_.tickets().state(t);
    }
    if (st == TicketTable::kUnknown) {
        return fail(Code::kNotFound, "tl_stream_wait_ticket: unknown ticket " + std::to_string(t) +
                                         " (never issued, or already waited for)");
    }
    if (st != TicketTable::kPending) {
        return TL_OK;  // it has ended: nothing for the stream to wait for (tl_wait has its status)
    }
    ClientStreams &streams = *rings_.streams();
    uint16_t slot = 0;
    if (!streams.slotOf(t, &slot)) {
        return fail(Code::kInvalid,
                    "tl_stream_wait_ticket: ticket " + std::to_string(t) +
                        " was submitted before this client's first CUDA registration or stream "
                        "call, so it has no stream slot; wait for it with tl_wait");
    }
    CUresult rc;
    {
        cuda::ContextGuard g(d, ctx);
        rc = d.cuStreamWaitValue32(s, static_cast<CUdeviceptr>(streams.doneAddress(slot)),
                                   static_cast<cuuint32_t>(t), CU_STREAM_WAIT_VALUE_GEQ);
    }
    if (rc != CUDA_SUCCESS) {
        return fail(Code::kCuda, "tl_stream_wait_ticket: cuStreamWaitValue32: " + d.errorText(rc));
    }
    streams.noteEnqueued();
    return TL_OK;
}

tl_status Client::streamWaitNotification(tl_region r, uint32_t imm, void *stream) {
    if (!regions_.contains(r)) {
        return fail(Code::kNotFound, "tl_stream_wait_notification: no region " + std::to_string(r));
    }
    if (tl_status st = ensureStreams(); st != TL_OK) {
        return st;
    }
    uint32_t slot = 0;
    bool known = false;
    {
        std::lock_guard lock(rings_.mutex());
        known = rings_.streams()->subscription(r, imm, &slot);
    }
    if (!known) {
        std::lock_guard sub(cuda_mu_);  // one subscription at a time
        {
            std::lock_guard lock(rings_.mutex());
            known = rings_.streams()->subscription(r, imm, &slot);
        }
        if (!known) {
            ipc::StreamSubscribeMsg m{};
            m.h = messageHeader(ipc::MsgType::kStreamSubscribe);
            m.region = r;
            m.imm = imm;
            ipc::ReplyMsg reply{};
            if (Code c = control_.call(&m, sizeof(m), &reply, nullptr); c != Code::kOk) {
                return toStatus(c);
            }
            slot = static_cast<uint32_t>(reply.value0);
            if (slot >= ipc::kStreamSubscriptions) {
                return fail(Code::kInternal, "the sidecar gave a bad subscription slot");
            }
            // Notifications for the pair that came before the sidecar began counting are in
            // our queue or the ring (the sidecar published them before it answered): they are
            // the stream's now, handed back for its flag.
            uint32_t earlier = 0;
            {
                std::lock_guard lock(rings_.mutex());
                rings_.drainLocked(true);
                std::deque<tl_message> &notes = rings_.notes();
                for (auto it = notes.begin(); it != notes.end();) {
                    if (it->ex.n.region == r && it->ex.n.imm == imm) {
                        it = notes.erase(it);
                        ++earlier;
                    } else {
                        ++it;
                    }
                }
                rings_.streams()->addSubscription(r, imm, slot);
            }
            if (earlier != 0) {
                ipc::StreamCreditMsg cm{};
                cm.h = messageHeader(ipc::MsgType::kStreamCredit);
                cm.slot = slot;
                cm.count = earlier;
                if (Code c = control_.call(&cm, sizeof(cm), &reply, nullptr); c != Code::kOk) {
                    return toStatus(c);
                }
            }
        }
    }
    const cuda::Driver &d = cuda::driver();
    auto s = static_cast<CUstream>(stream);
    CUcontext ctx = nullptr;
    (void)d.cuStreamGetCtx(s, &ctx);
    const auto flag = static_cast<CUdeviceptr>(rings_.streams()->notifyAddress(slot));
    CUresult rc;
    {
        // Wait for a hand-over (1), then consume it (0): fixed values, so a CUDA graph that
        // captured the pair waits for one more notification on every replay.
        cuda::ContextGuard g(d, ctx);
        rc = d.cuStreamWaitValue32(s, flag, 1, CU_STREAM_WAIT_VALUE_EQ);
        if (rc == CUDA_SUCCESS) {
            rc = d.cuStreamWriteValue32(s, flag, 0, CU_STREAM_WRITE_VALUE_DEFAULT);
        }
    }
    if (rc != CUDA_SUCCESS) {
        return fail(Code::kCuda,
                    "tl_stream_wait_notification: stream memory operation: " + d.errorText(rc));
    }
    std::lock_guard lock(rings_.mutex());
    rings_.streams()->noteEnqueued();
    return TL_OK;
}

#else  // built without the CUDA toolkit

tl_status Client::registerCuda(void *, size_t, tl_region *) {
    return fail(Code::kCuda, "this libtensorlane was built without the CUDA toolkit");
}
tl_status Client::registerVmm(void *, size_t, const CudaAllocation &, tl_region *) {
    return fail(Code::kCuda, "this libtensorlane was built without the CUDA toolkit");
}
tl_status Client::ensureStreams() {
    return fail(Code::kCuda, "this libtensorlane was built without the CUDA toolkit");
}
void Client::keepStreams() {}
tl_status Client::writeOnStream(const tl_write_desc &, void *, tl_ticket *) {
    return ensureStreams();
}
tl_status Client::streamWaitTicket(tl_ticket, void *) {
    return ensureStreams();
}
tl_status Client::streamWaitNotification(tl_region, uint32_t, void *) {
    return ensureStreams();
}

#endif

}  // namespace tensorlane::shim
