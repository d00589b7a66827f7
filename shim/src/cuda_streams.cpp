#include "cuda_streams.hpp"

#include <atomic>
#include <mutex>

#include "cuda_context.hpp"

namespace tensorlane::shim {

namespace {

/// Segments a stream may still refer to after their client is gone: kept mapped (and
/// registered) for the life of the process. A few pages per client that used stream calls.
void keepForever(ipc::Mapping m) {
    static std::mutex mu;
    static auto *kept = new std::vector<ipc::Mapping>();
    std::lock_guard lock(mu);
    kept->push_back(std::move(m));
}

}  // namespace

#ifdef TENSORLANE_HAVE_CUDA

ipc::Code ClientStreams::open(ipc::UniqueFd fd, uint32_t ring_depth,
                              std::unique_ptr<ClientStreams> *out, std::string *why) {
    auto s = std::unique_ptr<ClientStreams>(new ClientStreams());
    const uint64_t size = fd ? ipc::segmentSize(fd.get()) : 0;
    if (size == 0 || ipc::mapSegment(fd.get(), size, &s->mapping_) != 0) {
        *why = "cannot map the stream segment the sidecar sent";
        return ipc::Code::kConnection;
    }
    if (!ipc::validateStreamSegment(s->mapping_.data(), s->mapping_.size(), ring_depth,
                                    &s->geometry_)) {
        *why = "the stream segment has a bad magic, version or geometry";
        return ipc::Code::kConnection;
    }
    s->view_ = ipc::StreamView::at(s->mapping_.data(), s->geometry_);
    const cuda::Driver &d = cuda::driver();
    AnyContextGuard ctx(d);
    if (!ctx.ok()) {
        *why = "the stream-ordered calls need CUDA in use in this process (no CUDA context)";
        return ipc::Code::kCuda;
    }
    // Portable: every context's streams may use it; device-mapped: they get an address for it.
    CUresult rc = d.cuMemHostRegister(s->mapping_.data(), s->mapping_.size(),
                                      CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP);
    if (rc != CUDA_SUCCESS) {
        *why = "cuMemHostRegister of the stream segment: " + d.errorText(rc);
        return ipc::Code::kCuda;
    }
    s->registered_ = true;
    CUdeviceptr dev = 0;
    rc = d.cuMemHostGetDevicePointer(&dev, s->mapping_.data(), 0);
    if (rc != CUDA_SUCCESS) {
        *why = "cuMemHostGetDevicePointer of the stream segment: " + d.errorText(rc);
        return ipc::Code::kCuda;
    }
    s->device_base_ = static_cast<uint64_t>(dev);
    for (uint32_t i = s->geometry_.ticket_slots; i-- > 0;) {
        s->free_.push_back(static_cast<uint16_t>(i));
    }
    *out = std::move(s);
    return ipc::Code::kOk;
}

ClientStreams::~ClientStreams() {
    if (!mapping_) {
        return;
    }
    releaseAll();
    if (used_) {
        keepForever(std::move(mapping_));
        return;
    }
    if (registered_) {
        const cuda::Driver &d = cuda::driver();
        AnyContextGuard ctx(d);
        if (ctx.ok()) {
            d.cuMemHostUnregister(mapping_.data());
        }
    }
}

#else

ipc::Code ClientStreams::open(ipc::UniqueFd, uint32_t, std::unique_ptr<ClientStreams> *,
                              std::string *why) {
    *why = "this libtensorlane was built without the CUDA toolkit";
    return ipc::Code::kCuda;
}

ClientStreams::~ClientStreams() {
    if (mapping_ && used_) {
        keepForever(std::move(mapping_));
    }
}

#endif

uint64_t ClientStreams::deviceAddress(const void *host) const {
    return device_base_ +
           static_cast<uint64_t>(static_cast<const unsigned char *>(host) -
                                 static_cast<const unsigned char *>(mapping_.data()));
}

uint64_t ClientStreams::gateAddress(uint16_t slot) const {
    return deviceAddress(&view_.tickets[slot].gate);
}

uint64_t ClientStreams::doneAddress(uint16_t slot) const {
    return deviceAddress(&view_.tickets[slot].done);
}

uint64_t ClientStreams::notifyAddress(uint32_t slot) const {
    return deviceAddress(&view_.notify[slot].flag);
}

bool ClientStreams::takeSlot(uint64_t ticket, bool gated, uint16_t *slot) {
    if (free_.empty()) {
        // Gated writes that ended before their stream reached the gate: free once it has.
        for (auto it = quarantine_.begin(); it != quarantine_.end();) {
            const uint32_t v = view_.tickets[it->slot].gate.load(std::memory_order_acquire);
            if (static_cast<int32_t>(v - it->gate) >= 0) {
                free_.push_back(it->slot);
                it = quarantine_.erase(it);
            } else {
                ++it;
            }
        }
        if (free_.empty()) {
            return false;
        }
    }
    const uint16_t s = free_.back();
    free_.pop_back();
    // Both words are quiet: the slot's last ticket ended (the sidecar wrote `done` before its
    // completion) and its gate was passed. ticket - 1 keeps every stream still waiting on the
    // old ticket released (cyclically >= it) and satisfies nothing of the new one. The sidecar
    // reads them only after it sees the request, which the ring publishes with release.
    const auto prev = static_cast<uint32_t>(ticket - 1);
    ipc::TicketSlot &t = view_.tickets[s];
    t.gate.store(prev, std::memory_order_relaxed);
    t.done.store(prev, std::memory_order_relaxed);
    pending_[ticket] = Pending{s, gated};
    *slot = s;
    return true;
}

void ClientStreams::untake(uint16_t slot, uint64_t ticket) {
    pending_.erase(ticket);
    free_.push_back(slot);
}

void ClientStreams::ticketEnded(uint64_t ticket) {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) {
        return;
    }
    const Pending p = it->second;
    pending_.erase(it);
    if (p.gated) {
        const auto want = static_cast<uint32_t>(ticket);
        const uint32_t v = view_.tickets[p.slot].gate.load(std::memory_order_acquire);
        if (static_cast<int32_t>(v - want) < 0) {
            // The write ended (refused, or its session failed) before the stream stored the
            // gate: that store is still to come and must not land on the slot's next ticket.
            quarantine_.push_back(Quarantined{p.slot, want});
            return;
        }
    }
    free_.push_back(p.slot);
}

bool ClientStreams::slotOf(uint64_t ticket, uint16_t *slot) const {
    auto it = pending_.find(ticket);
    if (it == pending_.end()) {
        return false;
    }
    *slot = it->second.slot;
    return true;
}

bool ClientStreams::subscription(uint64_t region, uint32_t imm, uint32_t *slot) const {
    auto it = subs_.find({region, imm});
    if (it == subs_.end()) {
        return false;
    }
    *slot = it->second;
    return true;
}

void ClientStreams::addSubscription(uint64_t region, uint32_t imm, uint32_t slot) {
    subs_[{region, imm}] = slot;
    sub_slots_.push_back(slot);
}

void ClientStreams::dropRegion(uint64_t region) {
    for (auto it = subs_.begin(); it != subs_.end();) {
        it = it->first.first == region ? subs_.erase(it) : std::next(it);
    }
}

void ClientStreams::releaseAll() {
    // SYNC POINT: release stores; a stream's wait polls the words through the driver.
    for (const auto &[ticket, p] : pending_) {
        // `done` only: a gate is the sidecar's to read, and opening one here could start a write
        // before its stream got there.
        view_.tickets[p.slot].done.store(static_cast<uint32_t>(ticket), std::memory_order_release);
    }
    rearm();
}

void ClientStreams::rearm() {
    for (uint32_t slot : sub_slots_) {
        std::atomic<uint32_t> &f = view_.notify[slot].flag;
        if (f.load(std::memory_order_acquire) == 0) {
            f.store(1, std::memory_order_release);
        }
    }
}

}  // namespace tensorlane::shim
